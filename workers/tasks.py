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
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from celery.worker import state as worker_state
from celery_batches import Batches
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from workers.metrics import WorkerMetrics
from workers.runner import JobInput, JobOutput
from workers.swap import adopt_pending
from workers.uploader import Uploader
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job, JobStatus
from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.jobs.batches import job_output_body, try_finalize
from yue2_jobs.jobs.service import file_key, output_key
from yue2_jobs.jobs.state import claim_jobs, finish_jobs
from yue2_jobs.queue import TASK_NAME
from yue2_jobs.storage import Storage

log = logging.getLogger(__name__)
RETRYABLE_SQLSTATES = {"40P01", "40001"}  # deadlock_detected, serialization_failure


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
    metrics: WorkerMetrics | None = None
    # Held by each micro-batch from its first claim to its last record; a hot swap takes it to
    # replace `runner`, so the switch falls between micro-batches (workers.swap).
    swap_lock: threading.Lock = field(default_factory=threading.Lock)
    swap_status: dict[str, Any] = field(default_factory=dict)
    pending_runner: Any = None  # a hot swap's loaded runner, until the decode loop adopts it (workers.swap)
    report_now: threading.Event = field(default_factory=threading.Event)  # wakes the status reporter

    def __post_init__(self) -> None:
        if self.uploader is None:
            self.uploader = Uploader(self.settings, self.storage)
        if self.metrics is None:
            engine = getattr(self.runner, "engine", None)
            self.metrics = WorkerMetrics(worker=self.name, max_rows=engine.max_rows if engine else 1)


def _failure(exc: BaseException) -> dict[str, Any]:
    code = "invalid_input" if isinstance(exc, InvalidRequestError) else "job_failed"
    return {"code": code, "message": str(exc) or type(exc).__name__, "status_code": 500}


def _failed(runner: Any, row: Any, exc: BaseException) -> dict[str, Any]:
    return {"id": row.id, "claim_token": row.claim_token, "status": JobStatus.FAILED, "error": _failure(exc),
            "checkpoint": runner.checkpoint, "weights_sha256": runner.weights_sha256}


def _load_inputs(ctx: WorkerContext, rows: list[Any]) -> tuple[list[JobInput], list[dict[str, Any]]]:
    inputs: list[JobInput] = []
    failed: list[dict[str, Any]] = []
    for row in rows:
        try:
            text = row.input_text if row.input_key is None else ctx.storage.get(row.input_key).decode()
            inputs.append(JobInput(id=row.id, kind=row.kind, text=text, params=row.params))
        except Exception as exc:  # storage failure for one input fails only that job
            failed.append(_failed(ctx.runner, row, exc))
    return inputs, failed


def _store_output(ctx: WorkerContext, runner: Any, row: Any, out: JobOutput
                  ) -> tuple[list[Future[None]], dict[str, Any]]:
    key = output_key(tenant=row.tenant, batch_id=row.batch_id, job_id=row.id)
    values = {"checkpoint": runner.checkpoint, "weights_sha256": runner.weights_sha256,
              "input_tokens": out.input_tokens,
              "output_tokens": out.output_tokens, "decoder_steps": out.decoder_steps, "nar_tokens": out.nar_tokens}
    job = Job(id=row.id, kind=row.kind, custom_id=row.custom_id, variant=row.variant, params=row.params, **values)
    assert ctx.uploader is not None
    body = job_output_body(job, out.text)
    puts = []
    if out.files:  # a render job's images, beside its JSON
        body["files"] = {suffix: file_key(key, suffix) for suffix, _, _ in out.files}
        puts = [ctx.uploader.submit(file_key(key, suffix), data, ctype) for suffix, data, ctype in out.files]
    body.update(out.extra or {})
    puts.append(ctx.uploader.submit(key, json.dumps(body, ensure_ascii=False).encode()))
    inline = out.text if len(out.text.encode()) <= ctx.settings.inline_output_bytes else None
    return puts, {"id": row.id, "claim_token": row.claim_token, "status": JobStatus.SUCCEEDED, "output_key": key,
                  "output_text": inline, "error": None, **values}


