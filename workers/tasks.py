"""The Celery task a worker runs: micro-batches of job ids (celery-batches) through its model.

celery-batches acks the whole micro-batch when `run_jobs` returns and marks every request failed
if it raises, so `process_jobs` never raises for a job's sake: each job ends `succeeded` or
`failed` in Postgres on its own. A job that was already started once (its worker died) runs alone,
so a job that kills its worker uses up only its own attempts, not its batch-mates'.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.worker import state as worker_state
from celery_batches import Batches
from sqlalchemy import select
from sqlalchemy.orm import Session

from workers.context import WorkerContext
from workers.job_io import JobInput, JobOutput
from workers.protocol import EngineRunner, engine_runner
from workers.record import load_inputs, record
from workers.swap import adopt_pending
from yue2_jobs.core.config import Settings
from yue2_jobs.core.retry import retrying, transient
from yue2_jobs.db.models import Job
from yue2_jobs.jobs.batches import try_finalize
from yue2_jobs.jobs.state import claim_jobs
from yue2_jobs.queue import TASK_NAME

if TYPE_CHECKING:
    from yue2_jobs.model.continuous import ContinuousBatcher

log = logging.getLogger(__name__)


def _wait(pending: list[Future[None]]) -> None:
    try:
        for future in pending:
            future.result()
    finally:
        pending.clear()


def _in_db(ctx: WorkerContext, session: Session, what: str, fn: Any) -> Any:
    """`fn()` on `session`, retried through a database outage (the session is rolled back between tries)."""
    return retrying(fn, deadline=time.monotonic() + ctx.settings.outage_retry_s, what=what,
                    on_retry=session.rollback)


def process_jobs(ctx: WorkerContext, job_ids: list[str]) -> None:
    """Claim, run and record `job_ids`; ids that are finished or held by a live claim are skipped.

    Returns once every result is recorded, so the caller's ack never precedes the record. If it
    raises (an outage outlasted `outage_retry_s`), every claim it took is let go: their leases run
    out and the reconciler reruns those jobs, and jobs it never claimed are still `queued`.
    """
    s = ctx.settings
    job_ids = list(dict.fromkeys(job_ids))
    pending: list[Future[None]] = []
    batch_ids: set[str] = set()
    claimed: set[str] = set()
    t_start, decode_s = time.perf_counter(), 0.0
    try:
        with ctx.sessions() as session:
            def read_attempts() -> dict[str, int]:
                found = dict(session.execute(select(Job.id, Job.attempts).where(Job.id.in_(job_ids))).all())
                session.commit()
                return found

            attempts = _in_db(ctx, session, "reading attempts", read_attempts)
            fresh = [j for j in job_ids if attempts.get(j) == 0]
            suspects = [j for j in job_ids if attempts.get(j, 0) > 0]
            # Fresh jobs are claimed a generate call's worth at a time, so results are recorded as
            # they come; suspects are claimed one at a time, right before they run alone.
            size = s.batch_max_jobs
            groups = [fresh[i:i + size] for i in range(0, len(fresh), size)]
            if engine_runner(ctx.runner) is not None:
                decode_s += _run_continuous(ctx, session, groups, pending, batch_ids, claimed)
                groups = []
            for group in [*groups, *([j] for j in suspects)]:
                if len(group) == 1 and group[0] in suspects:
                    _wait(pending)  # a suspect may kill this process: keep what is done so far
                adopt_pending(ctx)  # a hot swap lands between groups
                rows = _claim(ctx, session, group, batch_ids, claimed)
                if not rows:
                    continue
                runner = ctx.runner
                inputs, failed, _ = load_inputs(ctx, rows)
                t_decode = time.perf_counter()
                outputs = runner.run(inputs) if inputs else []
                decode_s += time.perf_counter() - t_decode
                pending.append(ctx.recorder.submit(record, ctx, runner, rows, inputs, outputs, failed))
    finally:
        try:
            _wait(pending)
        finally:
            ctx.let_go(claimed)  # recorded ones are gone already; the rest are given back
    _finalize(ctx, batch_ids)
    log.info("micro-batch of %d jobs in %.2fs, %.2fs of it decoding", len(job_ids), time.perf_counter() - t_start,
             decode_s)


def _finalize(ctx: WorkerContext, batch_ids: set[str]) -> None:
    for batch_id in batch_ids - {None}:
        try:
            with ctx.sessions() as session:
                try_finalize(session, batch_id=batch_id, storage=ctx.storage)
        except Exception as exc:
            if not transient(exc):
                raise
            # Its files are written by the reconciler's next pass once the outage is over.
            log.warning("finalizing batch %s: %s; the reconciler will finish it", batch_id, type(exc).__name__)


def _claim(ctx: WorkerContext, session: Session, group: list[str], batch_ids: set[str], claimed: set[str]
           ) -> list[Any]:
    s = ctx.settings

    def claim() -> tuple[list[Any], list[str]]:
        return claim_jobs(session, job_ids=group, worker=ctx.name, lease_s=s.lease_s, max_attempts=s.max_attempts)

    rows, exhausted = _in_db(ctx, session, f"claiming {len(group)} jobs", claim)
    if exhausted:
        log.warning("failed after %d attempts: %s", s.max_attempts, exhausted)
        batch_ids.update(session.execute(select(Job.batch_id).where(Job.id.in_(exhausted))).scalars())
    ctx.hold(rows)
    claimed.update(r.id for r in rows)
    batch_ids.update(r.batch_id for r in rows)
    return rows


def _run_continuous(ctx: WorkerContext, session: Session, groups: list[list[str]], pending: list[Future[None]],
                    batch_ids: set[str], claimed: set[str]) -> float:
    """Fresh jobs through the continuous-batching engine; returns the seconds spent decoding.

    Groups are claimed as the engine's queue runs low (one row set ahead), so claims are not held
    long before their decode; finished jobs are recorded in groups of `batch_max_jobs`, or after
    `batch_flush_ms` when fewer finish, so latency does not wait for the slowest row. If this
    raises, the engine's rows are dropped (their claims are let go by the caller).
    """
    try:
        return _continuous_loop(ctx, session, groups, pending, batch_ids, claimed)
    except BaseException:
        er = engine_runner(ctx.runner)
        if er is not None and er.engine is not None:
            er.engine.abandon()
        raise


def _engine_of(ctx: WorkerContext) -> tuple[EngineRunner, ContinuousBatcher]:
    runner = engine_runner(ctx.runner)
    if runner is None or runner.engine is None:  # a swap keeps the batching mode: settings do not change
        raise TypeError(f"runner {ctx.runner.checkpoint} has no continuous-batching engine")
    return runner, runner.engine


def _continuous_loop(ctx: WorkerContext, session: Session, groups: list[list[str]], pending: list[Future[None]],
                     batch_ids: set[str], claimed: set[str]) -> float:
    runner, engine = _engine_of(ctx)
    s = ctx.settings
    assert ctx.metrics is not None
    todo = deque(groups)
    rows_by_id: dict[str, Any] = {}
    done: list[tuple[JobInput, JobOutput | Exception]] = []
    first_done = 0.0
    decode_s = 0.0

    def flush() -> None:
        rows = [rows_by_id.pop(job.id) for job, _ in done]
        pending.append(ctx.recorder.submit(record, ctx, runner, rows, [j for j, _ in done], [o for _, o in done],
                                           []))
        done.clear()

    while todo or engine.has_work():
        if ctx.pending_runner is not None and not engine.has_work():
            # A hot swap: the old engine has drained (nothing was admitted to it meanwhile).
            if done:
                flush()
            adopt_pending(ctx)
            runner, engine = _engine_of(ctx)
        while todo and len(engine.waiting) < engine.max_rows and ctx.pending_runner is None:
            rows = _claim(ctx, session, todo.popleft(), batch_ids, claimed)
            if not rows:
                continue
            inputs, failed, _ = load_inputs(ctx, rows)
            if failed:
                failed_ids = {f["id"] for f in failed}
                pending.append(ctx.recorder.submit(record, ctx, runner, [r for r in rows if r.id in failed_ids],
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
