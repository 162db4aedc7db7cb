"""ROUGE evaluation of a checkpoint on a held-out split (the scoring itself: `yue2_jobs.rouge`)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.model.data import read_split
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration
from yue2_jobs.model.stats import SequenceStats
from yue2_jobs.rouge import CjkAwareTokenizer, RougeResult, rouge
from yue2_jobs.sentences import lead

__all__ = ["CjkAwareTokenizer", "RougeResult", "evaluate_checkpoint", "lead_baseline", "rouge", "summarize"]


@torch.inference_mode()
def summarize(model: Yue2ForConditionalGeneration, tokenizer: PreTrainedTokenizerBase, texts: list[str], *,
              batch_size: int = 32, max_new_tokens: int = 48, mode: str = "ar",
              stats_out: list[SequenceStats] | None = None, **controls: float | int | None) -> list[str]:
    """Greedy summaries in input order; inputs are length-sorted into batches to cut padding.

    `stats_out`, when given, receives each text's decoding `SequenceStats`, in input order;
    `controls` are `generate`'s repetition controls (`repetition_penalty`, `no_repeat_ngram_size`).
    """
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: dict[int, str] = {}
    stats: dict[int, SequenceStats] = {}
    max_len = min(tokenizer.model_max_length, model.config.max_position_embeddings)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        enc = tokenizer([texts[i] for i in idx], truncation=True, max_length=max_len, padding=True,
                        return_tensors="pt")
        res = model.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=max_new_tokens, mode=mode,
                             return_dict_in_generate=True, **controls)
        for i, text, st in zip(idx, tokenizer.batch_decode(res.sequences, skip_special_tokens=True), res.stats,
                               strict=True):
            out[i], stats[i] = text.strip(), st
    if stats_out is not None:
        stats_out.extend(stats[i] for i in range(len(texts)))
    return [out[i] for i in range(len(texts))]


def evaluate_checkpoint(checkpoint: str | Path, *, data_dir: str | Path, corpus: str, split: str = "eval",
                        limit: int | None = None, batch_size: int = 32, max_new_tokens: int = 48,
                        mode: str = "ar", **controls: float | int | None) -> RougeResult:
    model, tokenizer = load_checkpoint(checkpoint)
    rows = read_split(data_dir, corpus, split)[:limit]
    preds = summarize(model, tokenizer, [r["text"] for r in rows], batch_size=batch_size,
                      max_new_tokens=max_new_tokens, mode=mode, **controls)
    return rouge(preds, [r["summary"] for r in rows])


def lead_baseline(*, data_dir: str | Path, corpus: str, split: str = "eval", limit: int | None = None) -> RougeResult:
    """The lead-1 baseline: each input's first sentence as its summary, no model."""
    rows = read_split(data_dir, corpus, split)[:limit]
    return rouge([lead(r["text"]) for r in rows], [r["summary"] for r in rows])
