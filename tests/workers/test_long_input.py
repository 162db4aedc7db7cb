"""long_input on the shipped base checkpoint: windows, truncate, reject and chunk (map-reduce)."""

from __future__ import annotations

import pytest

from tests.tiny_models import ROOT
from workers.job_io import JobInput
from workers.long_input import InputTooLongError, count_tokens, windows
from yue2_jobs.core.config import Settings
from yue2_jobs.training.data import read_split


@pytest.fixture(scope="module")
def runner():
    from workers.runner import ModelRunner

    return ModelRunner(variant="base", settings=Settings(batching="static"), directory=ROOT / "checkpoints" / "base")


@pytest.fixture(scope="module")
def long_text() -> str:
    """About 3,000 words of real descriptions, one after another."""
    words, texts = 0, []
    for row in read_split(ROOT / "data", "general", "test"):
        texts.append(row["text"])
        words += len(row["text"].split())
        if words >= 3000:
            return " ".join(texts)
    raise AssertionError("the test split holds fewer than 3,000 words")


def _job(text: str, job_id: str = "j", **params) -> JobInput:
    return JobInput.of(id=job_id, kind="summarize", text=text,
                       params={"mode": "hybrid", "max_new_tokens": 48, **params})


def test_windows_fit_and_keep_every_word_in_order(runner, long_text):
    limit = runner.max_input_tokens
    parts = windows(runner.tokenizer, long_text, limit)
    assert len(parts) > 5
    assert all(count_tokens(runner.tokenizer, p) <= limit for p in parts)
    assert " ".join(parts).split() == long_text.split()


def test_a_sentence_or_word_longer_than_a_window_is_cut(runner):
    text = "Start. " + " ".join(["word"] * 400) + " " + "x" * 3000 + ". End."
    parts = windows(runner.tokenizer, text, 64)
    assert all(count_tokens(runner.tokenizer, p) <= 64 for p in parts)
    assert "".join(parts).replace(" ", "") == text.replace(" ", "")


def test_limit_comes_from_the_checkpoint(runner):
    model_limit = runner.session.model.config.max_position_embeddings
    assert runner.max_input_tokens == min(runner.tokenizer.model_max_length, model_limit)


def test_truncate_is_the_default_and_is_recorded(runner, long_text):
    out = runner.run([_job(long_text)])[0]
    n = count_tokens(runner.tokenizer, long_text)
    assert out.input_truncated and out.input_tokens == n > out.input_tokens_used == runner.max_input_tokens
    short = runner.run([_job("A short input that fits.")])[0]
    assert not short.input_truncated and short.input_tokens == short.input_tokens_used


def test_reject_names_the_limit(runner, long_text):
    err = runner.run([_job(long_text, long_input="reject")])[0]
    assert isinstance(err, InputTooLongError) and err.code == "input_too_long"
    assert f"over the limit of {runner.max_input_tokens} tokens" in str(err) and "input is" in str(err)
    assert not isinstance(runner.run([_job("Short enough.", long_input="reject")])[0], Exception)


def test_chunk_gives_one_summary_and_records_chunks(runner, long_text):
    out, alone = runner.run([_job(long_text, long_input="chunk"), _job("Short enough.", "k", long_input="chunk")])
    expected_chunks = len(windows(runner.tokenizer, long_text, runner.max_input_tokens))
    assert out.chunks == expected_chunks > 5
    assert out.text and not out.input_truncated and out.input_tokens == count_tokens(runner.tokenizer, long_text)
    # every window and the reduce pass cost decoder steps: far more than one summary's
    assert out.decoder_steps > expected_chunks
    assert alone.chunks is None and not alone.input_truncated
