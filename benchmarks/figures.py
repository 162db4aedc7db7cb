"""The measured figures the docs quote, kept in one file (`docs/figures.json`) with where each came from.

A figure is written once, in `docs/figures.json`, with its source: the benchmark, the command, the
date, the machine and the commit that recorded it. The docs quote it through a marker, and
`tests/test_docs_figures.py` fails when a quote differs from the file:

- `<!--fig:NAME-->1.46<!--/fig-->`: one figure, inline; the text between the markers must equal
  `figures[NAME].value`. A figure quoted in several places (README, status, decoding, measured)
  is one NAME, so the places cannot disagree.
- a line `<!--figs:NAME-->`, the lines of a table or paragraphs, then a line `<!--/figs-->`: a block
  of one measurement; every number in it (see `numbers`) must equal `blocks[NAME].values`, in order.

Nothing else in a checked doc may look measured (see `unmarked`). To update the docs after a new
run: put its figures in `docs/figures.json` (`set` for one figure, or edit a block's values and
its source), then `python benchmarks/figures.py write` rewrites every quote from the file and
`python benchmarks/figures.py check` says what still differs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures.json"
# Every doc whose markers are checked against the file.
DOCS = ("README.md", "docs/measured.md", "docs/status.md", "docs/decoding.md", "docs/decoding-history.md",
        "docs/operations.md", "docs/api.md", "docs/layout.md")
# The docs where measurements live: here a number that looks measured must sit inside a marker.
STRICT_DOCS = ("docs/measured.md", "docs/status.md", "docs/decoding.md", "docs/decoding-history.md")
SOURCE_FIELDS = ("benchmark", "command", "date", "machine", "commit")

INLINE = re.compile(r"<!--fig:([\w.-]+)-->(.*?)<!--/fig-->")
BLOCK = re.compile(r"^<!--figs:([\w.-]+)-->\n(.*?)^<!--/figs-->$", re.M | re.S)
# A number: digits with `,` thousands or `.` decimals, an optional leading − or +; never the digits
# of a name such as int8, fp32, H200 or a commit id (a letter, digit, `.` or `,` just before).
NUMBER = re.compile(r"(?<![A-Za-z_\d.,])[−+]?\d+(?:[.,]\d+)*")
CODE = re.compile(r"`[^`\n]*`")
FENCE = re.compile(r"^```.*?^```$", re.M | re.S)
# A number followed by a unit of measurement, or after "tau": what "looks measured" means.
_NUM = r"\d+(?:[.,]\d+)*"
_UNIT = r"(?:×|x\b|%|ms\b|µs\b|s\b|tok/s|tokens/s|jobs/s|MiB\b|MB\b|GB/s|GB\b|minutes?\b|seconds?\b|hours?\b|ROUGE)"
MEASURED = re.compile(rf"(?<![A-Za-z_\d.,])(?:tau\s+{_NUM}|{_NUM}(?:\s?[-–]\s?{_NUM})?\s?{_UNIT})")
# Just before a number these say it is a limit, a target or a setting, not a measurement.
LIMIT = re.compile(r"(?:[≤≥<>]|\b(?:target|targets|budget|default|at most|up to|limit|every|within|under|"
                   r"after|--[\w-]+))\s*[(\[]?\s*$")


def load(path: Path = FIGURES) -> dict[str, Any]:
    return json.loads(path.read_text())


def numbers(text: str) -> list[str]:
    """The numbers of a block, in order, outside `code` and outside inline markers (checked on their own)."""
    return NUMBER.findall(CODE.sub(" ", INLINE.sub(" ", text)))


def unmarked(text: str) -> list[str]:
    """Figures that look measured and sit in no marker: a number with a unit (×, x, %, ms, µs, s, tok/s,
    tokens/s, jobs/s, MiB, MB, GB, GB/s, minutes, seconds, hours, ROUGE) or after "tau", outside
    `code` and fenced code, not right after ≤ ≥ < > or target, budget, default, at most, up to, limit, every, within,
    under, after or a --flag. Each is given with its line number."""
    text = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = CODE.sub(lambda m: " " * len(m.group(0)), INLINE.sub(lambda m: " " * len(m.group(0)), line))
        for m in MEASURED.finditer(line):
            if not LIMIT.search(line[: m.start()]):
                found.append(f"{lineno}: {m.group(0).strip()}")
    return found


def check_source(name: str, source: Any) -> list[str]:
    if not isinstance(source, dict):
        return [f"source {name}: not an object"]
    return [f"source {name}: no {f}" for f in SOURCE_FIELDS if not str(source.get(f, "")).strip()]


def check_doc(rel: str, text: str, figures: dict[str, Any]) -> tuple[list[str], set[str], set[str]]:
    """What in one doc differs from the file; and the figures and blocks it quotes."""
    problems, used_figs, used_blocks = [], set(), set()
    for m in INLINE.finditer(text):
        name, quoted = m.group(1), m.group(2)
        used_figs.add(name)
        fig = figures["figures"].get(name)
        if fig is None:
            problems.append(f"{rel}: fig:{name} is not in docs/figures.json")
        elif quoted != fig["value"]:
            problems.append(f"{rel}: fig:{name} reads {quoted!r}, docs/figures.json has {fig['value']!r}")
    for m in BLOCK.finditer(text):
        name = m.group(1)
        used_blocks.add(name)
        block = figures["blocks"].get(name)
        if block is None:
            problems.append(f"{rel}: figs:{name} is not in docs/figures.json")
            continue
        quoted, recorded = numbers(m.group(2)), block["values"]
        if quoted != recorded:
            at = next((i for i, (a, b) in enumerate(zip(quoted, recorded, strict=False)) if a != b),
                      min(len(quoted), len(recorded)))
            problems.append(f"{rel}: figs:{name} number {at + 1} reads {quoted[at:at + 3]}, docs/figures.json has "
                            f"{recorded[at:at + 3]} ({len(quoted)} numbers quoted, {len(recorded)} recorded)")
    opened = len(re.findall(r"<!--figs:", text))
    if opened != len(list(BLOCK.finditer(text))) or opened != len(re.findall(r"<!--/figs-->", text)):
        problems.append(f"{rel}: a figs marker is not on a line of its own or not closed")
    if rel in STRICT_DOCS:
        problems += [f"{rel}:{where} looks measured and is in no marker" for where in unmarked(text)]
    return problems, used_figs, used_blocks


def check(docs: dict[str, str], figures: dict[str, Any]) -> list[str]:
    """Every difference between the docs' quotes and the file, and every figure without a source."""
    problems = [p for name, src in figures["sources"].items() for p in check_source(name, src)]
    for kind in ("figures", "blocks"):
        problems += [f"{kind} {name}: source {entry.get('source')!r} is not in sources"
                     for name, entry in figures[kind].items() if entry.get("source") not in figures["sources"]]
    used_figs: set[str] = set()
    used_blocks: set[str] = set()
    for rel, text in docs.items():
        found, figs, blocks = check_doc(rel, text, figures)
        problems += found
        used_figs |= figs
        used_blocks |= blocks
    problems += [f"figures {n}: quoted nowhere (delete it)" for n in sorted(set(figures["figures"]) - used_figs)]
    problems += [f"blocks {n}: quoted nowhere (delete it)" for n in sorted(set(figures["blocks"]) - used_blocks)]
    return problems


