"""Fresh jobs through the continuous-batching engine (`workers.engine_loop.run_continuous`), no
servers, no model: a scripted engine (`tests.workers.fakes.FakeEngine`) decides when each row
finishes, so each test pins down one rule of the loop: groups claimed only as the engine's queue
runs low, results recorded in groups of `batch_max_jobs` or after `batch_flush_ms`, jobs the
engine cannot take run through `runner.run`, other tenants' jobs jump the waiting line, and a
raise drops the engine's rows and lets their claims go."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session

from tests.workers.fakes import (
    ALONE,
    UNREADABLE,
    EngineEchoRunner,
    FakeEngine,
    jobs_by_id,
    new_jobs,
    outputs,
    statuses,
)
from workers import engine_loop
from workers.context import WorkerContext
from workers.engine_loop import run_continuous
from workers.micro_batch import MicroBatch


class RecordingBatch(MicroBatch):
    """A `MicroBatch` that notes the job ids of each recording, in the order handed over."""

    def __init__(self, ctx: WorkerContext, session: Session) -> None:
        super().__init__(ctx, session)
        self.recorded: list[list[str]] = []

    def record(self, runner: Any, *, rows: Any, inputs: Any, outputs: Any, failed: Any) -> None:
        self.recorded.append([r.id for r in rows])
        super().record(runner, rows=rows, inputs=inputs, outputs=outputs, failed=failed)


Worker = Callable[..., tuple[WorkerContext, FakeEngine]]


def runner_of(ctx: WorkerContext) -> EngineEchoRunner:
    assert isinstance(ctx.runner, EngineEchoRunner)
    return ctx.runner


@pytest.fixture
def worker(worker_context: Callable[..., WorkerContext]) -> Worker:
    """`worker(max_rows=.., finish_per_step=.., **settings)`: a context whose runner feeds a `FakeEngine`."""

    def make(*, max_rows: int = 2, finish_per_step: int = 1, **settings: Any) -> tuple[WorkerContext, FakeEngine]:
        engine = FakeEngine(max_rows=max_rows, finish_per_step=finish_per_step)
        # batch_flush_ms: far off unless a test sets it, so only the counts decide when to record.
        return worker_context(EngineEchoRunner(engine), **{"batch_flush_ms": 600_000, **settings}), engine

    return make


def run(ctx: WorkerContext, groups: list[list[str]], share: Any = None) -> RecordingBatch:
    with ctx.sessions() as session:
        batch = RecordingBatch(ctx, session)
        with batch:
            run_continuous(ctx, batch, groups, share=share)
    return batch


def test_groups_are_claimed_as_the_engines_queue_runs_low(worker: Worker) -> None:
    ctx, engine = worker(max_rows=2)
    ids = new_jobs(ctx, [f"text {i}" for i in range(8)])
    groups = [ids[i:i + 2] for i in range(0, 8, 2)]
    claimed_at_step: list[set[str]] = []
    with ctx.sessions() as session:
        batch = MicroBatch(ctx, session)
        engine.on_step = lambda _: claimed_at_step.append(set(batch.claimed))  # every id claimed so far
        with batch:
            run_continuous(ctx, batch, groups)
    # One row set ahead, never more: the first step runs with only the first group claimed, and
    # each next group is claimed and handed over while fewer than max_rows requests wait (the
    # engine admits up to 2 rows and finishes 1 a step).
    assert claimed_at_step[0] == set(groups[0])
    assert [len(c) for c in claimed_at_step[:5]] == [2, 4, 6, 6, 8]
    assert [waiting for _, _, waiting in engine.submits] == [0, 0, 1, 1]
    assert statuses(ctx, ids) == ["succeeded"] * 8
    assert outputs(ctx, ids) == [f"engine: text {i}" for i in range(8)]
    assert ctx.claims == {} and not engine.has_work()


def test_finished_jobs_are_recorded_in_groups_of_batch_max_jobs(worker: Worker) -> None:
    ctx, _ = worker(max_rows=8, batch_max_jobs=3)
    ids = new_jobs(ctx, [f"text {i}" for i in range(7)])
    batch = run(ctx, [ids])  # one row finishes per step
    assert [len(r) for r in batch.recorded] == [3, 3, 1]  # the last when the engine ran out of work
    assert [i for r in batch.recorded for i in r] == ids
    assert statuses(ctx, ids) == ["succeeded"] * 7


class Clock:
    """engine_loop's `time`: the fake engine's steps move it on, nothing is slept."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_fewer_finished_jobs_are_recorded_after_batch_flush_ms(worker: Worker, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    clock = Clock()
    monkeypatch.setattr(engine_loop, "time", clock)  # the module's name only: nothing else's clock changes
    ctx, engine = worker(max_rows=16, batch_max_jobs=100, batch_flush_ms=25)
    engine.on_step = lambda _: setattr(clock, "now", clock.now + 0.010)  # each step takes 10 ms

    ids = new_jobs(ctx, [f"text {i}" for i in range(9)])
    batch = run(ctx, [ids])
    # The first of a record waited 0, 10, 20, then 30 ms >= 25 ms: recorded, not held for the 100.
    assert [len(r) for r in batch.recorded] == [4, 4, 1]
    assert statuses(ctx, ids) == ["succeeded"] * 9


