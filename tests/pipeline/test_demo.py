"""`yue2 demo` on the embedded default (SQLite, filesystem queue, local storage): no servers at all."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.pipeline.conftest import ROOT


def test_embedded_demo_runs_the_pipeline_end_to_end() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}
    out = subprocess.run([sys.executable, "-m", "yue2_jobs", "demo", "--items", "24"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "SQLite database, filesystem queue, local storage" in out.stdout
    table = out.stdout.split("p50 job latency s\n", 1)[1].split()
    assert table[:2] == ["24", "0"]  # jobs succeeded, failed
    assert "base@" in out.stdout