def render(text: str, figures: dict[str, Any]) -> str:
    """The doc with every quote rewritten from the file (a block whose count of numbers differs is left)."""
    def inline(m: re.Match[str]) -> str:
        fig = figures["figures"].get(m.group(1))
        return m.group(0) if fig is None else f"<!--fig:{m.group(1)}-->{fig['value']}<!--/fig-->"

    def block(m: re.Match[str]) -> str:
        entry = figures["blocks"].get(m.group(1))
        body = m.group(2)
        if entry is None or len(numbers(body)) != len(entry["values"]):
            return m.group(0)
        values = iter(entry["values"])
        parts = re.split(r"(`[^`\n]*`|<!--fig:.*?<!--/fig-->)", body)
        body = "".join(p if i % 2 else NUMBER.sub(lambda _: next(values), p) for i, p in enumerate(parts))
        return f"<!--figs:{m.group(1)}-->\n{body}<!--/figs-->"

    return BLOCK.sub(block, INLINE.sub(inline, text))


def read_docs(root: Path = ROOT) -> dict[str, str]:
    return {rel: (root / rel).read_text() for rel in DOCS if (root / rel).exists()}


def this_machine() -> str:
    """Cores and CPU model, as a source's `machine` (the load matters too: say it in the command or note)."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
             if line.startswith("model name")]
    return f"{os.cpu_count()} cores, {names[0] if names else platform.machine()}"


def set_figure(figures: dict[str, Any], name: str, value: str, *, source: str, benchmark: str, command: str,
               commit: str) -> None:
    """Record one figure from a run made now, on this machine (what a benchmark calls after measuring)."""
    figures["sources"][source] = {"benchmark": benchmark, "command": command,
                                  "date": datetime.date.today().isoformat(),
                                  "machine": this_machine(), "commit": commit}
    figures["figures"][name] = {"value": value, "source": source}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("check", help="list every quote that differs from docs/figures.json (exit 1 if any)")
    sub.add_parser("write", help="rewrite every quote in the docs from docs/figures.json")
    s = sub.add_parser("set", help="record one figure measured now")
    s.add_argument("name")
    s.add_argument("value", help="as the docs show it, e.g. '1.46' or '0.65×'")
    s.add_argument("--source", required=True, help="a name for the run, e.g. peers-2026-12-07")
    s.add_argument("--benchmark", required=True)
    s.add_argument("--command", required=True)
    s.add_argument("--commit", required=True, help="the commit the run measured")
    args = p.parse_args()
    figures = load()
    if args.action == "set":
        set_figure(figures, args.name, args.value, source=args.source, benchmark=args.benchmark,
                   command=args.command, commit=args.commit)
        FIGURES.write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
    elif args.action == "write":
        for rel, text in read_docs().items():
            new = render(text, figures)
            if new != text:
                (ROOT / rel).write_text(new)
                print(f"rewrote {rel}")
    problems = check(read_docs(), figures)
    print("\n".join(problems) or "every quoted figure matches docs/figures.json")
    sys.exit(1 if problems and args.action == "check" else 0)


if __name__ == "__main__":
    main()
