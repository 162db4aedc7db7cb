"""A worker's job runner: one YuE2 checkpoint in memory, jobs through the decoder.

Jobs the continuous-batching engine decodes (`continuous_ok`: greedy `auto`/`ar`/`hybrid`, as
`DecodingParams.engine_ok` decides) go through it (`engine`, fed by `workers.engine_loop`).
Everything else (sampling, `hybrid_fast`, `nar`, `prompt_lookup`, a job whose step failed with the
rest of its rows) goes through `run`: jobs with equal decoding parameters share `generate` calls
(length-sorted, to cut padding); if a call raises, its jobs are split in halves and retried, so
only the job that breaks decoding fails and its batch-mates succeed.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

from workers.job_io import JobInput, JobOutput
from workers.long_input import MAX_REDUCE_LEVELS, InputTooLongError, count_tokens, windows
from yue2_jobs.core.config import Settings
from yue2_jobs.decode.continuous import ContinuousBatcher
from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.requests import DecodeRequest, DecodeResult
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.errors import JobExecutionError
from yue2_jobs.jobs.params import TEXT_FIELD
from yue2_jobs.model.checkpoint import directory_version

log = logging.getLogger(__name__)


class ModelRunner:
    """One checkpoint of `variant` (`directory`, default the configured seed directory) in a
    `DecodeSession`; `run` returns one output or exception per job, in order. A hot swap builds a
    new runner (a new session: nothing carries over but the settings)."""

    def __init__(self, *, variant: str, settings: Settings, directory: Path | None = None) -> None:
        directory = Path(directory or settings.checkpoints[variant])
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        # Every file hashed once, against the manifest, then moved to the configured device and dtype.
        self.session = DecodeSession.load(directory, device=settings.device, dtype=settings.dtype)
        assert self.session.tokenizer is not None
        self.tokenizer = self.session.tokenizer
        self.variant, self.settings, self.directory = variant, settings, directory
        self.checkpoint: str = f"{variant}@{directory_version(directory)}"
        self.weights_sha256: str | None = self.session.weights_sha256
        self.max_batch = settings.batch_max_jobs
        self.max_input_tokens = self.session.max_input_tokens
        self._full_tokens: dict[str, int] = {}  # engine jobs' whole input length, until their output
        self.engine: ContinuousBatcher[str] | None = None
        if settings.batching == "continuous":
            self.engine = self.session.engine(max_rows=settings.engine_max_rows, max_tokens=settings.engine_max_tokens)
        self.graph_count, self.graph_capture_s = 0, 0.0
        if self.session.device.type == "cuda" and settings.cuda_graphs:  # at start, so no job waits for a capture
            captured = self.session.capture_graphs(max_rows=settings.engine_max_rows)
            self.graph_count = sum(g.count for g in captured)
            self.graph_capture_s = sum(g.capture_s for g in captured)
        self.compile_s: float | None = None  # seconds the compiled CPU step took to build or load; None: eager
        if self.session.device.type == "cpu" and settings.compile:  # at start, as the graphs are
            start = time.perf_counter()
            if self.session.compile_steps() is not None:
                self.compile_s = time.perf_counter() - start

    def continuous_ok(self, job: JobInput) -> bool:
        """Whether this job goes to the engine: this worker runs one, the job's decoding parameters
        are ones it decodes (`DecodingParams.engine_ok` is the one rule for that) and its input is
        one window (a chunked job is several `generate` passes); the rest go through `run`."""
        return self.engine is not None and job.decoding_params.engine_ok and job.long_input != "chunk"

    def _check_length(self, job: JobInput, n: int) -> None:
        """Raises InputTooLongError when the job's `n` input tokens are too many and it says long_input=reject."""
        if n > self.max_input_tokens and job.long_input == "reject":
            raise InputTooLongError(field=TEXT_FIELD.get(job.kind, "input"), tokens=n, limit=self.max_input_tokens,
                                    checkpoint=self.checkpoint)

    def encode(self, job: JobInput) -> tuple[int, list[int]]:
        """(the whole input's token count, the ids the encoder reads): one tokenization when the
        input fits; a longer one is cut as the tokenizer cuts, `<s> … </s>` kept."""
        ids = self.tokenizer(job.text, verbose=False)["input_ids"]
        if len(ids) <= self.max_input_tokens:
            return len(ids), ids
        return len(ids), self.tokenizer(job.text, truncation=True, max_length=self.max_input_tokens)["input_ids"]

    def requests_for(self, jobs: list[JobInput]) -> tuple[list[DecodeRequest[str]], dict[str, Exception]]:
        """Engine requests for `jobs` (keyed by job id); a job whose input cannot be tokenized fails alone."""
        requests: list[DecodeRequest[str]] = []
        failed: dict[str, Exception] = {}
        for job in jobs:
            try:
                n, ids = self.encode(job)
                self._check_length(job, n)
                self._full_tokens[job.id] = n
                requests.append(DecodeRequest(key=job.id, input_ids=ids, params=job.decoding_params))
            except InputTooLongError as exc:
                failed[job.id] = exc
            except Exception as exc:
                log.exception("job %s failed before decoding", job.id)
                failed[job.id] = JobExecutionError(f"decoding failed: {type(exc).__name__}: {exc}")
        return requests, failed

    def output_of(self, res: DecodeResult[str]) -> JobOutput | Exception:
        """An engine result as the job's output (or its failure)."""
        if res.error is not None:
            return JobExecutionError(f"decoding failed: {type(res.error).__name__}: {res.error}")
        assert res.stats is not None
        text = str(self.tokenizer.decode(res.tokens, skip_special_tokens=True)).strip()
        used = len(res.request.input_ids)
        full = self._full_tokens.pop(res.request.key, used)
        return JobOutput(text=text, input_tokens=full, output_tokens=res.stats.tokens,
                         decoder_steps=res.stats.decoder_steps, nar_tokens=res.stats.nar_tokens,
                         mode=res.mode, input_tokens_used=used, input_truncated=full > used)

    def run(self, jobs: list[JobInput]) -> list[JobOutput | Exception]:
        results: dict[str, JobOutput | Exception] = {}
        groups: dict[tuple[DecodingParams, str], list[JobInput]] = defaultdict(list)
        for job in jobs:
            self._full_tokens.pop(job.id, None)  # a rerun after a failed engine step counts afresh
            if job.long_input in ("reject", "chunk"):  # `generate` counts the rest's tokens
                n = count_tokens(self.tokenizer, job.text)
                try:
                    self._check_length(job, n)
                except InputTooLongError as exc:
                    results[job.id] = exc
                    continue
                if n > self.max_input_tokens and job.long_input == "chunk":
                    self._run_isolating([job], results, chunked=True)
                    continue
            groups[job.decoding_params, job.long_input].append(job)
        for group in groups.values():
            group.sort(key=lambda j: len(j.text))
            for start in range(0, len(group), self.max_batch):
                self._run_isolating(group[start:start + self.max_batch], results)
        return [results[j.id] for j in jobs]

    def _run_isolating(self, jobs: list[JobInput], results: dict[str, JobOutput | Exception], *,
                       chunked: bool = False) -> None:
        try:
            for job, out in zip(jobs, [self.chunked(jobs[0])] if chunked else self.generate(jobs), strict=True):
                results[job.id] = out
        except Exception as exc:  # a decoding failure of any kind: find the job that causes it
            if len(jobs) == 1:
                log.exception("job %s failed", jobs[0].id)
                results[jobs[0].id] = JobExecutionError(f"decoding failed: {type(exc).__name__}: {exc}")
                return
            mid = len(jobs) // 2
            self._run_isolating(jobs[:mid], results)
            self._run_isolating(jobs[mid:], results)

    @torch.inference_mode()
    def generate(self, jobs: list[JobInput]) -> list[JobOutput]:
        """One `generate` call for jobs that share their decoding parameters."""
        full = [len(ids) for ids in self.tokenizer([j.text for j in jobs], verbose=False)["input_ids"]]
        enc = self.tokenizer([j.text for j in jobs], truncation=True, max_length=self.max_input_tokens,
                             padding=True, return_tensors="pt")
        res = self.session.generate(enc["input_ids"], enc["attention_mask"], jobs[0].decoding_params)
        texts = self.tokenizer.batch_decode(res.sequences, skip_special_tokens=True)
        used = enc["attention_mask"].sum(dim=1).tolist()
        return [JobOutput(text=t.strip(), input_tokens=n, output_tokens=st.tokens, decoder_steps=st.decoder_steps,
                          nar_tokens=st.nar_tokens, mode=res.mode, input_tokens_used=int(u), input_truncated=n > u)
                for t, n, u, st in zip(texts, full, used, res.stats, strict=True)]

    def chunked(self, job: JobInput) -> JobOutput:
        """long_input=chunk on an input longer than the checkpoint reads: summarise each window,
        then the joined partial summaries (split again while they do not fit), as one job."""
        level = windows(self.tokenizer, job.text, self.max_input_tokens)
        chunks, steps, nar, cut = len(level), 0, 0, False
        for depth in range(MAX_REDUCE_LEVELS + 1):
            if depth == MAX_REDUCE_LEVELS and len(level) > 1:  # never reached on real text; bounded anyway
                level, cut = level[:1], True
            parts = [replace(job, text=w) for w in level]
            outs = [o for i in range(0, len(parts), self.max_batch)
                    for o in self.generate(parts[i : i + self.max_batch])]
            steps += sum(o.decoder_steps for o in outs)
            nar += sum(o.nar_tokens for o in outs)
            if len(level) == 1:
                break
            level = windows(self.tokenizer, " ".join(o.text for o in outs), self.max_input_tokens) or [""]
        return replace(outs[0], input_tokens=count_tokens(self.tokenizer, job.text), input_tokens_used=None,
                       input_truncated=cut, decoder_steps=steps, nar_tokens=nar, chunks=chunks)
