"""The fair-share claim order (`jobs.fair_share`) on a migrated SQLite database: who a busy worker
starts ahead of its micro-batch, and in what order. The Postgres query (a loose index scan) is
exercised by tests/pipeline/test_fair_share.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.db.migrate import upgrade_head
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import session_factory, utcnow
from yue2_jobs.jobs import service
from yue2_jobs.jobs.fair_share import interleave, jobs_to_share, queued_tenants
from yue2_jobs.jobs.state import claim_jobs
from yue2_jobs.storage import LocalStorage


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[Session, Settings, LocalStorage]]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_head(url)
    with session_factory(url)() as session:
        yield session, Settings(home=tmp_path), LocalStorage(tmp_path / "storage")


def add(db: tuple[Session, Settings, LocalStorage], tenant: str, n: int, variant: str = "base") -> list[str]:
    session, settings, storage = db
    ids = [service.create_job(session, tenant=tenant, body={"input": f"{tenant} {i}", "variant": variant},
                              settings=settings, storage=storage).id for i in range(n)]
    # created_at in the order made, whatever the clock's resolution
    for i, job_id in enumerate(ids):
        session.execute(update(Job).where(Job.id == job_id).values(created_at=utcnow() + timedelta(seconds=i)))
    session.commit()
    return ids


def test_interleave_takes_tenants_in_turn_each_in_order() -> None:
    pairs = [("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("a4", "A"), ("c1", "C"), ("b2", "B")]
    assert interleave(pairs) == ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]
    assert interleave([]) == []


def test_a_tenant_not_served_gets_its_oldest_jobs_up_to_its_share(db: tuple[Session, Settings, LocalStorage]) -> None:
    session = db[0]
    add(db, "A", 10)
    b = add(db, "B", 5)
    c = add(db, "C", 1)
    add(db, "D", 2, variant="legal")  # another variant's queue is another worker's
    assert queued_tenants(session, variant="base") == ["A", "B", "C"]
    # The worker serves A: B's and C's oldest, one each per round; D waits for a legal worker.
    assert jobs_to_share(session, variant="base", serving={"A"}, share=3, limit=8) == [b[0], c[0], b[1], b[2]]
    # B with 2 running anywhere has room for 1 more: its next-oldest queued job, now younger than C's.
    claim_jobs(session, job_ids=b[:2], worker="elsewhere", lease_s=60, max_attempts=3)
    assert jobs_to_share(session, variant="base", serving={"A"}, share=3, limit=8) == [c[0], b[2]]
    # At its share it gets nothing more; a served tenant is never taken from the queue.
    claim_jobs(session, job_ids=[b[2]], worker="elsewhere", lease_s=60, max_attempts=3)
    assert jobs_to_share(session, variant="base", serving={"A", "C"}, share=3, limit=8) == []
    assert jobs_to_share(session, variant="base", serving={"A"}, share=0, limit=8) == []


def test_the_longest_waiting_tenant_goes_first_within_the_limit(db: tuple[Session, Settings, LocalStorage]) -> None:
    session = db[0]
    late = add(db, "aaa-late", 3)
    early = add(db, "zzz-early", 3)
    for i, job_id in enumerate(early):
        at = utcnow() - timedelta(hours=1) + timedelta(seconds=i)
        session.execute(update(Job).where(Job.id == job_id).values(created_at=at))
    session.commit()
    # However many wait, a worker gives them only `limit` rows: its own micro-batch keeps the rest.
    assert jobs_to_share(session, variant="base", serving={"A"}, share=8, limit=3) == [early[0], late[0], early[1]]
    assert jobs_to_share(session, variant="base", serving={"A"}, share=8, limit=0) == []


def test_a_job_that_was_started_before_is_left_to_its_message(db: tuple[Session, Settings, LocalStorage]) -> None:
    session = db[0]
    b = add(db, "B", 2)
    # A job that killed a worker runs alone, from its own message, never in someone's row set.
    session.execute(update(Job).where(Job.id == b[0]).values(attempts=1))
    session.commit()
    assert jobs_to_share(session, variant="base", serving={"A"}, share=8, limit=8) == [b[1]]