def _record(ctx: WorkerContext, runner: Any, rows: list[Any], inputs: list[JobInput], outputs: list[Any],
            failed: list[dict[str, Any]]) -> None:
    """Store and mark one slice's results; `runner` is the one that decoded them (a hot swap may
    have replaced `ctx.runner` since)."""
    by_id = {r.id: r for r in rows}
    results = list(failed)
    puts: list[tuple[list[Future[None]], Any, dict[str, Any]]] = []
    for job_in, out in zip(inputs, outputs, strict=True):
        row = by_id[job_in.id]
        if isinstance(out, JobOutput):
            put, result = _store_output(ctx, runner, row, out)
            puts.append((put, row, result))
        else:
            results.append(_failed(runner, row, out))
    for uploads, row, result in puts:
        try:
            for upload in uploads:
                upload.result()
            results.append(result)
        except Exception as exc:  # this job's output did not reach storage: it fails alone
            results.append(_failed(runner, row, exc))
    for attempt in range(3):
        try:
            with ctx.sessions() as session:
                finish_jobs(session, results)
            break
        except OperationalError as exc:  # deadlock or serialization failure: the transaction is safe to redo
            if getattr(exc.orig, "sqlstate", None) not in RETRYABLE_SQLSTATES or attempt == 2:
                raise
            log.warning("recording %d results: %s; retrying", len(results), exc.orig)
    assert ctx.metrics is not None
    for status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        ctx.metrics.job_done(str(status), sum(r["status"] == status for r in results))
    ctx.metrics.tokens_done(tokens=sum(r.get("output_tokens") or 0 for r in results),
                            nar_tokens=sum(r.get("nar_tokens") or 0 for r in results))
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
            groups = [fresh[i:i + size] for i in range(0, len(fresh), size)]
            if getattr(ctx.runner, "engine", None) is not None:
                decode_s += _run_continuous(ctx, session, groups, pending, batch_ids)
                groups = []
            for group in [*groups, *([j] for j in suspects)]:
                if len(group) == 1 and group[0] in suspects:
                    _wait(pending)  # a suspect may kill this process: keep what is done so far
                adopt_pending(ctx)  # a hot swap lands between groups
                rows = _claim(ctx, session, group, batch_ids)
                if not rows:
                    continue
                runner = ctx.runner
                inputs, failed = _load_inputs(ctx, rows)
                t_decode = time.perf_counter()
                outputs = runner.run(inputs) if inputs else []
                decode_s += time.perf_counter() - t_decode
                pending.append(ctx.recorder.submit(_record, ctx, runner, rows, inputs, outputs, failed))
    finally:
        _wait(pending)
    with ctx.sessions() as session:
        for batch_id in batch_ids - {None}:
            try_finalize(session, batch_id=batch_id, storage=ctx.storage)
    log.info("micro-batch of %d jobs in %.2fs, %.2fs of it decoding", len(job_ids), time.perf_counter() - t_start,
             decode_s)


def _claim(ctx: WorkerContext, session: Session, group: list[str], batch_ids: set[str]) -> list[Any]:
    s = ctx.settings
    rows, exhausted = claim_jobs(session, job_ids=group, worker=ctx.name, lease_s=s.lease_s,
                                 max_attempts=s.max_attempts)
    if exhausted:
        log.warning("failed after %d attempts: %s", s.max_attempts, exhausted)
        batch_ids.update(session.execute(select(Job.batch_id).where(Job.id.in_(exhausted))).scalars())
    with ctx.lock:
        ctx.claims.update({r.id: r.claim_token for r in rows})
    batch_ids.update(r.batch_id for r in rows)
    return rows


