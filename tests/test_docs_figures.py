"""The docs quote measured figures only from `docs/figures.json`, and the package map lists every package.

The rule for figures (the markers and the file: `benchmarks/figures.py`'s docstring):

- Every figure a doc quotes through a marker equals `docs/figures.json`: `<!--fig:NAME-->TEXT<!--/fig-->`
  must read `figures[NAME].value`; every number inside a `<!--figs:NAME-->` ... `<!--/figs-->` block
  must equal `blocks[NAME].values`, in order. This covers README.md and every page in docs/.
- Every figure and block in the file names a source with its benchmark, command, date, machine and
  commit, and is quoted somewhere (nothing stale is kept).
- In the docs where measurements live (docs/measured.md, status.md, decoding.md and
  decoding-history.md) nothing may look measured outside a marker. "Looks measured" is a number
  followed by a unit of measurement (×, x, %, ms, µs, s, tok/s, tokens/s, jobs/s, MiB, MB, GB,
  GB/s, minutes, seconds, hours, ROUGE) or after "tau", outside `code` and fenced code; a number
  right after ≤ ≥ < >, "target", "budget", "default", "at most", "up to", "limit", "every",
  "within", "under", "after" or a --flag is a limit or a setting, not a measurement. README.md,
  docs/api.md and docs/operations.md quote settings and limits in the same units (timeouts,
  sizes), so there the measured figures are marked but the rule is not applied.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

from benchmarks.figures import DOCS, STRICT_DOCS, check, load, numbers, read_docs, render, unmarked

ROOT = Path(__file__).resolve().parents[1]


def test_every_quoted_figure_equals_its_source() -> None:
    problems = check(read_docs(), load())
    assert not problems, "\n".join(problems)


def test_the_checked_docs_are_every_page() -> None:
    pages = {"README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))}
    assert pages <= set(DOCS), sorted(pages - set(DOCS))


def test_a_changed_figure_fails_inline_and_in_a_block() -> None:
    docs, figures = read_docs(), load()
    inline = copy.deepcopy(docs)
    rel = next(r for r, t in docs.items() if "<!--fig:base_tau-->" in t)
    inline[rel] = docs[rel].replace("<!--fig:base_tau-->1.46<!--/fig-->", "<!--fig:base_tau-->1.53<!--/fig-->", 1)
    assert any("fig:base_tau reads '1.53'" in p for p in check(inline, figures))
    block = copy.deepcopy(docs)
    block["docs/measured.md"] = docs["docs/measured.md"].replace("| 1,602 |", "| 1,612 |", 1)
    assert any("figs:peers_shipped" in p for p in check(block, figures))


def test_a_figure_outside_a_marker_fails_where_measurements_live() -> None:
    assert {"docs/measured.md", "docs/status.md"} <= set(STRICT_DOCS)
    for rel in STRICT_DOCS:
        docs = read_docs()
        docs[rel] += "\n`hybrid` runs at 0.54× `ar` on base.\n"
        assert any(p.startswith(rel) and "0.54×" in p for p in check(docs, load())), rel


def test_the_measured_looking_rule() -> None:
    assert unmarked("base tau 1.46 and 0.65× at 1,602 tok/s, 29 %, 7–8 s") == [
        "1: tau 1.46", "1: 0.65×", "1: 1,602 tok/s", "1: 29 %", "1: 7–8 s"]
    assert unmarked("target 2.5×, at most 64 MiB, `--stop-timeout 60 s`, ≤ 15 MB, every 5 s") == []
    assert unmarked("<!--fig:x-->0.65×<!--/fig--> and\n<!--figs:y-->\n3 s\n<!--/figs-->\n```sh\nsleep 1 s\n```\n") == []
    assert numbers("int8 at 1,602 tok/s (−0.33, H200, `--texts 48`) 2026-12-06") == [
        "1,602", "−0.33", "2026", "12", "06"]


def test_write_rewrites_quotes_from_the_file() -> None:
    figures = load()
    figures["figures"]["base_tau"]["value"] = "9.99"
    first = figures["blocks"]["peers_shipped"]["values"]
    figures["blocks"]["peers_shipped"]["values"] = ["7", *first[1:]]
    docs = {rel: render(text, figures) for rel, text in read_docs().items()}
    problems = check(docs, figures)
    assert not problems, problems
    assert "<!--fig:base_tau-->9.99<!--/fig-->" in docs["docs/measured.md"]


def test_the_package_map_lists_every_package_and_top_level_folder() -> None:
    """docs/layout.md names each folder under yue2_jobs/ and each top-level folder of the repository."""
    layout = (ROOT / "docs" / "layout.md").read_text()
    skip = re.compile(r"^(\.|__pycache__$|build$|.*\.egg-info$)")
    folders = [f"yue2_jobs/{p.name}/" for p in (ROOT / "yue2_jobs").iterdir() if p.is_dir() and not skip.match(p.name)]
    folders += [f"{p.name}/" for p in ROOT.iterdir() if p.is_dir() and not skip.match(p.name)]
    missing = [f for f in folders if f"`{f}`" not in layout]
    assert not missing, missing
