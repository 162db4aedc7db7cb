"""The Idempotency-Key fence on SQLite (`api.idempotency`): the key names the route's own kind of
resource in the commit that creates it, and a failure after that commit keeps the key for a retry
to take over at once, while a failure before it frees the key. Postgres, the owner's lock and the
takeover over HTTP are tested in tests/pipeline/test_idempotency_takeover.py."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.api.idempotency import Fence, _Dead, _look, _run_as_owner, _take_over
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models_api import IdempotencyKey
from yue2_jobs.db.session import utcnow
from yue2_jobs.jobs import files, service
from yue2_jobs.storage import LocalStorage

BODY = {"input": "a text"}


def running_key(sessions: sessionmaker[Session], tenant: str, claim: str = "mine") -> None:
    with sessions() as session:
        now = utcnow()
        session.add(IdempotencyKey(tenant=tenant, key="k", fingerprint="fp", state="running", created_at=now,
                                   locked_until=now + timedelta(minutes=10), expires_at=now + timedelta(hours=24),
                                   owner=None, claim=claim))
        session.commit()


def key_row(sessions: sessionmaker[Session], tenant: str) -> Any:
    with sessions() as session:
        return session.execute(select(IdempotencyKey).where(IdempotencyKey.tenant == tenant)).scalar_one_or_none()


def test_the_fence_names_only_the_routes_kind(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    running_key(sessions, "t1")
    storage, settings = LocalStorage(tmp_path), Settings(home=tmp_path)
    with sessions() as route, Fence(tenant="t1", key="k", claim="mine", kind="job").watching(route):
        # retry_failed commits its new input file before its batch: a file is not a job route's resource
        files.create_file(route, tenant="t1", filename="in.jsonl", purpose="batch", data=b"{}\n", storage=storage)
        assert key_row(sessions, "t1").resource is None
        job = service.create_job(route, tenant="t1", body=BODY, settings=settings, storage=storage)
    assert key_row(sessions, "t1").resource == f"job:{job.id}"


def test_a_failure_after_the_commit_keeps_the_key_for_a_takeover(sessions: sessionmaker[Session],
                                                                  tmp_path: Path) -> None:
    running_key(sessions, "t2")
    storage, settings = LocalStorage(tmp_path), Settings(home=tmp_path)
    made: list[str] = []

    def action() -> dict[str, Any]:
        made.append(service.create_job(route, tenant="t2", body=BODY, settings=settings, storage=storage).id)
        raise RuntimeError("the response could not be built")  # after the job's commit

    with sessions() as route, pytest.raises(RuntimeError):
        _run_as_owner(sessions, route, tenant="t2", key="k", claim="mine", kind="job", status=201, action=action)
    row = key_row(sessions, "t2")
    assert row is not None and row.resource == f"job:{made[0]}" and row.owner is None
    seen = _look(sessions, tenant="t2", key="k", fp="fp", check_owner=True)
    assert isinstance(seen, _Dead)  # the next retry takes it over at once ...
    assert _take_over(sessions, tenant="t2", key="k", dead=seen, owner=None, claim="retry") == (True, f"job:{made[0]}")


def test_a_failure_before_the_commit_frees_the_key(sessions: sessionmaker[Session]) -> None:
    running_key(sessions, "t3")

    def action() -> dict[str, Any]:
        raise ValueError("refused before anything was created")

    with sessions() as route, pytest.raises(ValueError):
        _run_as_owner(sessions, route, tenant="t3", key="k", claim="mine", kind="job", status=201, action=action)
    assert key_row(sessions, "t3") is None  # its retry runs afresh
