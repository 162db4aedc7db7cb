"""`LeaderLock` on the real Postgres: one holder at a time, named in pg_stat_activity; the lock
passes on when the holder lets go or its session ends (as the server ends the session of a host
that was cut off), and a holder whose session ended knows it lost the lock."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from tests.pipeline.conftest import PG_ADMIN_URL, service_unavailable, wait_for
from yue2_jobs.db.leader import LeaderLock, lock_holder
from yue2_jobs.db.session import session_factory

pytestmark = pytest.mark.slow  # a real server


@pytest.fixture
def key() -> Iterator[int]:
    from sqlalchemy import create_engine

    try:
        create_engine(PG_ADMIN_URL).connect().close()
    except Exception as exc:
        service_unavailable("Postgres at 127.0.0.1:5432", exc)
    yield random.randrange(1, 2**31)  # not a key the pipeline uses: tests beside this one run workers


def _holder(key: int) -> str | None:
    with session_factory(PG_ADMIN_URL)() as session:
        return lock_holder(session, key=key, role="test")


def test_one_holder_at_a_time_and_the_lock_passes_on(key: int) -> None:
    a = LeaderLock(PG_ADMIN_URL, key=key, role="test", node="a@host-a")
    b = LeaderLock(PG_ADMIN_URL, key=key, role="test", node="b@host-b")
    try:
        assert _holder(key) is None
        assert a.held() and not b.held()
        assert a.held() and not b.held()  # asked again: still one holder (the lock is not taken twice)
        assert _holder(key) == "a@host-a"
        a.release()
        assert b.held() and not a.held()
        assert _holder(key) == "b@host-b"
    finally:
        a.release()
        b.release()
    assert _holder(key) is None


def test_a_holder_whose_session_the_server_ended_has_lost_the_lock(key: int) -> None:
    a = LeaderLock(PG_ADMIN_URL, key=key, role="test", node="a@host-a")
    b = LeaderLock(PG_ADMIN_URL, key=key, role="test", node="b@host-b")
    try:
        assert a.held()
        assert a.conn is not None
        backend = a.conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with session_factory(PG_ADMIN_URL)() as session:  # what the server does when keepalives go unanswered
            assert session.execute(text("SELECT pg_terminate_backend(:p)"), {"p": backend}).scalar()
        wait_for(b.held, timeout=10, what="the lock to pass on once the holder's backend has exited")
        assert not a.held()  # its connection is gone, and so is its claim
        assert _holder(key) == "b@host-b"
    finally:
        a.release()
        b.release()
