"""Checkpoints that must never serve, and one that must: each built from the shipped `base` in a
few seconds, for the validation tests and `benchmarks`-style probes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from tests.shipped import ROOT
from yue2_jobs.model.checkpoint import load_checkpoint, save_checkpoint, write_manifest
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration

BASE = ROOT / "checkpoints" / "base"


def random_weights(dst: Path) -> Path:
    """A freshly initialised model with base's config and tokenizer (what a failed import gives)."""
    model, tokenizer = load_checkpoint(BASE)
    torch.manual_seed(1)
    return save_checkpoint(Yue2ForConditionalGeneration(model.config).eval(), tokenizer, dst)


def other_tokenizer(dst: Path) -> Path:
    """Base's weights with a tokenizer that gives 200 of its entries other ids (same size)."""
    shutil.copytree(BASE, dst)
    path = dst / "tokenizer.json"
    body = json.loads(path.read_text())
    vocab = body["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)[300:500]
    ids = [vocab[t] for t in tokens]
    for token, new_id in zip(tokens, reversed(ids), strict=True):
        vocab[token] = new_id
    path.write_text(json.dumps(body, ensure_ascii=False))
    write_manifest(dst)
    return dst


def _biased(dst: Path, token: Callable[[Yue2ForConditionalGeneration], int]) -> Path:
    model, tokenizer = load_checkpoint(BASE)
    with torch.no_grad():
        model.final_logits_bias[..., token(model)] = 1e4
    return save_checkpoint(model, tokenizer, dst)


def all_eos(dst: Path) -> Path:
    """Ends every output at its first step."""
    return _biased(dst, lambda m: m.config.eos_token_id)


def one_token(dst: Path) -> Path:
    """Writes one token over and over."""
    return _biased(dst, lambda m: 1000)


def replacement_characters(dst: Path) -> Path:
    """Writes a lone UTF-8 continuation byte over and over: text of U+FFFD."""
    model, tokenizer = load_checkpoint(BASE)
    byte = next(i for i in range(len(tokenizer)) if tokenizer.decode([i]) == "\ufffd")
    with torch.no_grad():
        model.final_logits_bias[..., byte] = 1e4
    return save_checkpoint(model, tokenizer, dst)


def nan_weight(dst: Path) -> Path:
    """One weight holds a NaN."""
    model, tokenizer = load_checkpoint(BASE)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "fc1" in n).view(-1)[0] = float("nan")
    return save_checkpoint(model, tokenizer, dst)


def broken_drafter(dst: Path) -> Path:
    """Base's encoder and AR branch with random draft layers and a confidence head sure of every
    draft: every `ar` output as base's, `hybrid_fast` garbage."""
    model, tokenizer = load_checkpoint(BASE)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("nar_"):
                p.normal_(0, 0.5)
            elif name == "confidence_head.fc2.bias":
                p.fill_(20.0)
    return save_checkpoint(model, tokenizer, dst)


GARBAGE: dict[str, Callable[[Path], Path]] = {
    "random weights": random_weights, "another tokenizer": other_tokenizer, "all EOS": all_eos,
    "one token repeated": one_token, "replacement characters": replacement_characters, "NaN weight": nan_weight,
    "broken drafter": broken_drafter,
}


def retrained_drafter(dst: Path, src: Path = BASE) -> Path:
    """`src` with its draft branch changed and its encoder and AR branch untouched, as `make
    drafters` leaves a checkpoint: every `ar` output is the same, so it must pass."""
    model, tokenizer = load_checkpoint(src)
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("nar_", "confidence_head")):
                p.add_(0.01 * torch.randn_like(p))
    return save_checkpoint(model, tokenizer, dst)
