"""The shipped eval sets as batch input files (`yue2 ab export-eval`, the A/B demo): one request per
line, its reference summary beside the body for ROUGE, and the `metadata` (name and domain) the
batch should carry so the report shows it as its own eval set and checks each arm's domain.

Each shipped set's domain is its corpus (`general`, `legal`): the corpus the shipped checkpoint of
that domain was trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from yue2_jobs.core.paths import DATA
from yue2_jobs.training.data import read_split

SHIPPED_SETS = ("legal", "general")


@dataclass(frozen=True)
class ExportedSet:
    path: Path
    lines: int
    metadata: dict[str, str]  # for the batch: {"name": "legal eval", "domain": "legal"}


def set_metadata(corpus: str) -> dict[str, str]:
    return {"name": f"{corpus} eval", "domain": corpus}


def batch_lines(corpus: str, *, items: int | None = None, data: Path = DATA) -> list[str]:
    """The eval split of `corpus` as batch-file lines (`custom_id` `<corpus>-<i>`), the first `items`."""
    rows = read_split(data, corpus, "eval")[:items]
    return [json.dumps({"custom_id": f"{corpus}-{i}", "method": "POST", "url": "/v1/summarize",
                        "body": {"input": r["text"]}, "reference": r["summary"]}, ensure_ascii=False) + "\n"
            for i, r in enumerate(rows)]


def export_eval_sets(out: Path, *, corpora: tuple[str, ...] = SHIPPED_SETS, items: int | None = None,
                     data: Path = DATA) -> list[ExportedSet]:
    """Write `<corpus>_eval.jsonl` under `out` for each corpus."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for corpus in corpora:
        lines = batch_lines(corpus, items=items, data=data)
        path = out / f"{corpus}_eval.jsonl"
        path.write_text("".join(lines), encoding="utf-8")
        written.append(ExportedSet(path, len(lines), set_metadata(corpus)))
    return written
