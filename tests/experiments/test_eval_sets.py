"""The shipped eval sets as batch files: every line one the batch parser takes, with its reference,
and the metadata that names the set and its domain."""

from __future__ import annotations

from pathlib import Path

from yue2_jobs.core.config import Settings
from yue2_jobs.core.paths import DATA
from yue2_jobs.experiments.eval_sets import export_eval_sets
from yue2_jobs.jobs.lines import parse_batch_file
from yue2_jobs.training.data import read_split


def test_every_shipped_set_is_written_batch_ready(tmp_path: Path) -> None:
    written = export_eval_sets(tmp_path)
    assert [(s.path.name, s.metadata) for s in written] == [
        ("legal_eval.jsonl", {"name": "legal eval", "domain": "legal"}),
        ("general_eval.jsonl", {"name": "general eval", "domain": "general"})]
    settings = Settings(home=tmp_path / "home")
    for s in written:
        corpus = s.metadata["domain"]
        rows = read_split(DATA, corpus, "eval")
        parsed = parse_batch_file(s.path.read_bytes(), endpoint="/v1/summarize", settings=settings, in_experiment=True)
        assert s.lines == len(parsed) == len(rows) and all(p.error is None for p in parsed)
        assert [p.custom_id for p in parsed[:2]] == [f"{corpus}-0", f"{corpus}-1"]
        assert [p.reference for p in parsed] == [r["summary"] for r in rows]


def test_items_keeps_the_first_of_each(tmp_path: Path) -> None:
    written = export_eval_sets(tmp_path, corpora=("general",), items=3)
    assert [s.lines for s in written] == [3] and len(written[0].path.read_text().splitlines()) == 3
