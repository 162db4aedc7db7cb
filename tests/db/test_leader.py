"""`LeaderLock` on the real Postgres: one holder at a time, named in pg_stat_activity; the lock
passes on when the holder lets go or its session ends (as the server ends the session of a host
that was cut off), and a holder whose session ended knows it lost the lock. Each test takes its
locks in a database of its own (advisory locks are per database)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import text

from tests.pipeline.conftest import temporary_pg_database, wait_for
from yue2_jobs.db.leader import LeaderLock, lock_holder
from yue2_jobs.db.session import session_factory

pytestmark = pytest.mark.slow  # a real server


@dataclass(frozen=True)
class Lock:
    url: str  # a database of the test's own
    key: int


@pytest.fixture
def lock() -> Iterator[Lock]:
    with temporary_pg_database("yue2_leader") as url:  # skips locally, fails under CI=true, without Postgres
        yield Lock(url=url, key=random.randrange(1, 2**31))


def _holder(lock: Lock) -> str | None:
    with session_factory(lock.url)() as session:
        return lock_holder(session, key=lock.key, role="test")


def test_one_holder_at_a_time_and_the_lock_passes_on(lock: Lock) -> None:
    a = LeaderLock(lock.url, key=lock.key, role="test", node="a@host-a")
    b = LeaderLock(lock.url, key=lock.key, role="test", node="b@host-b")
    try:
        assert _holder(lock) is None
        assert a.held() and not b.held()
        assert a.held() and not b.held()  # asked again: still one holder (the lock is not taken twice)
        assert _holder(lock) == "a@host-a"
        a.release()
        assert b.held() and not a.held()
        assert _holder(lock) == "b@host-b"
    finally:
        a.release()
        b.release()
    assert _holder(lock) is None


def test_a_holder_whose_session_the_server_ended_has_lost_the_lock(lock: Lock) -> None:
    a = LeaderLock(lock.url, key=lock.key, role="test", node="a@host-a")
    b = LeaderLock(lock.url, key=lock.key, role="test", node="b@host-b")
    try:
        assert a.held()
        assert a.conn is not None
        backend = a.conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with session_factory(lock.url)() as session:  # what the server does when keepalives go unanswered
            assert session.execute(text("SELECT pg_terminate_backend(:p)"), {"p": backend}).scalar()
        wait_for(b.held, timeout=10, what="the lock to pass on once the holder's backend has exited")
        assert not a.held()  # its connection is gone, and so is its claim
        assert _holder(lock) == "b@host-b"
    finally:
        a.release()
        b.release()
