"""`make bench-grown` runs end to end (a small width, one checkpoint, fp32) and checks what it claims:
the grown model decodes the shipped model's tokens, `hybrid` equals `ar`, CTranslate2 agrees."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.tiny_models import ROOT


def test_grown_benchmark_decodes_the_shipped_tokens_at_a_wider_shape(tmp_path):
    out = tmp_path / "grown.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "grown.py"), "--checkpoints", "legal", "--widths", "384",
         "--vocab", "6000", "--dtypes", "float32", "--texts", "6", "--repeats", "1", "--batch-sizes", "1",
         "--max-new-tokens", "16", "--threads", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    (model,) = result["models"]
    assert (model["width"], model["ffn"], model["vocab"], model["decoder_layers"]) == (384, 1536, 6000, 2)
    same = model["same_tokens"]
    assert same["rows"] == 6 and same["rows_differing"] == same["of_which_near_ties"]
    by = {r["engine"].split(" (")[0]: r for r in result["rows"]}
    assert by["ours hybrid float32"]["same_as_ours_ar"] == 1.0 and by["ours hybrid float32"]["tau"] > 1.0
    assert by["CTranslate2 float32"]["same_as_ours_ar"] == 1.0  # the peer decodes the grown weights identically
    (line,) = result["summary"]
    assert line["hybrid_vs_ar_float32"] > 0 and "hybrid/ar fp32" in proc.stdout
