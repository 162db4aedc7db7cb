"""`make demo` and `yue2 ab demo` leave nothing behind when stopped mid-micro-batch, and stop within
`DEMO_STOP_S`: SIGTERM or SIGINT, to the program alone or to its whole process group (Ctrl-C),
once or twice, or SIGTERM to `make` alone, stops every worker and every process the run started
and removes the run's temporary directory. A demo owes its workers nothing (`procs.NOTHING`), so no
warm shutdown stands between the signal and the exit."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.conftest import wait_for
from yue2_jobs.demo import DEMO_STOP_S

ROOT = Path(__file__).resolve().parents[2]
DEMO = [sys.executable, "-m", "yue2_jobs", "demo", "--items", "400"]
AB_DEMO = [sys.executable, "-m", "yue2_jobs", "ab", "demo", "--items", "200"]
MAKE_DEMO = ["make", "--no-print-directory", "demo"]


def _in_session(sid: int) -> list[int]:
    """Pids of the live processes in session `sid` (zombies, already exited, do not count)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it exited while we looked
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state, ppid, pgrp, session, ...
            pids.append(int(stat.parent.name))
    return pids


def _running_jobs(home: Path) -> int:
    """Jobs a worker has claimed and not finished, in the demo's database: a micro-batch is under way."""
    try:
        with sqlite3.connect(f"file:{home / 'yue2.db'}?mode=ro", uri=True, timeout=5) as db:
            return int(db.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone()[0])
    except sqlite3.Error:  # not created yet, or busy beyond the timeout: ask again
        return 0


def _as_a_foreground_job() -> None:
    """SIGINT and SIGQUIT as a terminal's foreground job gets them. A test run started in the
    background of a script (`nohup make test &`) ignores both, and a child inherits that: the
    demo would never see the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


# Each program, each way a stop arrives: SIGTERM to `make` alone (it passes SIGTERM on to the demo
# and dies, and its death sends the demo another: PDEATHSIG), Ctrl-C's SIGINT to the whole group,
# once and twice (the second in the clean-up the first began), SIGTERM to the demo alone.
@pytest.mark.parametrize(("argv", "marker", "signals", "to_group"), [
    (MAKE_DEMO, "submitted", [signal.SIGTERM], False),
    (AB_DEMO, "experiment exp_", [signal.SIGINT], True),
    (AB_DEMO, "experiment exp_", [signal.SIGINT, signal.SIGINT], True),
    (AB_DEMO, "experiment exp_", [signal.SIGTERM], False),
], ids=["make-demo-sigterm", "ab-demo-ctrl-c", "ab-demo-ctrl-c-twice", "ab-demo-sigterm"])
def test_a_stopped_demo_leaves_no_process_and_no_directory(argv: list[str], marker: str, signals: list[int],
                                                           to_group: bool, tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}
    env["YUE2_COMPILE"] = "0"  # no C++ build at the workers' start (tests/decode/test_compiled.py covers it)
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True,  # its own session: every process it starts is in it
                            preexec_fn=_as_a_foreground_job)
    try:
        wait_for(lambda: marker in log.read_text() or proc.poll() is not None, timeout=240,
                 what=f"{marker!r} in the output", interval=0.2)
        assert proc.poll() is None, f"ended before it could be stopped:\n{log.read_text()[-3000:]}"
        home = Path(re.search(r"embedded pipeline in (\S+):", log.read_text()).group(1))  # type: ignore[union-attr]
        wait_for(lambda: _running_jobs(home) or proc.poll() is not None, timeout=120, what="a micro-batch to start")
        assert proc.poll() is None, f"ended before it could be stopped:\n{log.read_text()[-3000:]}"
        assert home.is_dir() and len(_in_session(proc.pid)) >= 3  # the program and its two workers at least
        running = len(_in_session(proc.pid))
        t0 = time.monotonic()
        for i, sig in enumerate(signals):
            if i:  # a second signal lands in the clean-up the first began (a process of the run gone)
                wait_for(lambda: len(_in_session(proc.pid)) < running, timeout=DEMO_STOP_S,
                         what="the stop to begin", interval=0.01)
            if to_group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        proc.wait(DEMO_STOP_S)
        exited = time.monotonic() - t0
        # Every process of the run is gone by the time the demo exits (make exits at once: its demo
        # may still be stopping), all within DEMO_STOP_S of the signal.
        wait_for(lambda: not _in_session(proc.pid), timeout=max(0.0, t0 + DEMO_STOP_S - time.monotonic()),
                 what="every process of the run to exit", interval=0.05)
        print(f"exited in {exited:.2f}s, every process gone in {time.monotonic() - t0:.2f}s (bound {DEMO_STOP_S:.0f}s)")
        assert not home.exists(), f"{home} left behind"
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    finally:
        for pid in _in_session(proc.pid):  # the workers' own process groups too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
