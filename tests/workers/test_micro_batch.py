"""One micro-batch's bookkeeping (`workers.micro_batch.MicroBatch`), no servers: claims held by
the heartbeat until recorded, recordings on the recorder thread and waited for, every claim let go
however the block is left (a crash never loses a job: its lease runs out and it reruns), and the
batches its jobs belong to finalized (SQLite, a local directory, a runner without a model)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from sqlalchemy import select

from tests.workers.fakes import (
    EchoRunner,
    batch_row,
    expire_last_attempt,
    file_lines,
    new_batch,
    new_jobs,
    outputs,
    statuses,
)
from workers.context import WorkerContext
from workers.job_io import JobInput
from workers.micro_batch import MicroBatch
from workers.record import load_inputs
from yue2_jobs.db.models import BatchStatus, Job
from yue2_jobs.jobs.state import ClaimedJob


@pytest.fixture
def ctx(worker_context: Callable[..., WorkerContext]) -> WorkerContext:
    return worker_context(EchoRunner())


def inputs_of(rows: list[ClaimedJob]) -> list[JobInput]:
    return [JobInput.of(id=r.id, kind=r.kind, text=r.input_text or "", params=r.params) for r in rows]


def run_and_record(ctx: WorkerContext, batch: MicroBatch, rows: list[ClaimedJob]) -> None:
    inputs, failed, _ = load_inputs(ctx, rows)
    batch.record(ctx.runner, rows=rows, inputs=inputs, outputs=ctx.runner.run(inputs), failed=failed)


def test_claims_are_held_until_recorded_and_a_second_claim_gets_none(ctx: WorkerContext) -> None:
    ids = new_jobs(ctx, ["one", "two", "three"])
    with ctx.sessions() as session, MicroBatch(ctx, session) as batch:
        rows = batch.claim([*ids, "job_does_not_exist"])
        assert sorted(r.id for r in rows) == sorted(ids)
        assert ctx.claims.keys() == set(ids) == batch.claimed  # the heartbeat renews them from now on
        with ctx.sessions() as other_session, MicroBatch(ctx, other_session) as other:
            assert other.claim(ids) == []  # a redelivered message finds them held
        run_and_record(ctx, batch, rows)
    assert statuses(ctx, ids) == ["succeeded"] * 3
    assert outputs(ctx, ids) == ["run: one", "run: two", "run: three"]
    assert ctx.claims == {}


def test_recording_runs_on_the_recorder_thread_and_wait_waits_for_it(ctx: WorkerContext) -> None:
    ids = new_jobs(ctx, ["one", "two"])
    gate = threading.Event()
    ctx.recorder.submit(gate.wait, 10)  # the recorder thread is busy until the gate opens
    with ctx.sessions() as session, MicroBatch(ctx, session) as batch:
        rows = batch.claim(ids)
        run_and_record(ctx, batch, rows)
        # `record` handed the work over and returned: nothing is recorded, the claims are still held.
        assert statuses(ctx, ids) == ["running"] * 2 and ctx.claims.keys() == set(ids)
        gate.set()
        batch.wait()
        assert statuses(ctx, ids) == ["succeeded"] * 2 and ctx.claims == {}


def test_leaving_on_an_exception_waits_for_recordings_and_gives_the_rest_back(ctx: WorkerContext) -> None:
    ids = new_jobs(ctx, ["one", "two", "three"])
    with pytest.raises(RuntimeError, match="decoder crashed"), ctx.sessions() as session, \
            MicroBatch(ctx, session) as batch:
        rows = batch.claim(ids)
        run_and_record(ctx, batch, rows[:1])
        raise RuntimeError("decoder crashed")
    # The first was recorded before the block was left; the others are neither done nor failed:
    # no longer renewed, their leases run out and the reconciler reruns them.
    assert statuses(ctx, ids) == ["succeeded", "running", "running"]
    assert ctx.claims == {}


def test_a_recording_that_fails_is_raised_on_leaving_and_every_claim_is_let_go(ctx: WorkerContext) -> None:
    ids = new_jobs(ctx, ["one", "two"])
    with pytest.raises(ValueError), ctx.sessions() as session, MicroBatch(ctx, session) as batch:
        rows = batch.claim(ids)
        inputs = inputs_of(rows[:1])
        # One input, no output: `record` raises on the recorder thread, and `wait` raises it here.
        batch.record(ctx.runner, rows=rows[:1], inputs=inputs, outputs=[], failed=[])
    assert statuses(ctx, ids) == ["running", "running"]
    assert ctx.claims == {}  # the unrecorded second job's claim too


def test_a_batch_is_finalized_once_its_last_jobs_are_recorded(ctx: WorkerContext) -> None:
    batch_id, ids = new_batch(ctx, ["a", "b"])
    with ctx.sessions() as session, MicroBatch(ctx, session) as batch:
        run_and_record(ctx, batch, batch.claim(ids))
        batch.wait()
        # Finalized on the recorder thread right after the recording, before the micro-batch ends
        # (another tenant's small batch need not wait for the rest of it).
        done = batch_row(ctx, batch_id)
        assert done.status == BatchStatus.COMPLETED and done.output_file_id is not None
    batch.finish()  # and once only
    assert sorted(line["custom_id"] for line in file_lines(ctx, done.output_file_id)) == ["a", "b"]
    assert batch_row(ctx, batch_id).output_file_id == done.output_file_id


def test_a_job_out_of_attempts_fails_at_its_claim_and_its_batch_is_finalized(ctx: WorkerContext) -> None:
    batch_id, ids = new_batch(ctx, ["poison"])
    expire_last_attempt(ctx, ids[0])
    with ctx.sessions() as session, MicroBatch(ctx, session) as batch:
        assert batch.claim(ids) == []
    assert batch_row(ctx, batch_id).status == BatchStatus.IN_PROGRESS  # nothing recorded, nothing finalized early
    batch.finish()
    with ctx.sessions() as session:
        error = session.execute(select(Job.error).where(Job.id == ids[0])).scalar_one()
    assert statuses(ctx, ids) == ["failed"] and error["code"] == "max_attempts_exceeded"
    done = batch_row(ctx, batch_id)
    assert done.status == BatchStatus.COMPLETED and done.error_file_id is not None
    assert [line["custom_id"] for line in file_lines(ctx, done.error_file_id)] == ["poison"]
