"""Retrying through an outage: which errors are transient, and a bounded exponential backoff.

A transient error is one that says nothing about the job (the database restarted, storage is
unreachable or throttling); retrying it later can succeed. Anything else is permanent and is
raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from yue2_jobs.errors import Yue2Error

T = TypeVar("T")
log = logging.getLogger(__name__)


def transient(exc: BaseException) -> bool:
    """Whether `exc` is an outage (retry later) rather than something wrong with the work itself."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    if isinstance(exc, Yue2Error):
        return exc.retryable
    if isinstance(exc, OperationalError | InterfaceError):
        return True  # connection refused or lost, admin shutdown, deadlock, serialization failure
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def retrying(fn: Callable[[], T], *, deadline: float, what: str, first_delay_s: float = 0.2,
             max_delay_s: float = 5.0, on_retry: Callable[[], object] | None = None) -> T:
    """`fn()`, retried with exponential backoff while it fails transiently and `deadline`
    (a `time.monotonic()` instant, the same in every process of the host) is not reached; the
    last error is raised then. `on_retry` runs before each retry (a session rollback, say)."""
    delay = first_delay_s
    while True:
        try:
            return fn()
        except Exception as exc:
            if not transient(exc) or time.monotonic() + delay > deadline:
                raise
            first_line = (str(exc).splitlines() or [""])[0][:200]
            log.warning("%s: %s: %s; retrying in %.1fs", what, type(exc).__name__, first_line, delay)
        time.sleep(delay)  # backoff between attempts: the outage, not a condition, is what we wait out
        delay = min(delay * 2, max_delay_s)
        if on_retry is not None:
            on_retry()
