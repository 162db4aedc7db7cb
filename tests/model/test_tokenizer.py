"""Byte-level BPE: every UTF-8 string round-trips, with the shipped and a fresh tokenizer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tests.tiny_models import ROOT
from yue2_jobs.model.tokenizer import train_tokenizer

SAMPLES = [
    "模型把长文本压缩成一句摘要。",
    "繁體中文與日本語のテキスト、한국어도",
    "emoji 🎉👩‍👩‍👧‍👦 🇯🇵 👍🏽 done",
    "".join(chr(c) for c in range(32)) + "\x7f",
    "tabs\tand\r\nnewlines\n\n  and   runs of   spaces  ",
    "combining e\u0301 and zero\u200bwidth and \ufeffBOM",
    "",
]


@pytest.fixture(scope="module", params=["shipped", "fresh"])
def tokenizer(request):
    if request.param == "shipped":
        return AutoTokenizer.from_pretrained(ROOT / "checkpoints" / "base")
    return train_tokenizer(["plain ascii only corpus"] * 50, vocab_size=300, model_max_length=64)


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_special_ids_match_bart_layout(tokenizer):
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0, 1, 2, 3)


def test_batch_padding_is_right_sided(tokenizer):
    enc = tokenizer(["a", "a much longer input"], padding=True)
    assert enc["input_ids"][0][-1] == tokenizer.pad_token_id
    assert enc["attention_mask"][0][-1] == 0
