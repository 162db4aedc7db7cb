"""The revocation listener's log: one warning per outage of its Redis, not one per retry."""

from __future__ import annotations

import logging

import pytest

from yue2_jobs.api.revocations import OutageLog


def warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if r.levelno == logging.WARNING and "revocation listener" in r.message)


def test_an_outage_warns_once_and_a_new_outage_warns_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="yue2_jobs.api.revocations")
    outages = OutageLog()
    for _ in range(5):  # Redis refuses every retry: one outage
        outages.failed(ConnectionError("refused"), was_listening=False)
    assert warnings(caplog) == 1
    assert sum(1 for r in caplog.records if r.levelno == logging.DEBUG) == 4
    outages.failed(ConnectionError("reset"), was_listening=True)  # it came back, then broke again
    outages.failed(ConnectionError("refused"), was_listening=False)
    assert warnings(caplog) == 2
