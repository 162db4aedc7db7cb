"""Retrying through an outage (`yue2_jobs.core.retry`): which errors are outages, and the bounded
exponential backoff every worker read and write goes through."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError

from yue2_jobs.core import retry
from yue2_jobs.core.retry import retrying, transient
from yue2_jobs.errors import InvalidRequestError, ServiceUnavailableError, StorageError, StorageUnavailableError


def test_transient_errors_are_outages_and_others_are_not() -> None:
    assert transient(StorageUnavailableError("x"))
    assert transient(OperationalError("SELECT 1", {}, Exception("server closed the connection")))
    assert not transient(StorageError("access denied"))
    assert not transient(ValueError("bad input"))


def test_a_lost_connection_is_an_outage_and_a_refused_statement_is_not() -> None:
    assert transient(ServiceUnavailableError("the database is restarting"))
    assert transient(InterfaceError("SELECT 1", {}, Exception("connection already closed")))
    assert transient(DBAPIError("SELECT 1", {}, Exception("ssl eof"), connection_invalidated=True))
    # Said by the database about the statement itself: retrying cannot help.
    assert not transient(DBAPIError("SELECT 1", {}, Exception("syntax error")))
    assert not transient(IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not transient(InvalidRequestError("input is empty", field="input"))


def raiser(exc: Exception) -> Any:
    def fn() -> None:
        raise exc

    return fn


def test_retrying_backs_off_until_success_or_the_deadline() -> None:
    calls = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise StorageUnavailableError("down")
        return "ok"

    assert retrying(flaky, deadline=time.monotonic() + 10, what="t", first_delay_s=0.01) == "ok"
    assert len(calls) == 3 and calls[2] - calls[1] >= calls[1] - calls[0]  # the delay doubles
    with pytest.raises(StorageUnavailableError):  # still down at the deadline: the last error
        retrying(raiser(StorageUnavailableError("down")), deadline=time.monotonic() + 0.05, what="t",
                 first_delay_s=0.01)
    permanent: list[int] = []

    def bad_input() -> None:
        permanent.append(1)
        raise ValueError("bad")

    with pytest.raises(ValueError):
        retrying(bad_input, deadline=time.monotonic() + 10, what="t")
    assert permanent == [1]  # not retried


class Clock:
    """The retry module's `time`: `sleep` records the wait and moves this clock on, nothing is slept."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(retry, "time", fake)  # this module's name only: nothing else's clock changes
    return fake


def test_the_delay_doubles_up_to_its_cap_and_on_retry_runs_before_each_retry(clock: Clock) -> None:
    events: list[str] = []

    def down_five_times() -> str:
        events.append("call")
        if events.count("call") <= 5:
            raise StorageUnavailableError("down")
        return "ok"

    result = retrying(down_five_times, deadline=clock.now + 60, what="t", first_delay_s=0.5, max_delay_s=3.0,
                      on_retry=lambda: events.append("rollback"))
    assert result == "ok"
    assert clock.waits == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert events == ["call"] + ["rollback", "call"] * 5  # a rollback between two tries, none after the last


def test_a_wait_that_would_pass_the_deadline_is_not_started(clock: Clock) -> None:
    calls: list[float] = []

    def down() -> None:
        calls.append(clock.now)
        raise StorageUnavailableError("down")

    with pytest.raises(StorageUnavailableError):
        retrying(down, deadline=clock.now + 1.0, what="t", first_delay_s=0.4)
    # Tried at 0 s and 0.4 s; a wait of 0.8 s more would end at 1.2 s, past the deadline: raised instead.
    assert clock.waits == [0.4] and calls == [0.0, 0.4]
