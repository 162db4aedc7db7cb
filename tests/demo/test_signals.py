"""`make demo` and `yue2 ab demo` leave nothing behind when stopped mid-run: SIGTERM or SIGINT (to
the program, or Ctrl-C's SIGINT to its whole process group, or SIGTERM to `make` alone) stops every
worker, and every process the run started, and removes the run's temporary directory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline.conftest import wait_for

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


def _as_a_foreground_job() -> None:
    """SIGINT and SIGQUIT as a terminal's foreground job gets them. A test run started in the
    background of a script (`nohup make test &`) ignores both, and a child inherits that: the
    demo would never see the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


# Each signal, each program: SIGTERM to `make` alone (its demo must notice its parent died) and
# Ctrl-C's SIGINT to the whole group; `yue2 ab demo` gets each on its own too.
@pytest.mark.parametrize(("argv", "marker", "how"), [
    (MAKE_DEMO, "submitted", "SIGTERM to make"),
    (AB_DEMO, "experiment exp_", "SIGINT to the group"),
    (AB_DEMO, "experiment exp_", "SIGTERM"),
], ids=["make-demo-sigterm", "ab-demo-ctrl-c", "ab-demo-sigterm"])
def test_a_stopped_demo_leaves_no_process_and_no_directory(argv: list[str], marker: str, how: str,
                                                           tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True,  # its own session: every process it starts is in it
                            preexec_fn=_as_a_foreground_job)
    try:
        wait_for(lambda: marker in log.read_text() or proc.poll() is not None, timeout=240,
                 what=f"{marker!r} in the output", interval=0.2)
        assert proc.poll() is None, f"ended before it could be stopped:\n{log.read_text()[-3000:]}"
        home = Path(re.search(r"embedded pipeline in (\S+):", log.read_text()).group(1))  # type: ignore[union-attr]
        assert home.is_dir() and len(_in_session(proc.pid)) >= 3  # the program and its two workers at least
        if how == "SIGINT to the group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT if how == "SIGINT" else signal.SIGTERM)
        proc.wait(90)
        # Processes a stopped parent reaps on its way out may take a moment to go: wait for it.
        wait_for(lambda: not _in_session(proc.pid), timeout=30, what="every process of the run to exit")
        assert not home.exists(), f"{home} left behind"
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    finally:
        if proc.poll() is None or _in_session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
