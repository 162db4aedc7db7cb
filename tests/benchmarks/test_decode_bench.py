"""`make bench`'s decode benchmark runs end to end (tiny settings) and writes what it prints."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.tiny_models import ROOT


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


def test_step_cost_benchmark_runs_on_the_cpu(tmp_path):
    """The GPU check's step-cost table, on a tiny shape: every line but the graph capture runs here."""
    out = tmp_path / "step_cost.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "step_cost.py"), "--shapes", "tiny", "--batch-sizes", "1", "2",
         "--new-tokens", "8", "--source", "16", "--device", "cpu", "--hbm-gbps", "50", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["mode"]) for r in rows] == [(1, "ar"), (1, "hybrid"), (2, "ar"), (2, "hybrid")]
    assert all(r["step_s"] > 0 and not r["graphs"] for r in rows)
    assert rows[0]["share_of_roofline"] > 0 and "hybrid step =" in proc.stdout


def test_gpu_check_script_is_valid_and_refuses_without_a_gpu(tmp_path):
    script = ROOT / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    import torch

    if not torch.cuda.is_available():
        proc = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True,
                              env={**__import__("os").environ, "PYTHON": sys.executable}, timeout=120)
        assert proc.returncode != 0 and "no CUDA device" in proc.stderr
