"""docs/operations.md's A/B flow, run as written: its `sh` block, in one shell, against the
embedded pipeline (the API, a `base` and a `legal` worker, as `make ab-demo` starts them). Two
things differ from a person at a terminal, both here in the open: `yue2 ab export-eval` writes 6
items of each set instead of all of them, and `make ab-demo` (the same flow, minutes long) is left
out. The report it prints has a section per eval set, the domain warnings and no latency verdict
(both workers share this machine)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRELUDE = """set -euo pipefail
yue2() {
  if [ "${1:-} ${2:-}" = "ab export-eval" ]; then command yue2 "$@" --items 6; else command yue2 "$@"; fi
}
"""
# Runs the block with YUE2_API_URL and YUE2_API_KEY pointing at an embedded stack of its own.
RUNNER = """
import subprocess, sys
from yue2_jobs.demo import embedded_stack
with embedded_stack(prefix="yue2-ab-docs-", tenant="docs") as stack:
    stack.worker("base")
    stack.worker("legal")
    env = {**stack.env, "YUE2_API_URL": stack.url, "YUE2_API_KEY": stack.key}
    sys.exit(subprocess.run(["bash", sys.argv[1]], cwd=sys.argv[2], env=env).returncode)
"""


def ab_block() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## A/B experiments", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 1, blocks
    return blocks[0]


def test_the_documented_ab_flow_runs_and_reports_per_eval_set(tmp_path: Path) -> None:
    block = ab_block()
    assert "yue2 ab export-eval" in block and "legal_eval.jsonl" in block
    commands = [line for line in block.splitlines() if not line.startswith("make ")]
    assert len(commands) == len(block.splitlines()) - 1  # only `make ab-demo` is left out
    script = tmp_path / "ab.sh"
    script.write_text(PRELUDE + "\n".join(commands) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}
    env["YUE2_COMPILE"] = "0"  # no C++ build at the workers' start (tests/decode/test_compiled.py covers it)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the venv's `yue2`
    run = subprocess.run([sys.executable, "-c", RUNNER, str(script), str(work)], cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)
    out = run.stdout
    assert run.returncode == 0, (out + run.stderr)[-4000:]
    assert sorted(p.name for p in work.iterdir()) == ["general_eval.jsonl", "legal_eval.jsonl", "report.html"]
    assert re.search(r"\(paired, control base\): 24 finished jobs", out), out[-4000:]
    sections = re.findall(r"^== (.*)$", out, re.M)
    assert sections == ["legal eval: domain legal, 6 items", "general eval: domain general, 6 items"], out[-4000:]
    assert "WARNING: legal was trained for legal and is evaluated here on general eval" in out
    assert "WARNING: base was trained for general and is evaluated here on legal eval" in out
    assert out.count("latency, mean (s) not comparable here:") == 2 and "same host" in out
    assert out.count("Examples (5, spread evenly") == 2
    page = (work / "report.html").read_text()
    assert page.count("<div class='set'>") == 2 and page.count("<li class='warn'>") == 2
