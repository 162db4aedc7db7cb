"""The worker's runtime (workers/runtime.py): duties keep running through their failures, logged
by their policy; a stop is bounded by one deadline whatever a service does; pools are shut down
after the threads that feed them, their work done; and no module of the worker starts a thread
or a pool of its own."""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import BrokenExecutor
from pathlib import Path

import pytest

from workers.runtime import WorkerRuntime

ROOT = Path(__file__).resolve().parents[2]


def test_a_duty_outlives_its_failures_logged_by_its_policy(caplog: pytest.LogCaptureFixture) -> None:
    rt = WorkerRuntime()
    calls: list[int] = []
    third = threading.Event()

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("database away")  # quiet: an outage, one line
        if len(calls) == 2:
            raise ValueError("a bug")  # not quiet: its traceback
        third.set()

    duty = rt.every("flaky", 0.01, flaky, quiet=(ConnectionError,))
    with caplog.at_level(logging.WARNING, logger="yue2.worker"):
        rt.start()
        assert third.wait(5)
        assert rt.stop(5) == []
    records = [r for r in caplog.records if r.getMessage().startswith("flaky failed")]
    assert [r.exc_info is not None for r in records[:2]] == [False, True]
    assert "ConnectionError: database away" in records[0].getMessage()
    assert duty.failures == 0  # reset by the run that went through


def test_a_stop_is_bounded_by_one_deadline_and_names_what_is_left() -> None:
    rt = WorkerRuntime()
    release = threading.Event()
    ticks = threading.Event()
    rt.spawn("stuck", lambda: release.wait(30))  # ignores the stop
    rt.every("ticking", 0.01, ticks.set)
    rt.start()
    assert ticks.wait(5)
    t0 = time.monotonic()
    assert rt.stop(0.5) == ["stuck"]
    assert time.monotonic() - t0 < 2.0
    release.set()
    with pytest.raises(RuntimeError, match="stopped"):
        rt.spawn("late", lambda: None)  # nothing starts after a stop


def test_a_stop_waits_for_the_loop_to_wake_and_end() -> None:
    rt = WorkerRuntime()
    wake = threading.Event()
    rounds: list[float] = []

    def body(stopping: threading.Event) -> None:
        while not stopping.is_set():
            rounds.append(time.monotonic())
            wake.wait(60)  # a long poll interval: the stop must wake it
            wake.clear()

    rt.loop("report", body, wake=wake)
    rt.start()
    while not rounds:
        wake.wait(0.01)
    t0 = time.monotonic()
    assert rt.stop(10) == []
    assert time.monotonic() - t0 < 2.0


def test_pools_are_shut_down_after_the_threads_that_feed_them() -> None:
    rt = WorkerRuntime()
    pool = rt.thread_pool("records", 1)
    done: list[int] = []

    def feed(stopping: threading.Event) -> None:
        i = 0
        while not stopping.is_set():
            pool.executor.submit(done.append, i)  # would raise after the pool's shutdown
            i += 1
            stopping.wait(0.001)
        stopping.wait(0.05)  # still feeding a moment after the stop was asked
        pool.executor.submit(done.append, -1)

    rt.loop("feeder", feed)
    rt.start()
    while len(done) < 10:
        threading.Event().wait(0.01)
    assert rt.stop(10) == []
    assert done[-1] == -1  # the last work handed over ran before the pool closed


def test_no_worker_module_starts_a_thread_or_a_pool_outside_the_runtime() -> None:
    """The target of issue 40: every thread of a worker process is its runtime's."""
    starters = {"Thread", "Timer", "ThreadPoolExecutor", "ProcessPoolExecutor", "start_http_server",
                "start_new_thread"}
    # Functions that run in another process than the worker: an upload helper's start.
    elsewhere = {("uploader.py", "_init")}
    found = []
    for path in sorted((ROOT / "workers").glob("*.py")):
        if path.name in ("runtime.py", "launcher.py"):  # the owner; the launcher is its own process
            continue
        tree = ast.parse(path.read_text())
        skip = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and (path.name, f.name) in elsewhere
                for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and id(node) not in skip:
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in starters:
                    found.append(f"workers/{path.name}:{node.lineno} {name}")
    assert not found, found


def _pid() -> int:
    return os.getpid()


def test_helper_processes_spawned_by_a_pool_thread_stop_cleanly_and_die_with_the_worker(tmp_path: Path) -> None:
    """The upload helpers are spawned by the recorder's thread. Tied to that thread's life (as
    PR_SET_PDEATHSIG is), they were killed when it ended at a warm shutdown, one holding its pool's
    queue lock, and the worker hung on the other; tied to the worker process, they outlive no one."""
    script = tmp_path / "worker.py"
    script.write_text(f"""
import os, sys, time
sys.path.insert(0, {str(ROOT)!r})
from tests.workers.test_runtime import _pid
from workers.runtime import WorkerRuntime

if __name__ == "__main__":
    rt = WorkerRuntime()
    helpers = rt.process_pool("put", 2, initializer=print, initargs=("helper up",))
    feeder = rt.thread_pool("rec", 1)
    spawn = feeder.executor.submit(lambda: sorted({{helpers.executor.submit(_pid).result() for _ in range(20)}}))
    pids = spawn.result()
    print("helpers", *pids, flush=True)
    feeder.signal_stop()  # the thread that spawned the helpers ends, as at a warm shutdown
    assert feeder.join(10)
    print("still serving", helpers.executor.submit(_pid).result(timeout=60) in pids, flush=True)
    if sys.argv[1] == "stop":
        t0 = time.monotonic()
        print("late", rt.stop(20), round(time.monotonic() - t0, 1), flush=True)
    else:
        os.kill(os.getpid(), 9)  # the worker killed outright
""")
    done = subprocess.run([sys.executable, str(script), "stop"], capture_output=True, text=True, timeout=120)
    assert "still serving True" in done.stdout and "late [] " in done.stdout, done.stdout + done.stderr
    killed = subprocess.run([sys.executable, str(script), "kill"], capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in killed.stdout.split("helpers", 1)[1].splitlines()[0].split()]
    gone_by = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < gone_by:
        threading.Event().wait(0.05)
    assert not any(_alive(p) for p in pids), pids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _die() -> None:
    os._exit(1)


def test_a_process_pool_broken_by_a_dead_helper_gets_new_helpers() -> None:
    rt = WorkerRuntime()
    helpers = rt.process_pool("put", 1, initializer=int, initargs=())
    with pytest.raises(BrokenExecutor):
        helpers.executor.submit(_die).result(timeout=60)
    assert helpers.executor.submit(_pid).result(timeout=60) != os.getpid()  # a new helper serves
    assert rt.stop(30) == []
