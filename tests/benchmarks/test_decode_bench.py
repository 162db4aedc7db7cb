"""`make bench`'s decode benchmark runs end to end (tiny settings) and writes what it prints."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.model.conftest import ROOT


def test_decode_benchmark_writes_every_method(tmp_path):
    out = tmp_path / "decode.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "decode.py"), "--texts", "4", "--repeats", "1", "--batch-sizes",
         "1", "2", "--max-new-tokens", "12", "--hbm-gbps", "100", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    by = {(r["method"], r["batch_size"]): r for r in rows}
    assert ("HF prompt lookup", 1) in by and ("HF prompt lookup", 2) not in by
    for bs in (1, 2):
        assert by[("ours ar", bs)]["exact_match"] == 1.0
        assert by[("hybrid", bs)]["exact_match"] == 1.0  # lossless, checked on every run
        assert by[("HF generate", bs)]["exact_match"] == 1.0
        assert by[("CTranslate2", bs)]["exact_match"] == 1.0  # the peer engine decodes our weights identically
        assert by[("hybrid", bs)]["tau"] >= 1.0
        for key in ("tok_s", "rouge_l", "steps_per_token", "accepted_histogram"):
            assert by[("hybrid", bs)][key] is not None
    assert "roofline_tok_s" in by[("hybrid", 1)]  # the GPU roofline column, forced by --hbm-gbps
    assert "hybrid_fast@0.5" in proc.stdout and "nar (4 iterations)" in proc.stdout
