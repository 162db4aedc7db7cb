"""A worker's first load (workers/loading.py): capped exponential backoff, one line an attempt,
staying down until the active version changes, a stop that ends the waiting."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from workers.loading import LoadState, load_with_backoff, stay_down


class Registry:
    """Stands in for the registry and the loader: `active` is the active version; loading a version
    in `broken` raises."""

    def __init__(self, active: str | None, broken: set[str | None]) -> None:
        self.active, self.broken, self.tried = active, broken, []  # type: list[str | None]

    def load_active(self) -> tuple[str | None, Any]:
        version = self.active

        def load() -> str:
            self.tried.append(version)
            if version in self.broken:
                raise OSError(f"cannot read {version}\nsecond line")
            return f"runner {version}"

        return version, load


class Waits(threading.Event):
    """An event whose waits return at once and are recorded (no test sleeps through a backoff)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


def test_backoff_doubles_up_to_the_cap_with_one_line_an_attempt(caplog: pytest.LogCaptureFixture) -> None:
    reg, state = Registry("v1", {"v1"}), LoadState(stop=Waits())
    with caplog.at_level(logging.ERROR, logger="yue2.worker"):
        assert load_with_backoff(reg.load_active, what="variant 'x'", attempts=5, backoff_s=2.0, cap_s=5.0,
                                 state=state) is None
    assert state.stop.waits == [2.0, 4.0, 5.0, 5.0]  # type: ignore[attr-defined]
    assert len(caplog.records) == 5 and all(r.exc_info is None for r in caplog.records)  # no traceback
    assert "attempt 5 of 5" in caplog.records[-1].getMessage() and "staying down" in caplog.records[-1].getMessage()
    assert state.error == "OSError: cannot read v1 second line" and state.version == "v1"  # one line


def test_a_load_that_succeeds_clears_the_error() -> None:
    reg, state = Registry("v1", {"v1"}), LoadState(stop=Waits())

    def heal(timeout: float | None = None) -> bool:
        reg.broken.clear()  # fixed while the worker waits
        return False

    state.stop.wait = heal  # type: ignore[method-assign]
    assert load_with_backoff(reg.load_active, what="x", attempts=3, backoff_s=1, cap_s=1, state=state) == "runner v1"
    assert state.error is None and reg.tried == ["v1", "v1"]


def test_down_waits_for_another_active_version_and_loads_it() -> None:
    reg, state = Registry("v1", {"v1"}), LoadState(stop=Waits(), version="v1", error="OSError: v1")
    checks = iter(["v1", "v1", "v2"])  # the active version as the down worker finds it, check by check

    def looks(timeout: float | None = None) -> bool:
        reg.active = next(checks)
        return False

    state.stop.wait = looks  # type: ignore[method-assign]
    assert stay_down(reg.load_active, what="x", state=state) == "runner v2"
    assert reg.tried == ["v2"] and not state.down and state.error is None


def test_down_stays_down_on_another_broken_version_and_a_stop_ends_it() -> None:
    reg, state = Registry("v1", {"v1", "v2"}), LoadState(stop=Waits(), version="v1")
    steps = iter([("v2", False), ("v2", False), ("v2", True)])

    def looks(timeout: float | None = None) -> bool:
        reg.active, stop = next(steps)
        return stop

    state.stop.wait = looks  # type: ignore[method-assign]
    assert stay_down(reg.load_active, what="x", state=state) is None
    assert reg.tried == ["v2"] and state.down  # tried once, not once a check
