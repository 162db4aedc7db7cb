"""Outages met by a worker's recording and by finalization (SQLite and a local directory, fast): a
transient failure is retried, never turned into a failed job; past the deadline the jobs are given
back to the reconciler; a finalization that fails is handed back at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tests.pipeline.echo_runner import EchoRunner
from workers.context import WorkerContext
from workers.job_io import JobInput, JobOutput
from workers.record import load_inputs, record
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Batch, BatchStatus, Job, JobStatus
from yue2_jobs.errors import StorageUnavailableError
from yue2_jobs.jobs import files, service
from yue2_jobs.jobs.batches import try_finalize
from yue2_jobs.jobs.state import claim_jobs
from yue2_jobs.storage import LocalStorage


class FlakyStorage(LocalStorage):
    """A local directory that is unreachable for its first `down` calls of each kind."""

    def __init__(self, root: Path, *, down: int) -> None:
        super().__init__(root)
        self.down = {"put": down, "get": down}

    def _maybe_down(self, kind: str) -> None:
        if self.down[kind] > 0:
            self.down[kind] -= 1
            raise StorageUnavailableError("storage unreachable (test outage)")

    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> None:
        self._maybe_down("put")
        super().put(key, data, content_type=content_type)

    def put_stream(self, key: str, stream: Any, *, content_type: str = "application/json") -> None:
        self._maybe_down("put")
        super().put_stream(key, stream, content_type=content_type)

    def get(self, key: str) -> bytes:
        self._maybe_down("get")
        return super().get(key)

    def open(self, key: str) -> Any:
        self._maybe_down("get")
        return super().open(key)


@pytest.fixture
def pipeline(tmp_path: Path, sessions: sessionmaker[Session]) -> Any:
    """Settings and the module's database (each test reads and changes only its own jobs and batch)."""
    settings = Settings(home=tmp_path, inline_input_bytes=64, outage_retry_s=5)
    return settings, sessions


def _ctx(settings: Settings, sessions: Any, storage: LocalStorage) -> WorkerContext:
    return WorkerContext(settings=settings, sessions=sessions, storage=storage,
                         runner=EchoRunner(variant="base", settings=settings), name="w")


def _claimed(settings: Settings, sessions: Any, storage: LocalStorage, texts: list[str]) -> tuple[Any, list[Any]]:
    with sessions() as session:
        ids = [service.create_job(session, tenant="t", body={"input": t}, settings=settings, storage=storage).id
               for t in texts]
        rows, _ = claim_jobs(session, job_ids=ids, worker="w", lease_s=60, max_attempts=3)
    return ids, rows


def test_an_upload_outage_is_retried_and_never_fails_the_job(pipeline: Any, tmp_path: Path) -> None:
    settings, sessions = pipeline
    storage = FlakyStorage(tmp_path / "s", down=0)
    ctx = _ctx(settings, sessions, storage)
    ids, rows = _claimed(settings, sessions, storage, ["one two three", "four five six"])
    ctx.hold(rows)
    storage.down["put"] = 4  # the next four PUTs find storage unreachable
    inputs = [JobInput.of(id=r.id, kind=r.kind, text=r.input_text, params=r.params) for r in rows]
    outputs = ctx.runner.run(inputs)
    record(ctx, ctx.runner, rows, inputs, outputs, [])
    with sessions() as session:
        assert [j.status for j in session.execute(select(Job).where(Job.id.in_(ids))).scalars()] == ["succeeded"] * 2
    assert ctx.claims == {}


def test_an_outage_past_the_deadline_gives_the_jobs_back(pipeline: Any, tmp_path: Path) -> None:
    settings, sessions = pipeline
    settings = settings.model_copy(update={"outage_retry_s": 0.3})
    storage = FlakyStorage(tmp_path / "s", down=0)
    ctx = _ctx(settings, sessions, storage)
    ids, rows = _claimed(settings, sessions, storage, ["one two three"])
    ctx.hold(rows)
    storage.down["put"] = 10_000  # down for good
    inputs = [JobInput.of(id=r.id, kind=r.kind, text=r.input_text, params=r.params) for r in rows]
    record(ctx, ctx.runner, rows, inputs, [JobOutput("x", 1, 1, 1, 0)], [])
    with sessions() as session:
        job = session.get_one(Job, ids[0])
    assert job.status == JobStatus.RUNNING and job.error is None  # not failed: its lease runs out, it reruns
    assert ctx.claims == {}  # the heartbeat no longer renews it


def test_an_input_read_outage_is_retried_then_given_back(pipeline: Any, tmp_path: Path) -> None:
    settings, sessions = pipeline
    storage = FlakyStorage(tmp_path / "s", down=0)
    ctx = _ctx(settings, sessions, storage)
    _, rows = _claimed(settings, sessions, storage, ["long input " * 20])  # over 64 bytes: stored, not inline
    ctx.hold(rows)
    storage.down["get"] = 2
    inputs, failed, given_back = load_inputs(ctx, rows)
    assert [i.text for i in inputs] == ["long input " * 20] and failed == [] and given_back == []
    short = ctx.settings.model_copy(update={"outage_retry_s": 0.2})
    ctx.settings = short
    storage.down["get"] = 10_000
    inputs, failed, given_back = load_inputs(ctx, rows)
    assert inputs == [] and failed == [] and [r.id for r in given_back] == [rows[0].id]
    assert ctx.claims == {}


def test_a_failed_finalization_is_handed_back_at_once(pipeline: Any, tmp_path: Path) -> None:
    settings, sessions = pipeline
    storage = FlakyStorage(tmp_path / "s", down=0)
    with sessions() as session:
        f = files.create_file(session, tenant="t", filename="in.jsonl", purpose="batch", storage=storage,
                                data=b'{"custom_id": "a", "body": {"input": "x"}}\n{"custom_id": "b", "body": {}}\n')
        batch, _ = service.create_batch(session, tenant="t", input_file_id=f.id, endpoint="/v1/summarize",
                                        completion_window="24h", metadata=None, settings=settings, storage=storage)
        service.cancel_batch(session, tenant="t", batch_id=batch.id)  # queued jobs end cancelled; nothing runs
        session.execute(Batch.__table__.update().where(Batch.id == batch.id).values(status=BatchStatus.IN_PROGRESS,
                                                                                    cancelling_at=None))
        session.commit()
        storage.down["put"] = 1
        with pytest.raises(StorageUnavailableError):
            try_finalize(session, batch_id=batch.id, storage=storage)
        session.expire_all()
        b = session.get_one(Batch, batch.id)
        assert (b.status, b.finalizing_at) == (BatchStatus.FINALIZING, None)  # free to redo, not stale
        assert try_finalize(session, batch_id=batch.id, storage=storage)
        session.expire_all()
        assert session.get_one(Batch, batch.id).status == BatchStatus.COMPLETED