def test_jobs_the_engine_cannot_take_run_through_run_and_unreadable_ones_fail_alone(worker: Worker) -> None:
    ctx, engine = worker(max_rows=4)
    ids = new_jobs(ctx, ["one", f"two {ALONE}", f"three {UNREADABLE}", "four"])
    run(ctx, [ids])
    assert engine.submits[0][0] == [ids[0], ids[3]]  # only what the engine decodes
    assert runner_of(ctx).calls == [[ids[1]]]
    assert statuses(ctx, ids) == ["succeeded", "succeeded", "failed", "succeeded"]
    assert outputs(ctx, ids) == ["engine: one", f"run: two {ALONE}", None, "engine: four"]
    error = jobs_by_id(ctx, ids[2:3])[ids[2]].error
    assert error is not None and "cannot tokenize" in error["message"]
    assert ctx.claims == {}


def test_rows_of_a_failed_step_are_rerun_alone(worker: Worker) -> None:
    ctx, engine = worker(max_rows=4)
    engine.isolate_at_step = 1
    ids = new_jobs(ctx, ["one", "two", "three"])
    run(ctx, [ids])
    # The step failed with all its rows: the culprit is unknown, so each is rerun by itself.
    assert runner_of(ctx).calls == [[ids[0]], [ids[1]], [ids[2]]]
    assert outputs(ctx, ids) == ["run: one", "run: two", "run: three"]


class Share:
    """A `FairShare` whose looks find `found` in turn (then nothing)."""

    def __init__(self, *found: list[str]) -> None:
        self.found = list(found)

    def due(self) -> list[str]:
        return self.found.pop(0) if self.found else []


def test_other_tenants_jobs_jump_the_engines_waiting_line(worker: Worker) -> None:
    ctx, engine = worker(max_rows=1, batch_max_jobs=1)
    a, b, c = new_jobs(ctx, ["a", "b", "c"], tenant="big")
    (x,) = new_jobs(ctx, ["x"], tenant="small")
    batch = run(ctx, [[a, b], [c]], share=Share([], [x]))
    # Found while `b` waited: ahead of it in the engine's queue.
    assert [keys for keys, first, _ in engine.submits if first] == [[x]]
    assert batch.recorded == [[a], [x], [b], [c]]
    assert statuses(ctx, [a, b, c, x]) == ["succeeded"] * 4


def test_a_raise_drops_the_engines_rows_and_lets_their_claims_go(worker: Worker) -> None:
    ctx, engine = worker(max_rows=2, batch_max_jobs=1)
    engine.fail_at_step = 3
    ids = new_jobs(ctx, ["one", "two", "three", "four"])
    with pytest.raises(RuntimeError, match="the engine loop broke"):
        run(ctx, [ids[:2], ids[2:]])
    # Two finished and were recorded; the third was decoding and the fourth waiting: dropped from
    # the engine (a next micro-batch starts from an empty one) and left `running`, unrenewed, for
    # the reconciler to rerun once their leases run out.
    assert sorted(engine.abandoned) == sorted(ids[2:]) and not engine.has_work()
    assert statuses(ctx, ids) == ["succeeded", "succeeded", "running", "running"]
    assert ctx.claims == {}
