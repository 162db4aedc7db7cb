"""The structure rules of the house, checked on every run: modules of at most 300 lines, functions
of at most 80, no private name imported across packages. The exceptions are named here, each
with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("yue2_jobs", "workers", "tests", "benchmarks")
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 80
# One model, one file, as in Hugging Face's modeling_bart.py.
LONG_MODULES = {"yue2_jobs/model/modeling_yue2.py"}
# Benchmarks are straight-line scripts, read top to bottom.
LONG_FUNCTIONS_UNDER = ("benchmarks/",)


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "_shipped" not in p.parts)


def test_modules_have_at_most_300_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert set(long) <= LONG_MODULES, {k: v for k, v in long.items() if k not in LONG_MODULES}


def test_functions_have_at_most_80_lines() -> None:
    long = []
    for path in _modules():
        rel = str(path.relative_to(ROOT))
        if rel.startswith(LONG_FUNCTIONS_UNDER):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{rel}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


def test_no_private_name_is_imported_across_packages() -> None:
    found = []
    for path in _modules():
        rel = path.relative_to(ROOT)
        own = ".".join(rel.parts[:2]) if len(rel.parts) > 2 else rel.parts[0]  # e.g. yue2_jobs.model
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if not node.module.startswith(PACKAGES) or node.module.startswith(own + "."):
                    continue
                found += [f"{rel}:{node.lineno} {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found
