"""Tiny randomly initialised BART and YuE2 models (no downloads): fixtures that `tests/model`,
`tests/decode` and `tests/training` take through their conftest, and the input helpers."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration

from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.model import Yue2Config, Yue2ForConditionalGeneration

ROOT = Path(__file__).resolve().parents[1]
BART_SHAPE = dict(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128,
                  init_std=0.3)
SOURCE_LENGTHS = [20, 13, 7, 3, 17, 9]
MAX_NEW = 24


def varied_inputs(vocab: int = 512, lengths: list[int] = SOURCE_LENGTHS, pad: int = 1) -> tuple[torch.Tensor, ...]:
    """A right-padded batch of different-length inputs, each <s> ... </s>."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, vocab, (len(lengths), max(lengths)), generator=g)
    mask = torch.ones_like(ids)
    for i, n in enumerate(lengths):
        ids[i, 0], ids[i, n - 1] = 0, 2
        ids[i, n:], mask[i, n:] = pad, 0
    return ids, mask


@pytest.fixture(scope="session")
def bart_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return varied_inputs()


@pytest.fixture(scope="session")
def varied_bart(bart_batch: tuple[torch.Tensor, torch.Tensor]) -> BartForConditionalGeneration:
    """A random BART whose greedy outputs end at different steps for different rows.

    Random weights decode into a few repeated tokens and rarely emit EOS, so the fixture
    probes one greedy run and then declares as EOS a token that some rows reach early and
    others never do: a batch that exercises both early stops and the length limit.
    """
    torch.manual_seed(0)
    probe = BartForConditionalGeneration(BartConfig(**BART_SHAPE)).eval()
    with torch.no_grad():
        probe.final_logits_bias.normal_(0, 2.0)
    ids, mask = bart_batch
    seqs = probe.generate(input_ids=ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW)
    body = seqs[:, 2:-1]
    for token in torch.unique(body).tolist():
        if token < 4:
            continue
        rows = (body == token).any(1)
        if 2 <= int(rows.sum()) <= len(rows) - 2:
            eos = token
            break
    else:  # pragma: no cover - the probe depends only on fixed seeds
        raise AssertionError("no token separates the rows; change the fixture seed")
    bart = BartForConditionalGeneration(BartConfig(**BART_SHAPE, eos_token_id=eos)).eval()
    bart.load_state_dict(probe.state_dict())
    bart.generation_config.eos_token_id = bart.generation_config.forced_eos_token_id = eos
    return bart


@pytest.fixture(scope="session")
def tiny_config() -> Yue2Config:
    return Yue2Config(vocab_size=300, d_model=64, encoder_layers=2, decoder_layers=2, nar_layers=1,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96,
                      max_position_embeddings=64, nar_block_size=3)


@pytest.fixture(scope="session")
def tiny_yue2(tiny_config: Yue2Config) -> Yue2ForConditionalGeneration:
    torch.manual_seed(0)
    model = Yue2ForConditionalGeneration(tiny_config).eval()
    with torch.no_grad():  # a random model emits EOS at once; keep the sequences going
        model.final_logits_bias.normal_(0, 1.0)
        model.final_logits_bias[0, tiny_config.eos_token_id] = -5.0
    return model


def batches_of(ids: torch.Tensor, mask: torch.Tensor, size: int):
    for i in range(0, ids.shape[0], size):
        width = int(mask[i : i + size].sum(1).max())  # no all-padding columns, as a tokenizer would give
        yield ids[i : i + size, :width], mask[i : i + size, :width]


def random_inputs(n: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = random.Random(seed)
    return varied_inputs(vocab=vocab, lengths=[rng.randint(2, 30) for _ in range(n)])


_SESSIONS: dict[int, tuple[object, DecodeSession]] = {}


def session_of(model: Yue2ForConditionalGeneration) -> DecodeSession:
    """The test run's one `DecodeSession` over `model` (as a worker holds one per model)."""
    held = _SESSIONS.get(id(model))
    if held is None or held[0] is not model:
        held = _SESSIONS[id(model)] = (model, DecodeSession(model))
    return held[1]


def generate(model: Yue2ForConditionalGeneration, *, input_ids: torch.Tensor,
             attention_mask: torch.Tensor | None = None, return_dict_in_generate: bool = False,
             **kwargs: Any) -> Any:
    """`session_of(model).generate(...)`: its `sequences`, or with `return_dict_in_generate` the
    whole output (the shape of Hugging Face's `generate`, which these tests were written against).
    The mode defaults to `hybrid`, the default of the function these tests first called."""
    if "params" not in kwargs:
        kwargs.setdefault("mode", "hybrid")
    out = session_of(model).generate(input_ids, attention_mask, **kwargs)
    return out if return_dict_in_generate else out.sequences
