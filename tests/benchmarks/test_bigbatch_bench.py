"""`make bench`'s big-batch benchmark runs end to end on a small file and writes what it prints:
every line's result comes back, and each step reports seconds and peak memory. It runs on a
scratch Postgres database of its own (the benchmark makes one) and on a Redis server this test
starts and hands it (`--redis`; the benchmark would start one itself without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.pipeline.conftest import PG_ADMIN_URL, service_unavailable
from tests.scratch_redis import ScratchRedis
from tests.tiny_models import ROOT


def test_bigbatch_benchmark_runs_a_small_file_through(tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    try:
        create_engine(PG_ADMIN_URL).connect().close()
        redis_server = ScratchRedis.start()
    except Exception as exc:  # ScratchRedisError among them
        service_unavailable("Postgres on 127.0.0.1 or a Redis server of the test's own", exc)
    out = tmp_path / "bigbatch.json"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}, "TMPDIR": str(tmp_path),
           "YUE2_COMPILE": "0"}  # no C++ build at the worker's start (tests/decode/test_compiled.py covers it)
    try:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bigbatch.py"), "--lines", "300", "--mb", "1.2", "--pg",
             PG_ADMIN_URL, "--redis", redis_server.url(0), "--out", str(out)],
            capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    finally:
        redis_server.stop()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["lines"] == 300 and 1.0 < result["file_mb"] < 1.4
    assert result["run"]["request_counts"] == {"total": 300, "completed": 300, "failed": 0}
    assert result["download_lines"] == 300
    for step in ("upload", "create", "download"):
        assert result[step]["seconds"] > 0 and result[step]["api_rss_before_mb"] > 0
    assert result["finalize_alone"]["seconds"] > 0
    assert "finalize alone: peak RSS growth MiB" in proc.stdout
