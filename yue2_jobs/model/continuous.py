"""Continuous batching: in-flight sequences share decoder steps, and a finished row's slot is
refilled from the waiting queue at the next step instead of idling until the batch's longest
row is done (Orca-style iteration-level scheduling).

`ContinuousBatcher` owns a working set of rows (slots). Each `step()`:

1. admits waiting requests into free slots (encoder pass for the newcomers only; their
   cross-attention K/V are written into the slot, the self-attention cache needs no reset
   because a query never sees a position past its own), within `max_rows` rows and
   `max_tokens` reserved tokens (each request reserves its own input length plus its own
   `max_new_tokens`: admission is length-aware, and in FIFO order so nothing starves);
2. runs the engine step (`engine.py`, the step `generate` runs) over every live row: `hybrid`
   rows verify NAR drafts, `ar` rows feed one token, in one step;
3. returns the requests that finished.

Greedy decoding only, with the checkpoint's repetition controls (sampled jobs, jobs that set their
own controls and the other modes keep the static path). Out of memory
on a step preempts the newest half of the rows back to the queue and retries with a lower row
cap, so no job fails for its neighbours; a lone row that still does not fit fails alone. Any
other exception in a step hands the live rows back marked `isolate`, for the caller to rerun
one at a time.

`policy="static"` admits only into an empty working set: static micro-batching with the same
kernels, the baseline `make bench` compares against.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Literal

import torch

from yue2_jobs.model.auto_mode import ModeChooser, chooser_for
from yue2_jobs.model.continuous_rows import (
    RECOVER_EVERY,
    DecodeRequest,
    DecodeResult,
    EngineCounters,
    WorkingSet,
    is_out_of_memory,
)
from yue2_jobs.model.decoding import AUTO, ENGINE_MODES
from yue2_jobs.model.engine import NEVER_TRUST, StepShape
from yue2_jobs.model.graphs import run_step
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration
from yue2_jobs.model.sampling import SamplingParams, repetition_defaults
from yue2_jobs.model.stats import SequenceStats


class ContinuousBatcher(WorkingSet):
    """Iteration-level scheduler and decode loop over one model (see the module docstring)."""

    def __init__(self, model: Yue2ForConditionalGeneration, *, max_rows: int = 32, max_tokens: int | None = None,
                 policy: Literal["continuous", "static"] = "continuous", chooser: ModeChooser | None = None) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if policy not in ("continuous", "static"):
            raise ValueError(f"policy must be 'continuous' or 'static', got {policy!r}")
        cfg = model.config
        self.model, self.policy, self.max_rows = model, policy, max_rows
        self.chooser = chooser or chooser_for(model)
        self._timing: tuple[str, int, float, torch.Tensor] | None = None  # (mode, rows, start, tokens) of a step
        self.limit = cfg.max_position_embeddings - 1  # most new tokens a row may ask for
        self.max_tokens = max_tokens if max_tokens is not None else max_rows * (cfg.max_position_embeddings * 2)
        self.k = cfg.nar_block_size
        # Every row decodes greedily with the checkpoint's repetition controls; a job that sets its
        # own goes through `generate` (the runner's `continuous_ok`).
        self.params = SamplingParams(**repetition_defaults(model.generation_config))
        self.t_buf = 1 + self.limit + 2 * self.k + 2
        self.t_cache = 1 + self.limit + self.k + 1
        self.device = model.shared.weight.device
        self.waiting: deque[DecodeRequest] = deque()
        self.rejected: list[DecodeResult] = []
        self.rows: list[DecodeRequest | None] = []
        self.row_cap = max_rows
        self.clean_steps = 0
        self.counters = EngineCounters()
        self._seq = itertools.count()
        self._clear()

    # ---- public -------------------------------------------------------------------------------

    def submit(self, requests: list[DecodeRequest]) -> None:
        """Queue requests; an invalid one comes back failed from the next `step`, alone."""
        for req in requests:
            problem = self._check(req)
            if problem:
                self.rejected.append(DecodeResult(request=req, error=ValueError(problem)))
            else:
                self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.rejected or self.live)

    @torch.inference_mode()
    def step(self) -> list[DecodeResult]:
        """Admit, decode one step, return what finished (possibly nothing)."""
        done, self.rejected = self.rejected, []
        done += self._admit()
        if not self.live:
            return done
        while True:
            try:
                self._decode_step()
                break
            except Exception as exc:
                if not is_out_of_memory(exc):
                    done += self._evict_all(exc)
                    return done
                done += self._shed(exc)
                if not self.live:
                    return done
        self.clean_steps += 1
        if self.clean_steps % RECOVER_EVERY == 0 and self.row_cap < self.max_rows:
            self.row_cap += 1
        done += self._collect()
        return done

    def abandon(self) -> list[DecodeRequest]:
        """Drop every waiting and live request (their caller gave up on them); returns them."""
        dropped = [*self.waiting, *(r.request for r in self.rejected), *(r for r in self.rows if r is not None)]
        self.waiting.clear()
        self.rejected = []
        self._clear()
        return dropped

    def run(self, requests: list[DecodeRequest]) -> list[DecodeResult]:
        """Decode `requests` to the end; results in request order."""
        self.submit(requests)
        by_id: dict[int, DecodeResult] = {}
        while self.has_work():
            for res in self.step():
                by_id[id(res.request)] = res
        return [by_id[id(r)] for r in requests]

    # ---- admission ----------------------------------------------------------------------------

    def _check(self, req: DecodeRequest) -> str | None:
        n_pos = self.model.config.max_position_embeddings
        if req.mode not in ENGINE_MODES:
            return f"mode must be one of {ENGINE_MODES} for continuous batching, got {req.mode!r}"
        if not 1 <= req.max_new_tokens <= self.limit:
            return f"max_new_tokens must be between 1 and {self.limit}, got {req.max_new_tokens}"
        if not 0 <= req.min_new_tokens <= req.max_new_tokens:
            return (f"min_new_tokens must be between 0 and max_new_tokens ({req.max_new_tokens}), "
                    f"got {req.min_new_tokens}")
        if not 1 <= len(req.input_ids) <= n_pos:
            return f"input must have 1 to {n_pos} tokens, got {len(req.input_ids)}"
        return None

    @staticmethod
    def _reserve(req: DecodeRequest) -> int:
        return len(req.input_ids) + 1 + req.max_new_tokens

    def _admit(self) -> list[DecodeResult]:
        if not self.waiting or (self.policy == "static" and self.live):
            return []
        free = [i for i, r in enumerate(self.rows) if r is None]
        room = len(free) + max(0, min(self.max_rows, self.row_cap) - len(self.rows))
        budget = self.max_tokens - sum(self._reserve(r) for r in self.rows if r is not None)
        take: list[DecodeRequest] = []
        while self.waiting and len(take) < room:
            need = self._reserve(self.waiting[0])
            if need > budget and (take or self.live):
                break  # FIFO: the head waits for room rather than being overtaken
            take.append(self.waiting.popleft())
            budget -= need
        while take:
            try:
                self._place(take, free)
                return []
            except Exception as exc:
                if not is_out_of_memory(exc) and len(take) == 1:
                    return [DecodeResult(request=take[0], error=exc)]
                if len(take) == 1:  # does not fit even alone, next to the live rows
                    if self.live:
                        self.waiting.appendleft(take[0])
                        return []
                    return [DecodeResult(request=take[0], error=exc)]
                half = len(take) // 2  # find the bad input, or admit what fits
                self.waiting.extendleft(reversed(take[half:]))
                take = take[:half]
        return []

    def _place(self, take: list[DecodeRequest], free: list[int]) -> None:
        """Encode `take` and write it into free slots, growing the working set as needed."""
        pad = self.model.config.pad_token_id
        auto = self.chooser.choose(self.live + len(take))  # one pick for the newcomers: a set of one width
        for r in take:
            r.ran = auto if r.mode == AUTO else r.mode
        s_new = max(len(r.input_ids) for r in take)
        ids = torch.full((len(take), s_new), pad, dtype=torch.long, device=self.device)  # (N, S)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        for i, r in enumerate(take):
            ids[i, : len(r.input_ids)] = torch.tensor(r.input_ids, dtype=torch.long)
            mask[i, : len(r.input_ids)] = True
        enc = self.model.encode(ids, mask)
        new_mask = torch.zeros(mask.shape, dtype=enc.hidden.dtype, device=self.device)
        new_mask = new_mask.masked_fill(~mask, float("-inf"))[:, None, None, :]  # (N, 1, 1, S)
        s_cur = self.enc_mask.shape[-1]
        if s_new > s_cur:
            self._pad_source(s_new)
        kvs = [*enc.cross_kv, *enc.nar_cross_kv]
        if s_new < self.enc_mask.shape[-1]:
            extra = self.enc_mask.shape[-1] - s_new
            new_mask = torch.nn.functional.pad(new_mask, (0, extra), value=float("-inf"))
            kvs = [(torch.nn.functional.pad(k, (0, 0, 0, extra)), torch.nn.functional.pad(v, (0, 0, 0, extra)))
                   for k, v in kvs]
        slots = free[: len(take)]
        grow = len(take) - len(slots)
        if grow:
            slots += list(range(len(self.rows), len(self.rows) + grow))
            self._grow(grow)
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        self.enc_mask[idx] = new_mask
        for (k_all, v_all), (k, v) in zip(self.kv, kvs, strict=True):
            k_all[idx], v_all[idx] = k, v
        self.st.start(idx, start_token=self.model.config.decoder_start_token_id, pad=pad,
                      total=torch.tensor([1 + r.max_new_tokens for r in take], device=self.device),
                      min_total=torch.tensor([1 + r.min_new_tokens for r in take], device=self.device),
                      draft_on=torch.tensor([r.ran == "hybrid" for r in take], device=self.device),
                      accept_p=torch.tensor([r.min_accept_prob for r in take], device=self.device),
                      trust_p=NEVER_TRUST)
        for slot in slots:
            self.seq[slot] = next(self._seq)
        for slot, r in zip(slots, take, strict=True):
            self.rows[slot] = r

    # ---- the decoder step ------------------------------------------------------------------------

    def _decode_step(self) -> None:
        """One engine step over every row (idle slots are finished rows: they commit nothing).
        The step writes state only once nothing can fail, which `_shed` relies on."""
        modes = {r.ran for r in self.rows if r is not None}
        drafting = "hybrid" in modes
        timed = len(modes) == 1  # only steps of one mode tell `auto` what that mode costs
        before = self.st.nar.sum() + self.st.ar.sum() if timed else None
        start = time.perf_counter()
        shape = StepShape.of(k=self.k, drafts="nar" if drafting else "none", params=self.params,
                             ban_eos=any(r is not None and r.min_new_tokens > 0 for r in self.rows))
        run_step(self.model, self.st, self._encoder_state(), self.caches, layout=self.model.step_layout(),
                 shape=shape, span=min(self.t_cache, self.reach + shape.width))
        self.reach += shape.width
        if before is not None:  # the step's token count is read with the finished flags, in `_collect`
            self._timing = (modes.pop(), self.live, start, self.st.nar.sum() + self.st.ar.sum() - before)
        c = self.counters
        live = self.live
        c.steps += 1
        c.live_rows += live
        c.slot_rows += len(self.rows)
        c.occupancy.append(live)

    def _collect(self) -> list[DecodeResult]:
        """Hand back finished rows and free their slots; compact when refilling cannot use them."""
        st = self.st
        if not self.rows:
            return []
        # The host read: every row's finished flag and the caches' reach, in one transfer.
        timing, self._timing = self._timing, None
        extra = [st.cached.max(0, keepdim=True).values] + ([timing[3][None]] if timing else [])
        values = torch.cat([st.finished.long(), *extra]).tolist()
        n = len(self.rows)
        fin, self.reach = values[:n], values[n]
        if timing:  # what the step cost feeds `auto`'s choice (steps of one mode only)
            self.chooser.observe(timing[0], timing[1], tokens=values[n + 1], seconds=time.perf_counter() - timing[2])
        ended = [i for i, (r, f) in enumerate(zip(self.rows, fin, strict=True)) if f and r is not None]
        results: list[DecodeResult] = []
        if ended:
            idx = torch.tensor(ended, dtype=torch.long, device=self.device)
            lens = st.committed[idx].tolist()
            rows = st.buf[idx].tolist()
            stats = torch.stack([st.steps[idx], st.nar[idx], st.ar[idx], st.drafted[idx]], 1).tolist()
            c = self.counters
            for i, n, toks, (steps, nar, ar_, drafted) in zip(ended, lens, rows, stats, strict=True):
                req = self.rows[i]
                assert req is not None
                self.rows[i] = None
                c.tokens += nar + ar_
                c.nar_tokens += nar
                c.drafted += drafted
                results.append(DecodeResult(request=req, tokens=toks[1:n],
                                            stats=SequenceStats(decoder_steps=steps, nar_tokens=nar, ar_tokens=ar_)))
        idle = len(self.rows) - self.live
        refill = self.waiting and (self.policy == "continuous" or not self.live)
        if idle and (not self.live or (not refill and 4 * idle >= len(self.rows))):
            self._keep([i for i, r in enumerate(self.rows) if r is not None])
        return results
