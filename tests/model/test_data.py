"""Corpora: the committed data is exactly what `make data` builds; ROUGE handles CJK."""

from __future__ import annotations

import hashlib

import pytest
from rouge_score import rouge_scorer

from tests.model.conftest import ROOT
from yue2_jobs.model.data import _split_docstring, build_all, read_split
from yue2_jobs.model.evaluate import CjkAwareTokenizer, rouge


def test_split_docstring_keeps_description_and_drops_sections():
    doc = """Compute the mean of an array along one axis.

    The mean is the sum of the elements divided by their number, computed in
    float64 for integer input so that it does not overflow.

    Args:
        axis: the axis.
    """
    summary, body = _split_docstring(doc)
    assert summary == "Compute the mean of an array along one axis."
    assert body.startswith("The mean is the sum") and "axis:" not in body


@pytest.mark.parametrize("doc", ["One line only.", "Short.\n\nToo short body.", "Ends with colon:\n\n" + "w " * 30])
def test_split_docstring_rejects_unusable(doc):
    assert _split_docstring(doc) is None


def test_committed_corpora_are_reproducible(tmp_path):
    sums = build_all(tmp_path)
    committed = dict(line.split()[::-1] for line in (ROOT / "data" / "SHA256SUMS").read_text().splitlines())
    assert sums == committed
    for rel, digest in committed.items():
        assert hashlib.sha256((ROOT / "data" / rel).read_bytes()).hexdigest() == digest


def test_eval_and_train_do_not_overlap():
    for corpus in ("general", "legal"):
        train = {(r["text"], r["summary"]) for r in read_split(ROOT / "data", corpus, "train")}
        held_out = read_split(ROOT / "data", corpus, "eval")
        assert held_out and not any((r["text"], r["summary"]) in train for r in held_out)


def test_rouge_scores_chinese_where_the_default_tokenizer_cannot():
    pred, ref = "今天天气很好", "今天天气不错"
    assert rouge_scorer.RougeScorer(["rouge1"]).score(ref, pred)["rouge1"].fmeasure == 0.0
    result = rouge([pred], [ref])
    assert result.rouge1 == pytest.approx(4 / 6)
    assert rouge([pred, pred], [ref, pred]).distinct == 0.5
    assert CjkAwareTokenizer().tokenize("Hello 世界!") == ["hello", "世", "界"]
