"""A worker process bounds its own warm shutdown (workers/main.py): `warm_s` after it began, a
worker that has not stopped exits on its own, whoever else is gone (its launcher SIGKILLed, or a
`--child` run alone); one that stopped in time is left alone. The launcher's side of the bound is
tested in test_launcher.py, the micro-batch's drain in test_tasks.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import threading, sys
from workers.main import bound_warm_shutdown
draining, stopped = threading.Event(), threading.Event()
if sys.argv[1] == "never drained":  # a stop without a warm shutdown (the load failed, say) ends the wait too
    threading.Timer(0.2, stopped.set).start()
else:
    threading.Timer(0.2, draining.set).start()  # a warm shutdown begins
if sys.argv[1] == "stopped":
    threading.Timer(0.4, stopped.set).start()  # and ends in time
bound_warm_shutdown(draining, stopped, 1.0)
print("returned")
"""


@pytest.mark.parametrize(("case", "code"), [("stuck", 75), ("stopped", 0), ("never drained", 0)])
def test_a_warm_shutdown_past_its_bound_exits_on_its_own(case: str, code: int) -> None:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT, case], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stdout + done.stderr
    assert ("returned" in done.stdout) == (code == 0)
    if code:
        assert "yue2-worker: the warm shutdown has not ended 1s after it began" in done.stderr
    assert time.monotonic() - t0 < 60  # imports included
