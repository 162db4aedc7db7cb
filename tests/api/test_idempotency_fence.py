"""The Idempotency-Key fence on SQLite (`api.idempotency`): the key names the route's own kind of
resource in the commit that creates it, and a failure after that commit keeps the key for a retry
to take over at once, while a failure before it frees the key. Postgres, the owner's lock and the
takeover over HTTP are tested in tests/pipeline/test_idempotency_takeover.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.api.idempotency import Fence, Owner, run_once
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


def keyed(sessions: sessionmaker[Session], route: Session, tenant: str, action: Any, resume: Any) -> Any:
    url = str(route.get_bind().url)
    return asyncio.run(run_once(sessions, route, owner=Owner(url), kind="job", tenant=tenant, key="k",
                                fingerprint_of=lambda: "fp", status=201, action=action, resume=resume))


def test_a_failure_after_the_commit_keeps_the_key_for_its_retry(sessions: sessionmaker[Session],
                                                                 tmp_path: Path) -> None:
    storage, settings = LocalStorage(tmp_path), Settings(home=tmp_path)
    made: list[str] = []

    def fails_after_commit() -> dict[str, Any]:
        made.append(service.create_job(route, tenant="t2", body=BODY, settings=settings, storage=storage).id)
        raise RuntimeError("the response could not be built")

    def never() -> dict[str, Any]:
        raise AssertionError("the retry ran the request again")

    with sessions() as route, pytest.raises(RuntimeError):
        keyed(sessions, route, "t2", fails_after_commit, lambda job_id: {"id": job_id})
    row = key_row(sessions, "t2")
    assert row is not None and row.resource == f"job:{made[0]}" and row.owner is None
    with sessions() as route:  # the retry takes the key over at once and answers the committed job
        answer = keyed(sessions, route, "t2", never, lambda job_id: {"id": job_id})
    assert answer.status_code == 201 and answer.headers["idempotent-replayed"] == "true"
    assert answer.body == b'{"id":"' + made[0].encode() + b'"}'


def test_a_failure_before_the_commit_frees_the_key(sessions: sessionmaker[Session]) -> None:
    def refused() -> dict[str, Any]:
        raise ValueError("refused before anything was created")

    with sessions() as route, pytest.raises(ValueError):
        keyed(sessions, route, "t3", refused, lambda job_id: {})
    assert key_row(sessions, "t3") is None  # its retry runs afresh
