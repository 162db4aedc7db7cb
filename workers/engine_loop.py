"""Fresh jobs through the worker's continuous-batching engine (`workers.tasks` hands them over)."""

from __future__ import annotations

import logging
import time
from collections import deque

from workers.context import WorkerContext
from workers.fair_share import FairShare
from workers.job_io import JobInput, JobOutput
from workers.micro_batch import MicroBatch
from workers.protocol import EngineRunner, engine_runner
from workers.record import load_inputs
from yue2_jobs.decode.continuous import ContinuousBatcher
from yue2_jobs.jobs.state import ClaimedJob

log = logging.getLogger(__name__)


def run_continuous(ctx: WorkerContext, batch: MicroBatch, groups: list[list[str]], *,
                   share: FairShare | None = None) -> float:
    """Fresh jobs through the continuous-batching engine; returns the seconds spent decoding.

    Groups are claimed as the engine's queue runs low (one row set ahead), so claims are not held
    long before their decode; finished jobs are recorded in groups of `batch_max_jobs`, or after
    `batch_flush_ms` when fewer finish, so latency does not wait for the slowest row. If this
    raises, the engine's rows are dropped (`batch` lets their claims go). Other tenants' waiting
    jobs that `share` finds jump the engine's waiting line (`jobs.fair_share`).
    """
    try:
        return _continuous_loop(ctx, batch, groups, share)
    except BaseException:
        er = engine_runner(ctx.runner)
        if er is not None and er.engine is not None:
            er.engine.abandon()
        raise


def _engine_of(ctx: WorkerContext) -> tuple[EngineRunner, ContinuousBatcher[str]]:
    runner = engine_runner(ctx.runner)
    if runner is None or runner.engine is None:  # a swap keeps the batching mode: settings do not change
        raise TypeError(f"runner {ctx.runner.checkpoint} has no continuous-batching engine")
    return runner, runner.engine


class _Finished:
    """Decoded jobs waiting to be recorded together, with the claimed rows and inputs of every job
    in the engine (by id)."""

    def __init__(self) -> None:
        self.rows: dict[str, ClaimedJob] = {}
        self.inputs: dict[str, JobInput] = {}
        self.done: list[tuple[JobInput, JobOutput | Exception]] = []
        self.first_at = 0.0

    def add(self, job: JobInput, out: JobOutput | Exception) -> None:
        if not self.done:
            self.first_at = time.perf_counter()
        self.done.append((job, out))

    def flush(self, batch: MicroBatch, runner: EngineRunner) -> None:
        rows = [self.rows.pop(job.id) for job, _ in self.done]
        for job, _ in self.done:
            self.inputs.pop(job.id, None)
        batch.record(runner, rows=rows, inputs=[j for j, _ in self.done], outputs=[o for _, o in self.done],
                     failed=[])
        self.done = []


def _continuous_loop(ctx: WorkerContext, batch: MicroBatch, groups: list[list[str]],
                     share: FairShare | None) -> float:
    runner, engine = _engine_of(ctx)
    s = ctx.settings
    assert ctx.metrics is not None
    todo = deque(groups)
    fin = _Finished()
    decode_s = 0.0
    while todo or engine.has_work():
        if ctx.swap.pending and not engine.has_work():
            # A hot swap: the old engine has drained (nothing was admitted to it meanwhile).
            if fin.done:
                fin.flush(batch, runner)
            ctx.swap.adopt()
            runner, engine = _engine_of(ctx)
        if todo and ctx.draining.is_set():  # a warm shutdown: the rows in the engine finish, nothing more starts
            batch.leave(todo)
            todo.clear()
        # Only while its own jobs are still to start: then the engine drains and the micro-batch ends.
        if share is not None and todo and not ctx.swap.pending and (others := share.due()):
            decode_s += _admit_group(ctx, batch, others, runner, engine, fin, first=True)
        while todo and len(engine.waiting) < engine.max_rows and not ctx.swap.pending:
            decode_s += _admit_group(ctx, batch, todo.popleft(), runner, engine, fin, fresh=True)
        t0 = time.perf_counter()
        results = engine.step()
        for res in results:
            job = fin.inputs[res.request.key]
            # A row that failed with its whole step is rerun alone, to find the culprit.
            fin.add(job, runner.run([job])[0] if res.isolate else runner.output_of(res))
        decode_s += time.perf_counter() - t0  # detokenizing included: decoding's own work, not the pipeline's
        try:
            ctx.metrics.engine_progress(engine)
        except Exception:  # monitoring must never fail a batch
            log.warning("metrics update failed", exc_info=True)
        if fin.done and (len(fin.done) >= s.batch_max_jobs or not engine.has_work()
                         or time.perf_counter() - fin.first_at >= s.batch_flush_ms / 1000):
            fin.flush(batch, runner)
    if fin.done:
        fin.flush(batch, runner)
    return decode_s


def _admit_group(ctx: WorkerContext, batch: MicroBatch, group: list[str], runner: EngineRunner,
                 engine: ContinuousBatcher[str], fin: _Finished, *, first: bool = False, fresh: bool = False) -> float:
    """Claim `group` and hand its jobs to the engine (or, those it cannot take, to `runner.run`);
    returns the seconds spent tokenizing them and in `runner.run` (decoding's own work). `first`:
    ahead of the engine's waiting line; `fresh`: read as never started (`MicroBatch.claim`)."""
    rows = batch.claim(group, fresh=fresh)
    if not rows:
        return 0.0
    inputs, failed, _ = load_inputs(ctx, rows)
    if failed:
        failed_ids = {f["id"] for f in failed}
        batch.record(runner, rows=[r for r in rows if r.id in failed_ids], inputs=[], outputs=[], failed=failed)
    fin.rows.update((r.id, r) for r in rows)
    fin.inputs.update((j.id, j) for j in inputs)
    t0 = time.perf_counter()
    other = [j for j in inputs if not runner.continuous_ok(j)]
    requests, bad = runner.requests_for([j for j in inputs if runner.continuous_ok(j)])
    for j in inputs:
        if j.id in bad:
            fin.add(j, bad[j.id])
    engine.submit(requests, first=first)
    for j, out in zip(other, runner.run(other) if other else [], strict=True):
        fin.add(j, out)
    return time.perf_counter() - t0
