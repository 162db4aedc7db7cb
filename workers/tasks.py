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
from collections.abc import Callable

from celery import Celery, Task
from celery_batches import Batches, SimpleRequest
from sqlalchemy import select

from workers.context import WorkerContext
from workers.engine_loop import run_continuous
from workers.fair_share import FairShare
from workers.micro_batch import MicroBatch, in_db
from workers.protocol import engine_runner
from workers.record import load_inputs
from workers.task_events import announce
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job
from yue2_jobs.jobs.fair_share import interleave
from yue2_jobs.queue import TASK_NAME

log = logging.getLogger(__name__)


def process_jobs(ctx: WorkerContext, job_ids: list[str]) -> None:
    """Claim, run and record `job_ids`; ids that are finished or held by a live claim are skipped.

    Returns once every result is recorded, so the caller's ack never precedes the record. If it
    raises (an outage outlasted `outage_retry_s`), every claim it took is let go: their leases run
    out and the reconciler reruns those jobs, and jobs it never claimed are still `queued`. Once the
    worker is stopping it starts no further group: what it did not start goes back on the queue.
    """
    s = ctx.settings
    job_ids = list(dict.fromkeys(job_ids))
    t_start, decode_s = time.perf_counter(), 0.0
    with ctx.sessions() as session, MicroBatch(ctx, session) as batch:
        def read_jobs() -> dict[str, tuple[int, str, str | None]]:
            found = {j: (a, t, b) for j, a, t, b in session.execute(
                select(Job.id, Job.attempts, Job.tenant, Job.batch_id).where(Job.id.in_(job_ids)))}
            session.commit()
            return found

        known = in_db(ctx, session, "reading attempts", read_jobs)
        batch.expect(b for _, _, b in known.values())
        # Tenants take turns within the micro-batch (`jobs.fair_share`), each in message order.
        fresh = interleave((j, known[j][1]) for j in job_ids if j in known and known[j][0] == 0)
        suspects = [j for j in job_ids if j in known and known[j][0] > 0]
        share = FairShare(ctx, session, serving={t for _, t, _ in known.values()}, budget=len(known))
        # Fresh jobs are claimed a generate call's worth at a time, so results are recorded as
        # they come; suspects are claimed one at a time, right before they run alone.
        size = s.batch_max_jobs
        groups = [fresh[i:i + size] for i in range(0, len(fresh), size)]
        if engine_runner(ctx.runner) is not None:
            decode_s += run_continuous(ctx, batch, groups, share=share)
            groups = []
        todo = deque([*groups, *([j] for j in suspects)])
        fresh_ids = set(fresh)
        while todo:
            if ctx.draining.is_set():  # a warm shutdown: finish what runs, start nothing more
                # Other tenants' jobs fair share put here have their own messages still queued.
                batch.leave([j for j in group if j in fresh_ids or j in suspects] for group in todo)
                break
            if others := share.due():  # other tenants' waiting jobs go first, while own ones remain
                todo.extendleft(reversed([others[i:i + size] for i in range(0, len(others), size)]))
            group = todo.popleft()
            if len(group) == 1 and group[0] in suspects:
                batch.wait()  # a suspect may kill this process: keep what is done so far
            ctx.swap.adopt()  # a hot swap lands between groups
            rows = batch.claim(group, fresh=fresh_ids.issuperset(group))
            if not rows:
                continue
            runner = ctx.runner
            inputs, failed, _ = load_inputs(ctx, rows)
            t_decode = time.perf_counter()
            outputs = runner.run(inputs) if inputs else []
            decode_s += time.perf_counter() - t_decode
            batch.record(runner, rows=rows, inputs=inputs, outputs=outputs, failed=failed)
    batch.finish()
    if batch.unstarted:
        ctx.requeue(batch.unstarted)
    log.info("micro-batch of %d jobs (and %d of other tenants) in %.3fs, %.3fs of it decoding; claim %.3fs, "
             "waiting for the recorder %.3fs", len(job_ids), share.started, time.perf_counter() - t_start, decode_s,
             batch.claim_s, batch.wait_s)


def _ids(arg: str | list[str]) -> list[str]:
    return [arg] if isinstance(arg, str) else list(arg)


def register(app: Celery, ctx_getter: Callable[[], WorkerContext], settings: Settings) -> Task:
    @app.task(base=Batches, name=TASK_NAME, flush_every=settings.batch_max_jobs,
              flush_interval=settings.batch_flush_ms / 1000, acks_late=True, bind=False)
    def run_jobs(requests: list[SimpleRequest]) -> None:
        ctx = ctx_getter()
        announce(app, ctx.name, requests, started=True)
        t0, error = time.monotonic(), None
        try:
            with ctx.swap.batch_gate:
                process_jobs(ctx, [j for r in requests for j in _ids(r.args[0])])
        except Exception as exc:
            # Postgres or storage down: nothing was recorded as done. Leave the claims to expire so
            # the reconciler republishes the jobs; the acks here only drop these deliveries.
            log.exception("micro-batch of %d jobs could not be processed", len(requests))
            error = exc
        announce(app, ctx.name, requests, started=False, runtime=time.monotonic() - t0, error=error)

    return run_jobs
