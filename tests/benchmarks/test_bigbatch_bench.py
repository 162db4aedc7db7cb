"""`make bench`'s big-batch benchmark runs end to end on a small file and writes what it prints:
every line's result comes back, and each step reports seconds and peak memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.pipeline.conftest import PG_ADMIN_URL, service_unavailable
from tests.tiny_models import ROOT

REDIS_DB = 13  # no other test uses it


def test_bigbatch_benchmark_runs_a_small_file_through(tmp_path: Path) -> None:
    import redis
    from sqlalchemy import create_engine

    try:
        create_engine(PG_ADMIN_URL).connect().close()
        redis.Redis.from_url(f"redis://127.0.0.1:6379/{REDIS_DB}", socket_connect_timeout=2).ping()
    except Exception as exc:
        service_unavailable("Postgres or Redis on 127.0.0.1", exc)
    out = tmp_path / "bigbatch.json"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bigbatch.py"), "--lines", "300", "--mb", "1.2", "--pg",
         PG_ADMIN_URL, "--redis", f"redis://127.0.0.1:6379/{REDIS_DB}", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["lines"] == 300 and 1.0 < result["file_mb"] < 1.4
    assert result["run"]["request_counts"] == {"total": 300, "completed": 300, "failed": 0}
    assert result["download_lines"] == 300
    for step in ("upload", "create", "download"):
        assert result[step]["seconds"] > 0 and result[step]["api_rss_before_mb"] > 0
    assert result["finalize_alone"]["seconds"] > 0
    assert "finalize alone: peak RSS growth MiB" in proc.stdout
