"""Loading a worker's checkpoint at start: retried with capped exponential backoff, one log line an
attempt (never a traceback), and after `YUE2_WORKER_LOAD_ATTEMPTS` the worker stays down.

A down worker consumes nothing. Its process stays up, so the launcher does not restart it into the
same failure; its row in `worker_processes` keeps reporting, with `load_error` saying why, so
`/healthz` names the variant as degraded while its jobs wait and the status row tells the
operator what to fix. It tries again, once, whenever the registry's active version of its variant
changes (a rollback or a good publish is the fix), and exits cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from sqlalchemy.orm import Session, sessionmaker

from workers.protocol import Runner

log = logging.getLogger("yue2.worker")
DOWN_CHECK_S = 10.0  # how often a down worker looks for a new active version


def one_line(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


# What `load_active` gives: the registry's active version (None: the starting directory) and a
# function that loads it.
LoadActive = Callable[[], tuple[str | None, Callable[[], Runner]]]


@dataclass
class LoadState:
    """What the status row says while the worker loads or is down (read by the report thread)."""

    error: str | None = None
    version: str | None = None  # the version the last attempt tried
    down: bool = False
    stop: threading.Event = field(default_factory=threading.Event)


def _attempt(load_active: LoadActive, state: LoadState) -> Runner | None:
    """One try: read the active version, load it. The error, one line, stays in `state`."""
    try:
        state.version, load = load_active()
        runner = load()
    except Exception as exc:  # any failure to load is this worker's, reported the same way
        state.error = one_line(exc)
        return None
    state.error = None
    return runner


def load_with_backoff(load_active: LoadActive, *, what: str, attempts: int, backoff_s: float, cap_s: float,
                      state: LoadState) -> Runner | None:
    """The active version loaded, tried up to `attempts` times with waits of backoff_s, 2 x
    backoff_s, ... (at most cap_s); None when every attempt failed or a stop was asked for."""
    for attempt in range(1, attempts + 1):
        runner = _attempt(load_active, state)
        if runner is not None:
            return runner
        if attempt == attempts:
            log.error("cannot load %s (attempt %d of %d): %s; staying down until its active version changes "
                      "(e.g. `yue2 checkpoints rollback`) or the worker is restarted", what, attempt, attempts,
                      state.error)
            break
        wait = min(cap_s, backoff_s * 2 ** (attempt - 1))
        log.error("cannot load %s (attempt %d of %d): %s; retrying in %.1fs", what, attempt, attempts, state.error,
                  wait)
        if state.stop.wait(wait):
            return None
    return None


def stay_down(load_active: LoadActive, *, what: str, state: LoadState, check_s: float = DOWN_CHECK_S) -> Runner | None:
    """Wait, serving nothing, until the registry's active version is another than the one that
    failed (then try it once; the runner when it loads) or a stop is asked for (None)."""
    state.down = True
    failed = state.version
    while not state.stop.wait(check_s):
        try:
            version, _ = load_active()
        except Exception as exc:  # the registry unreachable: look again later
            log.warning("%s: cannot read the active version: %s", what, one_line(exc))
            continue
        if version == failed:
            continue
        runner = _attempt(load_active, state)
        if runner is not None:
            state.down = False
            return runner
        failed = state.version
        log.error("cannot load %s (active version %s): %s; staying down", what, failed, state.error)
    return None


def stop_on_signals(state: LoadState) -> Callable[[], None]:
    """SIGTERM and SIGINT end the loading or the down wait; returns what puts the old handlers back
    (Celery installs its own when the worker starts)."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: FrameType | None) -> None:
        state.stop.set()

    for sig in previous:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def report_while_loading(sessions: sessionmaker[Session], *, name: str, variant: str,
                         state: LoadState) -> Callable[[], None]:
    """One refresh of the status row while the worker loads or is down (a runtime duty until it
    serves; the serving worker's status report takes over)."""
    from workers.status_row import report_down

    def report() -> None:
        with sessions() as session:
            report_down(session, name=name, variant=variant, error=state.error)

    return report