def _run_continuous(ctx: WorkerContext, session: Session, groups: list[list[str]], pending: list[Future[None]],
                    batch_ids: set[str]) -> float:
    """Fresh jobs through the continuous-batching engine; returns the seconds spent decoding.

    Groups are claimed as the engine's queue runs low (one row set ahead), so claims are not held
    long before their decode; finished jobs are recorded in groups of `batch_max_jobs`, or after
    `batch_flush_ms` when fewer finish, so latency does not wait for the slowest row.
    """
    runner, engine, s = ctx.runner, ctx.runner.engine, ctx.settings
    assert ctx.metrics is not None
    todo = deque(groups)
    rows_by_id: dict[str, Any] = {}
    done: list[tuple[JobInput, JobOutput | Exception]] = []
    first_done = 0.0
    decode_s = 0.0

    def flush() -> None:
        rows = [rows_by_id.pop(job.id) for job, _ in done]
        pending.append(ctx.recorder.submit(_record, ctx, runner, rows, [j for j, _ in done], [o for _, o in done],
                                           []))
        done.clear()

    while todo or engine.has_work():
        if ctx.pending_runner is not None and not engine.has_work():
            # A hot swap: the old engine has drained (nothing was admitted to it meanwhile).
            if done:
                flush()
            adopt_pending(ctx)
            runner, engine = ctx.runner, ctx.runner.engine
        while todo and len(engine.waiting) < engine.max_rows and ctx.pending_runner is None:
            rows = _claim(ctx, session, todo.popleft(), batch_ids)
            if not rows:
                continue
            inputs, failed = _load_inputs(ctx, rows)
            if failed:
                failed_ids = {f["id"] for f in failed}
                pending.append(ctx.recorder.submit(_record, ctx, runner, [r for r in rows if r.id in failed_ids],
                                                   [], [], failed))
            rows_by_id.update((r.id, r) for r in rows)
            other = [j for j in inputs if not runner.continuous_ok(j)]
            requests, bad = runner.requests_for([j for j in inputs if runner.continuous_ok(j)])
            done.extend((j, bad[j.id]) for j in inputs if j.id in bad)
            engine.submit(requests)
            if other:
                t0 = time.perf_counter()
                done.extend(zip(other, runner.run(other), strict=True))
                decode_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        results = engine.step()
        decode_s += time.perf_counter() - t0
        for res in results:
            job = res.request.id
            out = runner.run([job])[0] if res.isolate else runner.output_of(res)  # rerun alone: find the culprit
            done.append((job, out))
        try:
            ctx.metrics.engine_progress(engine)
        except Exception:  # monitoring must never fail a batch
            log.warning("metrics update failed", exc_info=True)
        if done and not first_done:
            first_done = time.perf_counter()
        if done and (len(done) >= s.batch_max_jobs or not engine.has_work()
                     or time.perf_counter() - first_done >= s.batch_flush_ms / 1000):
            flush()
            first_done = 0.0
    if done:
        flush()
    return decode_s


def _announce(app: Celery, node: str, requests: list[Any], *, started: bool, runtime: float = 0.0,
              error: BaseException | None = None) -> None:
    """Task events and the worker's task counter for a micro-batch: celery-batches runs its
    requests outside Celery's request path, so without this Flower would see neither."""
    try:
        with app.events.default_dispatcher(hostname=node) as events:
            for r in requests:
                if started:
                    events.send("task-received", uuid=r.id, name=TASK_NAME, args=repr(r.args)[:200], kwargs="{}",
                                retries=0, eta=None, root_id=r.id, parent_id=None)
                    events.send("task-started", uuid=r.id)
                elif error is None:
                    events.send("task-succeeded", uuid=r.id, result="None", runtime=runtime)
                else:
                    events.send("task-failed", uuid=r.id, exception=repr(error), traceback="")
        if not started:
            worker_state.total_count[TASK_NAME] += len(requests)
            worker_state.all_total_count[0] += len(requests)
    except Exception:  # monitoring must never fail a batch
        log.warning("could not send task events", exc_info=True)


def _ids(arg: str | list[str]) -> list[str]:
    return [arg] if isinstance(arg, str) else list(arg)


def register(app: Celery, ctx_getter: Any, settings: Settings) -> Any:
    @app.task(base=Batches, name=TASK_NAME, flush_every=settings.batch_max_jobs,
              flush_interval=settings.batch_flush_ms / 1000, acks_late=True, bind=False)
    def run_jobs(requests: list[Any]) -> None:
        ctx = ctx_getter()
        _announce(app, ctx.name, requests, started=True)
        t0, error = time.monotonic(), None
        try:
            with ctx.swap_lock:
                process_jobs(ctx, [j for r in requests for j in _ids(r.args[0])])
        except Exception as exc:
            # Postgres or storage down: nothing was recorded as done. Leave the claims to expire so
            # the reconciler republishes the jobs; the acks here only drop these deliveries.
            log.exception("micro-batch of %d jobs could not be processed", len(requests))
            error = exc
        _announce(app, ctx.name, requests, started=False, runtime=time.monotonic() - t0, error=error)

    return run_jobs
