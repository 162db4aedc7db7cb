"""Hot swap without a broker (workers/swap.py): two callers asking for one version at the same
moment — the status-report thread and remote control, which a busy worker now answers too —
start one load, and the loaded runner is adopted once."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from workers.swap import start_swap


class SlowRunner:
    """A runner whose load waits for `release` and counts how often it was built."""

    built: ClassVar[list[str]] = []
    release = threading.Event()

    def __init__(self, *, variant: str, settings: Any, directory: Any) -> None:
        self.variant, self.settings = variant, settings
        self.checkpoint, self.weights_sha256 = f"{variant}@{directory}", None
        SlowRunner.built.append(str(directory))
        assert SlowRunner.release.wait(10)


class Metrics:
    def checkpoint_event(self, *_: Any) -> None:
        pass

    def runner_loaded(self, *_: Any) -> None:
        pass


class Yielding(dict[str, Any]):
    """A status dict whose reads give the other thread its turn: the window between a check and a
    start, wide open."""

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        threading.Event().wait(0.02)  # read, then let the other thread run before this one acts on it
        return value


@dataclass
class Ctx:
    """What swap.py reads and writes of a `WorkerContext`."""

    runner: Any
    pending_runner: Any = None
    swap_status: dict[str, Any] = field(default_factory=Yielding)
    swap_start_lock: threading.Lock = field(default_factory=threading.Lock)
    swap_lock: threading.Lock = field(default_factory=threading.Lock)
    report_now: threading.Event = field(default_factory=threading.Event)
    metrics: Metrics = field(default_factory=Metrics)


def test_two_requests_at_once_start_one_load_and_one_adoption() -> None:
    SlowRunner.release.set()
    ctx = Ctx(runner=SlowRunner(variant="base", settings=None, directory="v0"))
    SlowRunner.built.clear()
    SlowRunner.release.clear()
    answers: list[dict[str, Any]] = []
    both = threading.Barrier(2)

    def ask() -> None:
        both.wait()
        answers.append(start_swap(ctx, variant="base", version="v1", directory_for=lambda v: v))

    askers = [threading.Thread(target=ask) for _ in range(2)]
    for t in askers:
        t.start()
    for t in askers:
        t.join(10)
    assert sorted(next(iter(a)) for a in answers) == ["busy", "ok"]  # one started it, the other saw it loading
    SlowRunner.release.set()
    assert ctx.report_now.wait(10)  # set by the adoption (the worker is idle: swap_lock is free)
    assert ctx.runner.checkpoint == "base@v1" and ctx.swap_status["state"] == "serving"
    assert SlowRunner.built == ["v1"]  # loaded once
    assert start_swap(ctx, variant="base", version="v1", directory_for=lambda v: v)["ok"] == "already serving"
