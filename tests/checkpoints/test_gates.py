"""The validation gate with default settings (SQLite, a local store): every kind of garbage
checkpoint is refused and the serving version stays; a retrained drafter passes; an expected
change is scored on the eval set; the canary comes from the variant's recent jobs; the starting
directory is a version, so rollback always has a target."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoints.garbage import BASE, GARBAGE, other_tokenizer, retrained_drafter
from tests.checkpoints.test_registry import ROOT, publish, settings_for, validate
from yue2_jobs.checkpoints import registry
from yue2_jobs.checkpoints.gates import degenerate
from yue2_jobs.checkpoints.validate import gate_for
from yue2_jobs.db.models import CheckpointState, Job, JobStatus
from yue2_jobs.db.session import utcnow

REASONS = {
    "random weights": "of its outputs are degenerate",
    "another tokenizer": "its tokenizer is not the serving version's",
    "all EOS": "outputs are degenerate (the serving version's: 0%), e.g. empty",
    "one token repeated": "e.g. one token repeated",
    "replacement characters": "e.g. mostly replacement characters",
    "NaN weight": "holds NaN or Inf values",
    "broken drafter": "its drafter is broken: hybrid_fast outputs agree 0.0",
}


def seeded(env: Any, variant: str = "base") -> Any:
    session, store, url, _ = env
    row = registry.ensure_seed(session, store=store, store_url=url, variant=variant, directory=ROOT / "checkpoints" /
                               variant)
    assert row is not None and row.state == CheckpointState.ACTIVE
    return row


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_is_refused_and_the_serving_version_stays(env: Any, tmp_path: Path, kind: str) -> None:
    session = env[0]
    seed = seeded(env)
    bad = publish(env, GARBAGE[kind](tmp_path / "bad"), variant="base")
    assert validate(env, bad) is None
    assert bad.state == CheckpointState.FAILED and REASONS[kind] in bad.error, bad.error
    assert registry.active(session, "base").version == seed.version


def test_a_retrained_drafter_passes_and_says_with_what(env: Any, tmp_path: Path) -> None:
    seeded(env)
    good = publish(env, retrained_drafter(tmp_path / "good"), variant="base")
    assert validate(env, good) is not None
    assert "agreement 1.00, loss gap +0.00" in good.report and "0% of 16 outputs degenerate" in good.report
    assert re.search(r"drafter: hybrid_fast agrees 0\.[6-9]\d with ar \(serving 0\.79\)", good.report), good.report


def test_a_tokenizer_change_must_be_said_and_is_then_judged_on_its_outputs(env: Any, tmp_path: Path) -> None:
    session, store, url, _ = env
    seeded(env)
    said = registry.publish(session, store=store, store_url=url, directory=other_tokenizer(tmp_path / "tok"),
                            variant="base", tokenizer_change=True)
    # Said: not refused for its tokenizer; but base's weights read 200 tokens as others now, so its
    # outputs stray from the serving version's.
    assert validate(env, said) is None and "strays from the serving version" in said.error, said.error
    registry.publish(session, store=store, store_url=url, directory=tmp_path / "tok", variant="base",
                     tokenizer_change=True, expect_change=True)
    assert validate(env, said, validation_max_rouge_drop=100.0) is not None
    assert "tokenizer changed: 200 of its 4096 vocabulary entries" in said.report, said.report


def test_an_expected_change_is_scored_on_the_eval_set(env: Any, tmp_path: Path) -> None:
    session, store, url, _ = env
    seeded(env)
    # legal's weights as a new base: far from base's outputs, and far worse on base's eval set.
    unsaid = publish(env, ROOT / "checkpoints" / "legal", variant="base")
    assert validate(env, unsaid) is None and "strays from the serving version" in unsaid.error
    assert "publish with --expect-change" in unsaid.error
    said = registry.publish(session, store=store, store_url=url, directory=ROOT / "checkpoints" / "legal",
                            variant="base", expect_change=True)  # the failed version, published again
    assert said.id == unsaid.id and said.state == CheckpointState.STAGED
    assert validate(env, said) is None and "points under the serving version's" in said.error, said.error
    registry.publish(session, store=store, store_url=url, directory=ROOT / "checkpoints" / "legal", variant="base",
                     expect_change=True)
    assert validate(env, said, validation_max_rouge_drop=50.0) is not None
    assert "expected change: ROUGE-L" in said.report


def test_the_canary_is_drawn_from_the_variants_recent_jobs(env: Any, tmp_path: Path) -> None:
    session, store, _, tmp = env
    now = utcnow()
    for i, (variant, status) in enumerate([("base", JobStatus.SUCCEEDED), ("base", JobStatus.FAILED),
                                           ("legal", JobStatus.SUCCEEDED), ("base", JobStatus.SUCCEEDED)]):
        session.add(Job(id=f"job_{i}", tenant="t", kind="summarize", status=status, variant=variant, params={},
                        input_text=f"input {i} of {variant}", created_at=now, finished_at=now))
    session.commit()
    gate = gate_for(session, settings=settings_for(tmp, validation_canary_items=4), store=store, variant="base")
    assert gate.canary[:2] in (["input 0 of base", "input 3 of base"], ["input 3 of base", "input 0 of base"])
    # topped up from the eval set; no version yet, so judged against the shipped directory
    assert len(gate.canary) == 4 and gate.serving_dir is not None and gate.serving_dir.resolve() == BASE.resolve()
    assert len(gate.eval_rows) == 16


def test_a_deployment_with_an_active_version_gets_its_seed_as_the_rollback_target(env: Any, tmp_path: Path) -> None:
    session, store, url, _ = env
    first = publish(env, retrained_drafter(tmp_path / "first"), variant="base")
    assert validate(env, first) is not None
    registry.activate(session, first)  # published before seeds were registered: the only version
    seed = registry.ensure_seed(session, store=store, store_url=url, variant="base", directory=BASE)
    assert seed is not None and seed.state == CheckpointState.RETIRED
    assert registry.ensure_seed(session, store=store, store_url=url, variant="base", directory=BASE) is None  # once
    assert registry.rollback(session, "base").version == seed.version


@pytest.mark.parametrize(("text", "ids", "reason"), [
    ("", [], "empty"),
    ("\ufffd\ufffd\ufffda", [5, 6, 7, 8], "mostly replacement characters"),
    ("the the the the the", [9, 9, 9, 9, 9], "one token repeated"),
    ("a b c a b c a b c a b", [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2], "a short loop"),
    ("Return the number of rows in the table.", list(range(10)), None),
    ("MIT License (MIT) 1.000", [4, 5, 6, 7], None),
])
def test_degenerate_outputs_are_named(text: str, ids: list[int], reason: str | None) -> None:
    assert degenerate(text, ids) == reason


def test_yue2_checkpoints_adds_to_the_shipped_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    from yue2_jobs.core.config import Settings

    monkeypatch.setenv("YUE2_CHECKPOINTS", '{"cnn": "/models/cnn"}')
    assert sorted(Settings().checkpoints) == ["base", "cnn", "legal"]
    monkeypatch.setenv("YUE2_CHECKPOINTS", '{"base": "/models/mine"}')  # a shipped name: replaces that one
    assert Settings().checkpoints["base"] == Path("/models/mine") and "legal" in Settings().checkpoints
    monkeypatch.setenv("YUE2_CHECKPOINTS", '{"cnn": "/models/cnn"}')
    monkeypatch.setenv("YUE2_CHECKPOINTS_ONLY", "true")
    monkeypatch.setenv("YUE2_DEFAULT_VARIANT", "cnn")
    assert sorted(Settings().checkpoints) == ["cnn"]
