"""Job state changes (SQLite, fast): claims, leases, attempts, cancellation; status never moves backwards."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from tests.sqlite_db import sessions  # noqa: F401 - fixture
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job
from yue2_jobs.jobs import service
from yue2_jobs.jobs.state import cancel_jobs, claim_jobs, finish_jobs
from yue2_jobs.storage import LocalStorage


@pytest.fixture
def env(tmp_path: Path, sessions: sessionmaker[Session]) -> Any:  # noqa: F811
    """Four new queued jobs in the module's database (each test reads and changes only its own)."""
    settings = Settings(home=tmp_path, inline_input_bytes=64)
    storage = LocalStorage(tmp_path / "storage")
    session = sessions()
    jobs = [service.create_job(session, tenant="t", body={"input": f"text {i}"}, settings=settings, storage=storage)
            for i in range(4)]
    yield session, [j.id for j in jobs], settings, storage
    session.close()


def status(session: Any, job_id: str) -> tuple[str, int]:
    session.expire_all()
    job = session.get_one(Job, job_id)
    return job.status, job.attempts


def expire_leases(session: Any, job_ids: list[str]) -> None:
    """What the passage of `lease_s` does to a dead worker's claims, without waiting for it."""
    session.execute(update(Job).where(Job.id.in_(job_ids)).values(lease_expires_at=datetime(2000, 1, 1, tzinfo=UTC)))
    session.commit()


def done(row: Any) -> dict[str, Any]:
    return {"id": row.id, "claim_token": row.claim_token, "status": "succeeded", "output_key": "k",
            "output_text": "out"}


def test_claim_is_exclusive_while_the_lease_lives(env: Any) -> None:
    session, ids, *_ = env
    rows, exhausted = claim_jobs(session, job_ids=ids, worker="w1", lease_s=60, max_attempts=3)
    assert {r.id for r in rows} == set(ids) and exhausted == []
    again, _ = claim_jobs(session, job_ids=ids, worker="w2", lease_s=60, max_attempts=3)
    assert again == []  # a redelivered task finds nothing to do
    assert status(session, ids[0]) == ("running", 1)


def test_expired_lease_is_reclaimed_and_the_old_claim_cannot_finish(env: Any) -> None:
    session, ids, *_ = env
    (old,), _ = claim_jobs(session, job_ids=ids[:1], worker="w1", lease_s=60, max_attempts=3)
    expire_leases(session, ids[:1])  # the lease runs out: w1 is presumed dead
    (new,), _ = claim_jobs(session, job_ids=ids[:1], worker="w2", lease_s=60, max_attempts=3)
    assert new.attempts == 2 and new.claim_token != old.claim_token
    assert finish_jobs(session, [done(old)]) == 0  # the dead worker's late write is refused
    assert finish_jobs(session, [done(new)]) == 1
    assert status(session, ids[0]) == ("succeeded", 2)
    # finished is final: neither a claim nor a cancel moves it
    assert claim_jobs(session, job_ids=ids[:1], worker="w3", lease_s=60, max_attempts=3) == ([], [])
    assert cancel_jobs(session, where=Job.id == ids[0]) == 0
    assert status(session, ids[0]) == ("succeeded", 2)


def test_a_job_claimed_max_attempts_times_ends_failed(env: Any) -> None:
    session, ids, *_ = env
    for attempt in range(1, 3):
        (row,), _ = claim_jobs(session, job_ids=ids[:1], worker="w", lease_s=60, max_attempts=2)
        assert row.attempts == attempt
        expire_leases(session, ids[:1])
    rows, exhausted = claim_jobs(session, job_ids=ids[:1], worker="w", lease_s=60, max_attempts=2)
    assert rows == [] and exhausted == [ids[0]]
    session.expire_all()
    job = session.get_one(Job, ids[0])
    assert job.status == "failed" and job.error["code"] == "max_attempts_exceeded"


def test_a_fresh_claim_takes_only_what_has_attempts_left(env: Any) -> None:
    """`fresh`: the worker read the jobs as never started, so the claim is one statement; a job
    started since (by workers that died) up to its limit is left alone, and failed by a later,
    full claim."""
    session, ids, *_ = env
    for _ in range(2):
        claim_jobs(session, job_ids=ids[:1], worker="w", lease_s=60, max_attempts=2)
        expire_leases(session, ids[:1])
    rows, exhausted = claim_jobs(session, job_ids=ids[:2], worker="w", lease_s=60, max_attempts=2, fresh=True)
    assert [r.id for r in rows] == [ids[1]] and exhausted == []
    assert status(session, ids[0]) == ("running", 2)  # its lease lapsed: still claimable
    session.expunge_all()  # the ORM would compare SQLite's naive times with the claim's in Python
    assert claim_jobs(session, job_ids=ids[:1], worker="w", lease_s=60, max_attempts=2) == ([], [ids[0]])


def test_cancel_running_discards_the_result(env: Any) -> None:
    session, ids, *_ = env
    (row,), _ = claim_jobs(session, job_ids=ids[:1], worker="w", lease_s=60, max_attempts=3)
    assert cancel_jobs(session, where=Job.id == ids[0]) == 1
    assert finish_jobs(session, [done(row)]) == 0
    assert status(session, ids[0]) == ("cancelled", 1)
    assert claim_jobs(session, job_ids=ids[:1], worker="w", lease_s=60, max_attempts=3) == ([], [])


def test_large_inputs_go_to_storage(env: Any) -> None:
    session, _, settings, storage = env
    job = service.create_job(session, tenant="t", body={"input": "word " * 100}, settings=settings, storage=storage)
    assert job.input_text is None and storage.get(job.input_key).decode() == "word " * 100


def test_status_never_moves_backwards_by_any_update_path(env: Any) -> None:
    session, ids, *_ = env
    rows, _ = claim_jobs(session, job_ids=ids, worker="w", lease_s=60, max_attempts=3)
    finish_jobs(session, [done(r) for r in rows[:2]])
    cancel_jobs(session, where=Job.id.in_(ids))
    statuses = dict(session.execute(select(Job.id, Job.status)).all())
    assert [statuses[i] for i in ids] == ["succeeded", "succeeded", "cancelled", "cancelled"]
    session.execute(update(Job).values(lease_expires_at=None))
    session.commit()
    assert claim_jobs(session, job_ids=ids, worker="w", lease_s=60, max_attempts=3) == ([], [])
