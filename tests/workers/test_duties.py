"""The serving worker's status report (workers/duties.py), without a broker: the watchdog's request
in the worker's row starts a swap, each step of it reaches the row at once, and the worker's
duties are the runtime's, stopped in one call."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from tests.sqlite_db import sessions  # noqa: F401 - fixture
from workers.context import WorkerContext
from workers.deliveries import HeldDeliveries
from workers.duties import add_duties, status_round
from workers.job_io import JobInput, JobOutput
from workers.status_row import claim_node_name
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import WorkerProcess
from yue2_jobs.storage import LocalStorage


class Versioned:
    """A runner that serves one version (it never runs a job here)."""

    variant, weights_sha256 = "base", None

    def __init__(self, version: str) -> None:
        self.checkpoint = f"base@{version}"

    def run(self, jobs: list[JobInput]) -> list[JobOutput | Exception]:
        return [JobOutput(text=j.text, input_tokens=1, output_tokens=1, decoder_steps=1, nar_tokens=0) for j in jobs]


def _ctx(tmp_path: Path, sessions: sessionmaker[Session], loads: list[str]) -> WorkerContext:  # noqa: F811
    def load(version: str) -> Versioned:
        loads.append(version)
        if version == "broken":
            raise OSError("checksum mismatch")
        return Versioned(version)

    ctx = WorkerContext(settings=Settings(home=tmp_path), sessions=sessions, storage=LocalStorage(tmp_path / "s"),
                        runner=Versioned("v0"), name="w-duties", load=load)
    with sessions() as session:
        claim_node_name(session, ctx.name, variant="base")
    return ctx


def _row(sessions: sessionmaker[Session], name: str) -> WorkerProcess:  # noqa: F811
    with sessions() as session:
        row = session.get(WorkerProcess, name)
        assert row is not None
        session.expunge(row)
        return row


def _ask(sessions: sessionmaker[Session], name: str, version: str) -> None:  # noqa: F811
    """What the watchdog does: the version, in the worker's row."""
    with sessions() as session:
        row = session.get(WorkerProcess, name)
        assert row is not None
        row.swap_request = version
        session.commit()


def _wait_for(ctx: WorkerContext, state: str) -> None:
    """Until the swap reaches `state`, woken by each step's report request."""
    while True:  # cleared before the state is read: a step between the two still wakes the wait
        ctx.report_now.clear()
        if ctx.swap.status().state == state:
            return
        assert ctx.report_now.wait(10)


def test_the_watchdogs_request_swaps_the_worker_and_each_step_reaches_the_row(
        tmp_path: Path, sessions: sessionmaker[Session]) -> None:  # noqa: F811
    loads: list[str] = []
    ctx = _ctx(tmp_path, sessions, loads)
    try:
        status_round(ctx, write=True)
        assert _row(sessions, ctx.name).checkpoint == "base@v0"
        _ask(sessions, ctx.name, "v1")
        status_round(ctx, write=False)  # a poll between two writes: it reads the request and starts the load
        assert ctx.report_now.wait(10)  # a step of the swap asks for a write at once
        _wait_for(ctx, "serving")
        status_round(ctx, write=True)
        row = _row(sessions, ctx.name)
        assert (row.checkpoint, row.swap_version, row.swap_state, row.swap_error) == ("base@v1", "v1", "serving", None)
        status_round(ctx, write=True)  # the request is still in the row: served, nothing is loaded again
        assert loads == ["v1"]

        _ask(sessions, ctx.name, "broken")
        status_round(ctx, write=False)
        _wait_for(ctx, "failed")
        status_round(ctx, write=True)
        row = _row(sessions, ctx.name)
        assert (row.checkpoint, row.swap_version, row.swap_state) == ("base@v1", "broken", "failed")
        assert row.swap_error == "OSError: checksum mismatch"  # the watchdog marks the version failed
        status_round(ctx, write=True)
        assert loads == ["v1", "broken"]  # a failed version is not retried in a loop
    finally:
        assert ctx.runtime.stop(10) == []


def test_a_worker_stops_every_duty_in_one_call(tmp_path: Path, sessions: sessionmaker[Session]) -> None:  # noqa: F811
    ctx = _ctx(tmp_path, sessions, [])
    add_duties(ctx, app=None, held=HeldDeliveries("filesystem://", ctx.name), reconcile=False)
    ctx.runtime.start()
    ours = {"lease-heartbeat", "status-report", "metrics-sampler", "held-deliveries"}
    assert ours <= set(ctx.runtime.names())
    assert ours <= {t.name for t in threading.enumerate()}
    assert ctx.runtime.stop(10) == []
    assert not ours & {t.name for t in threading.enumerate()}
