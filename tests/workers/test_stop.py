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
stopped = threading.Event()
if sys.argv[1] == "stopped":
    threading.Timer(0.2, stopped.set).start()
bound_warm_shutdown(stopped, 1.0)
print("returned")
"""


@pytest.mark.parametrize(("case", "code"), [("stuck", 75), ("stopped", 0)])
def test_a_warm_shutdown_past_its_bound_exits_on_its_own(case: str, code: int) -> None:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT, case], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stdout + done.stderr
    assert ("returned" in done.stdout) == (code == 0)
    if code:
        assert "the warm shutdown has not ended 1s after it began" in done.stderr
    assert time.monotonic() - t0 < 60  # imports included
