"""The Celery task a worker runs: micro-batches of job ids (celery-batches) through its model.

celery-batches acks the whole micro-batch when `run_jobs` returns and marks every request failed
if it raises, so `process_jobs` never raises for a job's sake: each job ends `succeeded` or
`failed` in Postgres on its own. A job that was already started once (its worker died) runs alone,
so a job that kills its worker uses up only its own attempts, not its batch-mates'.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from celery_batches import Batches
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from workers.runner import JobInput, JobOutput
from workers.uploader import Uploader
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job, JobStatus
from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.jobs.batches import job_output_body, try_finalize
from yue2_jobs.jobs.service import output_key
from yue2_jobs.jobs.state import claim_jobs, finish_jobs
from yue2_jobs.queue import TASK_NAME
from yue2_jobs.storage import Storage

log = logging.getLogger(__name__)


@dataclass
class WorkerContext:
    settings: Settings
    sessions: sessionmaker[Session]
    storage: Storage
    runner: Any  # workers.runner.ModelRunner or a test's runner with the same `run` and `checkpoint`
    name: str
    claims: dict[str, str] = field(default_factory=dict)  # job id -> claim token, renewed by the heartbeat
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Recording a slice's results (S3 PUTs, one UPDATE) overlaps decoding of the next slice.
    recorder: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "yue2-record"))
    uploader: Uploader | None = None

    def __post_init__(self) -> None:
        if self.uploader is None:
            self.uploader = Uploader(self.settings, self.storage)


def _failure(exc: BaseException) -> dict[str, Any]:
    code = "invalid_input" if isinstance(exc, InvalidRequestError) else "job_failed"
    return {"code": code, "message": str(exc) or type(exc).__name__, "status_code": 500}


def _failed(ctx: WorkerContext, row: Any, exc: BaseException) -> dict[str, Any]:
    return {"id": row.id, "claim_token": row.claim_token, "status": JobStatus.FAILED, "error": _failure(exc),
            "checkpoint": ctx.runner.checkpoint}


def _load_inputs(ctx: WorkerContext, rows: list[Any]) -> tuple[list[JobInput], list[dict[str, Any]]]:
    inputs: list[JobInput] = []
    failed: list[dict[str, Any]] = []
    for row in rows:
        try:
            text = row.input_text if row.input_key is None else ctx.storage.get(row.input_key).decode()
            inputs.append(JobInput(id=row.id, kind=row.kind, text=text, params=row.params))
        except Exception as exc:  # storage failure for one input fails only that job
            failed.append(_failed(ctx, row, exc))
    return inputs, failed


def _store_output(ctx: WorkerContext, row: Any, out: JobOutput) -> tuple[Future[None], dict[str, Any]]:
    key = output_key(tenant=row.tenant, batch_id=row.batch_id, job_id=row.id)
    values = {"checkpoint": ctx.runner.checkpoint, "input_tokens": out.input_tokens,
              "output_tokens": out.output_tokens, "decoder_steps": out.decoder_steps, "nar_tokens": out.nar_tokens}
    job = Job(id=row.id, kind=row.kind, custom_id=row.custom_id, variant=row.variant, params=row.params, **values)
    assert ctx.uploader is not None
    put = ctx.uploader.submit(key, json.dumps(job_output_body(job, out.text), ensure_ascii=False).encode())
    inline = out.text if len(out.text.encode()) <= ctx.settings.inline_output_bytes else None
    return put, {"id": row.id, "claim_token": row.claim_token, "status": JobStatus.SUCCEEDED, "output_key": key,
                 "output_text": inline, "error": None, **values}


def _record(ctx: WorkerContext, rows: list[Any], inputs: list[JobInput], outputs: list[Any],
            failed: list[dict[str, Any]]) -> None:
    by_id = {r.id: r for r in rows}
    results = list(failed)
    puts: list[tuple[Future[None], Any, dict[str, Any]]] = []
    for job_in, out in zip(inputs, outputs, strict=True):
        row = by_id[job_in.id]
        if isinstance(out, JobOutput):
            put, result = _store_output(ctx, row, out)
            puts.append((put, row, result))
        else:
            results.append(_failed(ctx, row, out))
    for put, row, result in puts:
        try:
            put.result()
            results.append(result)
        except Exception as exc:  # this job's output did not reach storage: it fails alone
            results.append(_failed(ctx, row, exc))
    with ctx.sessions() as session:
        finish_jobs(session, results)
    with ctx.lock:
        for row in rows:
            ctx.claims.pop(row.id, None)


def _wait(pending: list[Future[None]]) -> None:
    for future in pending:
        future.result()
    pending.clear()


def process_jobs(ctx: WorkerContext, job_ids: list[str]) -> None:
    """Claim, run and record `job_ids`; ids that are finished or held by a live claim are skipped.

    Returns once every result is recorded, so the caller's ack never precedes the record.
    """
    s = ctx.settings
    job_ids = list(dict.fromkeys(job_ids))
    pending: list[Future[None]] = []
    batch_ids: set[str] = set()
    t_start, decode_s = time.perf_counter(), 0.0
    try:
        with ctx.sessions() as session:
            attempts = dict(session.execute(select(Job.id, Job.attempts).where(Job.id.in_(job_ids))).all())
            session.commit()
            fresh = [j for j in job_ids if attempts.get(j) == 0]
            suspects = [j for j in job_ids if attempts.get(j, 0) > 0]
            # Fresh jobs are claimed a generate call's worth at a time, so results are recorded as
            # they come; suspects are claimed one at a time, right before they run alone.
            size = s.batch_max_jobs
            for group in [*(fresh[i:i + size] for i in range(0, len(fresh), size)), *([j] for j in suspects)]:
                if len(group) == 1 and group[0] in suspects:
                    _wait(pending)  # a suspect may kill this process: keep what is done so far
                rows, exhausted = claim_jobs(session, job_ids=group, worker=ctx.name, lease_s=s.lease_s,
                                             max_attempts=s.max_attempts)
                if exhausted:
                    log.warning("failed after %d attempts: %s", s.max_attempts, exhausted)
                    batch_ids.update(session.execute(select(Job.batch_id).where(Job.id.in_(exhausted))).scalars())
                if not rows:
                    continue
                with ctx.lock:
                    ctx.claims.update({r.id: r.claim_token for r in rows})
                inputs, failed = _load_inputs(ctx, rows)
                t_decode = time.perf_counter()
                outputs = ctx.runner.run(inputs) if inputs else []
                decode_s += time.perf_counter() - t_decode
                pending.append(ctx.recorder.submit(_record, ctx, rows, inputs, outputs, failed))
                batch_ids.update(r.batch_id for r in rows)
    finally:
        _wait(pending)
    with ctx.sessions() as session:
        for batch_id in batch_ids - {None}:
            try_finalize(session, batch_id=batch_id, storage=ctx.storage)
    log.info("micro-batch of %d jobs in %.2fs, %.2fs of it decoding", len(job_ids), time.perf_counter() - t_start,
             decode_s)


def _ids(arg: str | list[str]) -> list[str]:
    return [arg] if isinstance(arg, str) else list(arg)


def register(app: Celery, ctx_getter: Any, settings: Settings) -> Any:
    @app.task(base=Batches, name=TASK_NAME, flush_every=settings.batch_max_jobs,
              flush_interval=settings.batch_flush_ms / 1000, acks_late=True, bind=False)
    def run_jobs(requests: list[Any]) -> None:
        try:
            process_jobs(ctx_getter(), [j for r in requests for j in _ids(r.args[0])])
        except Exception:
            # Postgres or storage down: nothing was recorded as done. Leave the claims to expire so
            # the reconciler republishes the jobs; the acks here only drop these deliveries.
            log.exception("micro-batch of %d jobs could not be processed", len(requests))

    return run_jobs
