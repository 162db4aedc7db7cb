"""Reading a slice's inputs and recording its results, through outages of Postgres and storage.

A job fails only for something about the job itself (its input cannot be decoded, its decoding
raises, storage refuses it permanently). An outage never fails a job: reads, uploads and the
final UPDATE are retried with backoff for up to `outage_retry_s`. Recording is idempotent under
the claim token (a retried UPDATE takes only where the claim is still ours; output keys are
deterministic), so redoing it is safe. Past that deadline the jobs are *given back*: the heartbeat
stops renewing their claims, their leases run out, and the reconciler reruns them.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from types import SimpleNamespace

from workers.context import WorkerContext
from workers.job_io import JobInput, JobOutput, JSONObject
from workers.protocol import Runner
from workers.uploader import Item
from yue2_jobs.core.retry import retrying, transient
from yue2_jobs.db.models import JobStatus
from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.jobs.inputs import read_input
from yue2_jobs.jobs.keys import file_key, output_key
from yue2_jobs.jobs.outputs import facts_of, output_body
from yue2_jobs.jobs.state import ClaimedJob, finish_jobs

log = logging.getLogger(__name__)


def _failure(exc: BaseException) -> JSONObject:
    if isinstance(exc, InvalidRequestError):  # the input breaks a rule only the worker can check
        return {"code": exc.code if exc.code != "invalid_request" else "invalid_input", "message": str(exc),
                "field": exc.field, "status_code": exc.status}
    return {"code": "job_failed", "message": str(exc) or type(exc).__name__, "status_code": 500}


def failed_result(runner: Runner, row: ClaimedJob, exc: BaseException) -> JSONObject:
    return {"id": row.id, "claim_token": row.claim_token, "status": JobStatus.FAILED, "error": _failure(exc),
            "checkpoint": runner.checkpoint, "weights_sha256": runner.weights_sha256}


def _deadline(ctx: WorkerContext) -> float:
    return time.monotonic() + ctx.settings.outage_retry_s


def load_inputs(ctx: WorkerContext, rows: list[ClaimedJob]
                ) -> tuple[list[JobInput], list[JSONObject], list[ClaimedJob]]:
    """(inputs to run, failed results, rows given back): an input storage cannot give for now is
    retried, then given back; one it refuses for good fails its job alone."""
    inputs: list[JobInput] = []
    failed: list[JSONObject] = []
    given_back: list[ClaimedJob] = []
    deadline = _deadline(ctx)
    for row in rows:
        try:
            text = retrying(partial(read_input, ctx.storage, input_text=row.input_text, input_key=row.input_key,
                                    kind=row.kind), deadline=deadline, what=f"reading the input of {row.id}")
            inputs.append(JobInput.of(id=row.id, kind=row.kind, text=text, params=row.params))
        except Exception as exc:
            if transient(exc):
                given_back.append(row)
            else:
                failed.append(failed_result(ctx.runner, row, exc))
    if given_back:
        log.warning("storage unreachable for %.0fs: %d jobs given back to rerun later", ctx.settings.outage_retry_s,
                    len(given_back))
        ctx.let_go(r.id for r in given_back)
    return inputs, failed, given_back


def _output_objects(ctx: WorkerContext, runner: Runner, row: ClaimedJob, out: JobOutput
                    ) -> tuple[list[Item], JSONObject]:
    """What to store for one decoded job (its JSON, a render job's images) and its row's result."""
    key = output_key(tenant=row.tenant, batch_id=row.batch_id, job_id=row.id)
    used = out.input_tokens if out.input_tokens_used is None else out.input_tokens_used
    values = {"checkpoint": runner.checkpoint, "weights_sha256": runner.weights_sha256,
              "input_tokens": out.input_tokens,
              "output_tokens": out.output_tokens, "decoder_steps": out.decoder_steps, "nar_tokens": out.nar_tokens,
              "decoded_mode": out.mode, "input_tokens_used": used, "input_truncated": out.input_truncated,
              "chunks": out.chunks}
    # The stored JSON says what the row records, read as the batch finalizer and the job's view
    # read the row (`facts_of`), so all three agree (`decoding.mode` among them).
    facts = facts_of(SimpleNamespace(id=row.id, kind=row.kind, custom_id=row.custom_id, variant=row.variant,
                                     **values))
    body = output_body(facts, out.text)
    puts: list[Item] = []
    if out.files:  # a render job's images, beside its JSON
        body["files"] = {suffix: file_key(key, suffix) for suffix, _, _ in out.files}
        puts = [(file_key(key, suffix), data, ctype) for suffix, data, ctype in out.files]
    body.update(out.extra or {})
    puts.append((key, json.dumps(body, ensure_ascii=False).encode(), "application/json"))
    inline = out.text if len(out.text.encode()) <= ctx.settings.inline_output_bytes else None
    return puts, {"id": row.id, "claim_token": row.claim_token, "status": JobStatus.SUCCEEDED, "output_key": key,
                  "output_text": inline, "error": None, **values}


def _finish(ctx: WorkerContext, results: list[JSONObject], deadline: float) -> None:
    def once() -> None:
        with ctx.sessions() as session:
            finish_jobs(session, results)

    retrying(once, deadline=deadline, what=f"recording {len(results)} results")


def record(ctx: WorkerContext, runner: Runner, rows: list[ClaimedJob], inputs: list[JobInput],
           outputs: list[JobOutput | Exception],
           failed: list[JSONObject]) -> None:
    """Store and mark one slice's results; `runner` is the one that decoded them (a hot swap may
    have replaced `ctx.runner` since). The slice's claims are let go however this ends."""
    try:
        by_id = {r.id: r for r in rows}
        results = list(failed)
        deadline = _deadline(ctx)
        stored: list[tuple[list[Item], ClaimedJob, JSONObject]] = []
        for job_in, out in zip(inputs, outputs, strict=True):
            row = by_id[job_in.id]
            if isinstance(out, JobOutput):
                items, result = _output_objects(ctx, runner, row, out)
                stored.append((items, row, result))
            else:
                results.append(failed_result(runner, row, out))
        # The slice's PUTs at once (`Uploader.submit_all`), then each job's own outcome.
        futures = iter(ctx.uploader.submit_all([item for items, _, _ in stored for item in items], deadline=deadline))
        puts = [([next(futures) for _ in items], row, result) for items, row, result in stored]
        given_back = 0
        for uploads, row, result in puts:
            try:
                for upload in uploads:
                    upload.result()
                results.append(result)
            except Exception as exc:
                if transient(exc):  # storage stayed unreachable past the deadline: rerun it later
                    given_back += 1
                else:  # storage refused this job's output for good: it fails alone
                    results.append(failed_result(runner, row, exc))
        if given_back:
            log.warning("storage unreachable for %.0fs: %d jobs given back to rerun later",
                        ctx.settings.outage_retry_s, given_back)
        _finish(ctx, results, deadline)
        assert ctx.metrics is not None
        for status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
            ctx.metrics.job_done(str(status), sum(r["status"] == status for r in results))
        ctx.metrics.tokens_done(tokens=sum(r.get("output_tokens") or 0 for r in results),
                                nar_tokens=sum(r.get("nar_tokens") or 0 for r in results))
    finally:
        ctx.let_go(r.id for r in rows)
