"""Corpora: the committed data is exactly what `make data` builds; ROUGE handles CJK."""

from __future__ import annotations

import hashlib

import pytest
from rouge_score import rouge_scorer

from tests.tiny_models import ROOT
from yue2_jobs.training.data import MAX_HELD_OUT_ROWS, build_all, read_split
from yue2_jobs.training.evaluate import CjkAwareTokenizer, rouge
from yue2_jobs.training.sources import parse_translation
from yue2_jobs.training.sources import split_docstring as _split_docstring


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


def test_committed_legal_corpus_is_reproducible(tmp_path):
    """`make data` checks every file (general needs Debian's index, fetched once); this rebuilds legal."""
    sums = build_all(tmp_path, cache=tmp_path / "cache", corpora=("legal",))
    committed = dict(line.split()[::-1] for line in (ROOT / "data" / "SHA256SUMS").read_text().splitlines())
    assert sums == {k: v for k, v in committed.items() if k.startswith("legal/")}
    for rel, digest in committed.items():
        assert hashlib.sha256((ROOT / "data" / rel).read_bytes()).hexdigest() == digest


def test_debian_descriptions_parse_into_synopsis_and_paragraphs():
    text = ("Package: foo\nDescription-md5: 0\nDescription-en: frobnicate widgets - tools\n"
            " Foo frobnicates widgets\n quickly.\n .\n This package contains the tools.\n\n"
            "Package: bare\nDescription-en: no long description\n")
    assert list(parse_translation(text)) == [
        ("foo", "frobnicate widgets - tools", "Foo frobnicates widgets quickly.\nThis package contains the tools."),
        ("bare", "no long description", "")]


def test_general_corpus_is_large_mixed_and_held_out_cleanly():
    train = read_split(ROOT / "data", "general", "train")
    assert len(train) >= 50_000
    sources = {r["source"].split("/")[0] == "debian" for r in train}
    assert sources == {True, False}  # Debian descriptions and docstrings
    seen = {(r["text"], r["summary"]) for r in train}
    texts = {r["text"] for r in train}
    for split in ("eval", "test"):
        held_out = read_split(ROOT / "data", "general", split)
        assert 0 < len(held_out) <= MAX_HELD_OUT_ROWS
        assert not any((r["text"], r["summary"]) in seen or r["text"] in texts for r in held_out)


def test_held_out_splits_do_not_overlap_train():
    for corpus in ("general", "legal"):
        train = {(r["text"], r["summary"]) for r in read_split(ROOT / "data", corpus, "train")}
        for split in ("eval", "test"):
            held_out = read_split(ROOT / "data", corpus, split)
            assert held_out and not any((r["text"], r["summary"]) in train for r in held_out)


def test_rouge_scores_chinese_where_the_default_tokenizer_cannot():
    pred, ref = "今天天气很好", "今天天气不错"
    assert rouge_scorer.RougeScorer(["rouge1"]).score(ref, pred)["rouge1"].fmeasure == 0.0
    result = rouge([pred], [ref])
    assert result.rouge1 == pytest.approx(4 / 6)
    assert rouge([pred, pred], [ref, pred]).distinct == 0.5
    assert CjkAwareTokenizer().tokenize("Hello 世界!") == ["hello", "世", "界"]
