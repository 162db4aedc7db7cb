"""Domains: what a checkpoint's manifest declares, what the shipped ones say, and the warnings."""

from __future__ import annotations

import json
from pathlib import Path

from yue2_jobs.core.paths import CHECKPOINTS
from yue2_jobs.experiments.domains import arm_domains, checkpoint_domain, clean_domain, domain_warnings


def test_the_shipped_checkpoints_declare_the_corpus_they_were_trained_on() -> None:
    assert arm_domains(["base", "legal", "mine"], {"base": CHECKPOINTS / "base", "legal": CHECKPOINTS / "legal"}) \
        == {"base": "general", "legal": "legal", "mine": None}


def test_a_manifest_note_is_read_and_anything_else_is_no_domain(tmp_path: Path) -> None:
    assert checkpoint_domain(tmp_path) is None  # no manifest
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "yue2-manifest/1", "files": {}, "domain": " News "}))
    assert checkpoint_domain(tmp_path) == "news"
    (tmp_path / "manifest.json").write_text("{not json")
    assert checkpoint_domain(tmp_path) is None
    assert clean_domain(3) is None and clean_domain(" ") is None and clean_domain("x" * 65) is None


def test_a_mismatch_warns_and_what_is_undeclared_is_said() -> None:
    found = domain_warnings(set_label="news eval", set_domain="news",
                            arms={"base": "news", "legal": "legal", "mine": None})
    assert [(w["kind"], w["variant"]) for w in found] == [("domain_mismatch", "legal"), ("domain_unchecked", "mine")]
    assert found[0]["message"].startswith("legal was trained for legal and is evaluated here on news eval, a news set")
    unchecked = domain_warnings(set_label="s", set_domain=None, arms={"base": "general"})
    assert [w["kind"] for w in unchecked] == ["domain_unchecked"]
