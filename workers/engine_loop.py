"""Fresh jobs through the worker's continuous-batching engine (`workers.tasks` hands them over)."""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from workers.claims import claim_group
from workers.context import WorkerContext
from workers.job_io import JobInput, JobOutput
from workers.protocol import EngineRunner, engine_runner
from workers.record import load_inputs, record
from workers.swap import adopt_pending

if TYPE_CHECKING:
    from yue2_jobs.model.continuous import ContinuousBatcher

log = logging.getLogger(__name__)


def run_continuous(ctx: WorkerContext, session: Session, groups: list[list[str]], pending: list[Future[None]],
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
            rows = claim_group(ctx, session, todo.popleft(), batch_ids, claimed)
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
