"""A micro-batch of job ids through `workers.tasks.process_jobs`, no servers (SQLite, a local
directory, runners without a model): fresh jobs in groups of `batch_max_jobs`, tenants taking
turns; a job that was started before (its worker died) runs alone, after the rest, never in the
engine; finished, unknown and repeated ids are skipped; every claim ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import update

from tests.workers.fakes import (
    EchoRunner,
    EngineEchoRunner,
    FakeEngine,
    batch_row,
    expire_last_attempt,
    new_batch,
    new_jobs,
    outputs,
    statuses,
)
from workers.context import WorkerContext
from workers.protocol import Runner
from workers.tasks import process_jobs
from yue2_jobs.db.models import BatchStatus, Job
from yue2_jobs.db.session import utcnow
from yue2_jobs.jobs.state import claim_jobs


@pytest.fixture
def worker(worker_context: Callable[..., WorkerContext]) -> Callable[..., WorkerContext]:
    def make(runner: Runner, **settings: Any) -> WorkerContext:
        # fair_share_rows=0: no look at other tests' jobs in this module's database.
        return worker_context(runner, fair_share_rows=0, **settings)

    return make


def suspect(ctx: WorkerContext, text: str) -> str:
    """A job whose worker died while running it: claimed once, its lease run out."""
    (job_id,) = new_jobs(ctx, [text])
    with ctx.sessions() as session:
        claim_jobs(session, job_ids=[job_id], worker="dead", lease_s=60, max_attempts=3)
        session.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow()))
        session.commit()
    return job_id


def test_fresh_jobs_run_in_groups_tenants_in_turn_and_a_suspect_alone_last(worker: Callable[..., WorkerContext]
                                                                          ) -> None:
    runner = EchoRunner()
    ctx = worker(runner, batch_max_jobs=2)
    a = new_jobs(ctx, ["a0", "a1", "a2"], tenant="A")
    b = new_jobs(ctx, ["b0", "b1"], tenant="B")
    s = suspect(ctx, "s")
    (done,) = new_jobs(ctx, ["done"])
    process_jobs(ctx, [done])
    runner.calls.clear()

    process_jobs(ctx, [s, *a, *b, a[0], done, "job_unknown"])
    assert runner.calls == [[a[0], b[0]], [a[1], b[1]], [a[2]], [s]]
    assert statuses(ctx, [*a, *b, s]) == ["succeeded"] * 6
    assert outputs(ctx, [a[0], s]) == ["run: a0", "run: s"]
    assert ctx.claims == {}


def test_with_an_engine_fresh_jobs_decode_there_and_a_suspect_still_runs_alone(worker: Callable[..., WorkerContext]
                                                                              ) -> None:
    engine = FakeEngine(max_rows=4)
    runner = EngineEchoRunner(engine)
    ctx = worker(runner, batch_max_jobs=2)
    fresh = new_jobs(ctx, ["f0", "f1", "f2"])
    s = suspect(ctx, "s")
    process_jobs(ctx, [s, *fresh])
    assert [keys for keys, _, _ in engine.submits] == [fresh[:2], fresh[2:]]  # claimed and handed over by group
    assert runner.calls == [[s]]  # it may kill the process: never in the engine
    assert outputs(ctx, [*fresh, s]) == ["engine: f0", "engine: f1", "engine: f2", "run: s"]
    assert ctx.claims == {} and not engine.has_work()


def test_a_batch_whose_last_job_ran_out_of_attempts_is_finalized(worker: Callable[..., WorkerContext]) -> None:
    ctx = worker(EchoRunner())
    batch_id, (poison, fine) = new_batch(ctx, ["poison", "fine"])
    expire_last_attempt(ctx, poison)
    process_jobs(ctx, [fine])  # the batch's other job: recorded, the batch still has `poison` running
    assert batch_row(ctx, batch_id).status == BatchStatus.IN_PROGRESS
    process_jobs(ctx, [poison])  # redelivered: failed at its claim, nothing runs, the batch ends
    assert statuses(ctx, [poison, fine]) == ["failed", "succeeded"]
    assert batch_row(ctx, batch_id).status == BatchStatus.COMPLETED


@pytest.mark.parametrize("path", ["engine", "static"])
def test_a_warm_shutdown_finishes_what_runs_and_puts_the_rest_back_on_the_queue(
        worker: Callable[..., WorkerContext], path: str) -> None:
    """Once the worker is stopping (`ctx.draining`, set by Celery's warm shutdown), the micro-batch
    starts no further group: the jobs it claimed finish and are recorded, the rest go back on the
    queue (`ctx.requeue`) before the ack, unclaimed; a stop costs one working set, not 32 x 32 jobs."""
    requeued: list[list[str]] = []
    if path == "engine":
        engine = FakeEngine(max_rows=2, finish_per_step=1)
        runner: Runner = EngineEchoRunner(engine)
    else:
        runner = EchoRunner()
    ctx = worker(runner, batch_max_jobs=2)
    ctx.requeue = requeued.append
    ids = new_jobs(ctx, [f"t{i}" for i in range(8)])
    if path == "engine":
        engine.on_step = lambda _: ctx.draining.set()  # SIGTERM while the first rows decode
    else:
        runner.run = lambda jobs, run=runner.run: (ctx.draining.set(), run(jobs))[1]  # type: ignore[method-assign]
    process_jobs(ctx, ids)
    done = [s == "succeeded" for s in statuses(ctx, ids)]
    started = sum(done)
    assert done == [True] * started + [False] * (len(ids) - started)  # claimed in order: a prefix finished
    assert 2 <= started <= 4  # what was claimed when the stop came (the engine: its rows and its queue)
    assert statuses(ctx, ids)[started:] == ["queued"] * (len(ids) - started)  # never claimed
    assert requeued == [ids[started:]]
    assert not ctx.claims  # every claim it took ended
