"""Hot swap without a broker (workers/swap.py): the state machine's transitions, each reported;
two callers asking for one version at the same moment — the status report and remote control,
which a busy worker answers too — start one load; a busy worker adopts only where its decode
loop lets it; a failed load leaves the old runner serving and is not retried."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from workers.job_io import JobInput, JobOutput
from workers.runtime import WorkerRuntime
from workers.swap import HotSwap, SwapState


class Runner:
    def __init__(self, checkpoint: str) -> None:
        self.variant, self.checkpoint, self.weights_sha256 = "base", checkpoint, None

    def run(self, jobs: list[JobInput]) -> list[JobOutput | Exception]:
        return []


class Loads:
    """A `load` whose calls wait for `release` and are counted; version "bad" fails."""

    def __init__(self) -> None:
        self.built: list[str] = []
        self.release = threading.Event()

    def __call__(self, version: str) -> Runner:
        self.built.append(version)
        assert self.release.wait(10)
        if version == "bad":
            raise OSError("no such version in the store")
        return Runner(f"base@{version}")


class Recorder:
    """`on_change`: the state after each transition, in order; `reached[state]` set on each, and
    `settled` once it serves or has failed."""

    def __init__(self) -> None:
        self.states: list[SwapState | None] = []
        self.swap: HotSwap | None = None
        self.reached = {state: threading.Event() for state in SwapState}
        self.settled = threading.Event()

    def __call__(self) -> None:
        assert self.swap is not None
        state = self.swap.status().state
        assert state is not None
        self.states.append(state)
        self.reached[state].set()
        if state in (SwapState.SERVING, SwapState.FAILED):
            self.settled.set()


@pytest.fixture
def runtime() -> Any:
    rt = WorkerRuntime()
    yield rt
    assert rt.stop(10) == []  # the swap thread ended: nothing left running


def _swap(runtime: WorkerRuntime, loads: Loads) -> tuple[HotSwap, Recorder]:
    seen = Recorder()
    swap = HotSwap(Runner("base@v0"), load=loads, spawn=runtime.spawn, on_change=seen)
    seen.swap = swap
    return swap, seen


def test_an_idle_worker_goes_loading_loaded_serving_and_reports_each(runtime: WorkerRuntime) -> None:
    loads = Loads()
    swap, seen = _swap(runtime, loads)
    assert swap.request(variant="base", version="v1")["ok"] == "loading"
    assert swap.serving.checkpoint == "base@v0"  # the old weights serve while it loads
    loads.release.set()
    assert seen.settled.wait(10)
    assert seen.states == [SwapState.LOADING, SwapState.LOADED, SwapState.SERVING]
    assert swap.serving.checkpoint == "base@v1" and not swap.pending
    assert swap.status().as_dict() == {"version": "v1", "state": "serving", "error": None}
    assert swap.request(variant="base", version="v1")["ok"] == "already serving"
    assert swap.request(variant="legal", version="v1") == {"ignored": "this worker serves base"}


def test_a_busy_worker_adopts_only_where_its_decode_loop_does(runtime: WorkerRuntime) -> None:
    loads = Loads()
    swap, seen = _swap(runtime, loads)
    with swap.batch_gate:  # a micro-batch runs
        swap.request(variant="base", version="v1")
        loads.release.set()
        assert seen.reached[SwapState.LOADED].wait(10)
        assert swap.pending and swap.serving.checkpoint == "base@v0"  # waits for a group boundary
        assert swap.adopt()  # the decode loop's boundary
        assert swap.serving.checkpoint == "base@v1" and not swap.adopt()  # adopted once
    assert seen.settled.wait(10)
    assert seen.states == [SwapState.LOADING, SwapState.LOADED, SwapState.SERVING]


def test_a_failed_load_keeps_the_old_runner_and_is_not_retried(runtime: WorkerRuntime) -> None:
    loads = Loads()
    swap, seen = _swap(runtime, loads)
    loads.release.set()
    swap.request(variant="base", version="bad")
    assert seen.settled.wait(10)
    assert seen.states == [SwapState.LOADING, SwapState.FAILED]
    assert swap.serving.checkpoint == "base@v0"
    assert swap.status().error == "OSError: no such version in the store"
    assert swap.request(variant="base", version="bad") == {"failed": "OSError: no such version in the store"}
    assert loads.built == ["bad"]  # the watchdog has been told; no retry loop
    seen.settled.clear()
    assert swap.request(variant="base", version="v2")["ok"] == "loading"  # another version may be tried
    assert seen.settled.wait(10) and swap.serving.checkpoint == "base@v2"


def test_two_requests_at_once_start_one_load_and_one_adoption(runtime: WorkerRuntime) -> None:
    loads = Loads()
    swap, seen = _swap(runtime, loads)
    decide = swap._refusal

    def slow_decide(variant: str, version: str) -> Any:
        answer = decide(variant, version)
        threading.Event().wait(0.05)  # decided; let the other caller run before this one acts on it
        return answer

    swap._refusal = slow_decide  # type: ignore[method-assign]  # the window between check and start, wide open
    answers: list[dict[str, Any]] = []
    both = threading.Barrier(2)

    def ask() -> None:
        both.wait()
        answers.append(swap.request(variant="base", version="v1"))

    askers = [threading.Thread(target=ask) for _ in range(2)]
    for t in askers:
        t.start()
    for t in askers:
        t.join(10)
    assert sorted(next(iter(a)) for a in answers) == ["busy", "ok"]  # one started it, the other saw it loading
    loads.release.set()
    assert seen.settled.wait(10)
    assert swap.serving.checkpoint == "base@v1"
    assert loads.built == ["v1"]  # loaded once
    assert seen.states.count(SwapState.SERVING) == 1  # adopted once


def test_a_worker_without_versions_refuses_a_swap(runtime: WorkerRuntime) -> None:
    swap = HotSwap(Runner("base@builtin"), load=None, spawn=runtime.spawn)
    assert "no versions" in str(swap.request(variant="base", version="v1")["ignored"])
