"""The watchdog's converge step against worker status rows (SQLite; remote control recorded, not sent)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import update

from tests.checkpoints.garbage import retrained_drafter
from tests.checkpoints.test_registry import ROOT, copy_of, publish, validate
from yue2_jobs.checkpoints import registry
from yue2_jobs.checkpoints.watchdog import converge, live_workers
from yue2_jobs.db.models import CheckpointState, WorkerProcess
from yue2_jobs.db.session import utcnow
from yue2_jobs.jobs.capacity import STARTING

LEGAL = ROOT / "checkpoints" / "legal"


class RecordingControl:
    """Stands in for `app.control`: records each swap command; `on_swap` plays the worker's part."""

    def __init__(self, session: Any, on_swap: Any = None) -> None:
        self.session, self.on_swap, self.sent = session, on_swap, []
        self.control = self

    def broadcast(self, command: str, *, arguments: dict[str, Any], destination: list[str], **_: Any) -> None:
        self.sent.append((command, destination[0], arguments["version"]))
        if self.on_swap:
            self.on_swap(destination[0], arguments["version"])


def worker_row(session: Any, name: str, checkpoint: str, *, age_s: float = 0.0) -> None:
    session.add(WorkerProcess(name=name, variant="legal", checkpoint=checkpoint, pid=1,
                              heartbeat_at=utcnow() - timedelta(seconds=age_s)))
    session.commit()


def test_converge_swaps_live_workers_one_by_one_and_skips_gone_ones(env: Any, tmp_path: Path) -> None:
    session = env[0]
    row = publish(env, copy_of("legal", tmp_path / "v1"))
    assert validate(env, row) is not None
    registry.activate(session, row)
    worker_row(session, "gpu0@a", "legal@old")
    worker_row(session, "gpu1@a", "legal@old")
    worker_row(session, "gpu0@gone", "legal@old", age_s=120)  # stopped reporting two minutes ago
    worker_row(session, "gpu2@b", f"legal@{STARTING}")  # its model is loading: it loads the active version
    assert [w.name for w in live_workers(session, "legal")] == ["gpu0@a", "gpu1@a", "gpu2@b"]

    def serve(name: str, version: str) -> None:  # the worker swaps and reports at once
        session.execute(update(WorkerProcess).where(WorkerProcess.name == name)
                        .values(checkpoint=f"legal@{version}", swap_version=version, swap_state="serving"))
        session.commit()

    app = RecordingControl(session, serve)
    assert converge(session, app, variant="legal", swap_timeout_s=5) == ["gpu0@a", "gpu1@a"]
    assert [d for _, d, _ in app.sent] == ["gpu0@a", "gpu1@a"]
    assert converge(session, app, variant="legal", swap_timeout_s=5) == []  # converged: nothing sent
    assert len(app.sent) == 2

    # A worker that dies while it is asked to swap is skipped; the version stays active.
    worker_row(session, "gpu2@a", "legal@old")

    def die(name: str, version: str) -> None:
        session.execute(update(WorkerProcess).where(WorkerProcess.name == name)
                        .values(heartbeat_at=utcnow() - timedelta(seconds=120)))
        session.commit()

    assert converge(session, RecordingControl(session, die), variant="legal", swap_timeout_s=5) == []
    session.refresh(row)
    assert row.state == CheckpointState.ACTIVE


def test_a_failed_load_marks_the_version_failed_and_reactivates_the_previous(env: Any, tmp_path: Path) -> None:
    session = env[0]
    first = publish(env, copy_of("legal", tmp_path / "v1"))
    assert validate(env, first) is not None
    registry.activate(session, first)
    second = publish(env, retrained_drafter(tmp_path / "v2", LEGAL))
    assert validate(env, second) is not None
    registry.activate(session, second)
    worker_row(session, "gpu0@a", f"legal@{first.version}")

    def fail(name: str, version: str) -> None:
        session.execute(update(WorkerProcess).where(WorkerProcess.name == name)
                        .values(swap_version=version, swap_state="failed", swap_error="CUDA out of memory"))
        session.commit()

    assert converge(session, RecordingControl(session, fail), variant="legal", swap_timeout_s=5) == []
    session.refresh(second)
    assert second.state == CheckpointState.FAILED and "CUDA out of memory" in second.error
    assert registry.active(session, "legal").version == first.version
