"""ROUGE evaluation of a checkpoint on a held-out split.

rouge-score's default tokenizer keeps only [a-z0-9] runs, so Chinese text would score 0;
`CjkAwareTokenizer` makes every CJK character a token and keeps Unicode word runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from rouge_score import rouge_scorer
from transformers import PreTrainedTokenizerBase

from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.model.data import read_split
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration
from yue2_jobs.model.stats import SequenceStats

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")


class CjkAwareTokenizer:
    """Lower-cases; one token per CJK character, one per run of other word characters."""

    def tokenize(self, text: str) -> list[str]:
        return _TOKEN.findall(text.lower())


@dataclass(frozen=True)
class RougeResult:
    rouge1: float
    rouge2: float
    rougeL: float
    count: int
    distinct: float = 1.0  # share of unique predictions: low means outputs ignore the input


def rouge(predictions: list[str], references: list[str]) -> RougeResult:
    """Mean ROUGE-1/2/L F1 (0..1) over aligned prediction/reference pairs."""
    if len(predictions) != len(references) or not predictions:
        raise ValueError(f"need equally many predictions and references, got {len(predictions)} and {len(references)}")
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=CjkAwareTokenizer())
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for pred, ref in zip(predictions, references, strict=True):
        for key, score in scorer.score(ref, pred).items():
            totals[key] += score.fmeasure
    n = len(predictions)
    return RougeResult(totals["rouge1"] / n, totals["rouge2"] / n, totals["rougeL"] / n, n, len(set(predictions)) / n)


@torch.inference_mode()
def summarize(model: Yue2ForConditionalGeneration, tokenizer: PreTrainedTokenizerBase, texts: list[str], *,
              batch_size: int = 32, max_new_tokens: int = 48, mode: str = "ar",
              stats_out: list[SequenceStats] | None = None) -> list[str]:
    """Greedy summaries in input order; inputs are length-sorted into batches to cut padding.

    `stats_out`, when given, receives each text's decoding `SequenceStats`, in input order.
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
                             return_dict_in_generate=True)
        for i, text, st in zip(idx, tokenizer.batch_decode(res.sequences, skip_special_tokens=True), res.stats,
                               strict=True):
            out[i], stats[i] = text.strip(), st
    if stats_out is not None:
        stats_out.extend(stats[i] for i in range(len(texts)))
    return [out[i] for i in range(len(texts))]


def evaluate_checkpoint(checkpoint: str | Path, *, data_dir: str | Path, corpus: str, limit: int | None = None,
                        batch_size: int = 32, max_new_tokens: int = 48, mode: str = "ar") -> RougeResult:
    model, tokenizer = load_checkpoint(checkpoint)
    rows = read_split(data_dir, corpus, "eval")[:limit]
    preds = summarize(model, tokenizer, [r["text"] for r in rows], batch_size=batch_size,
                      max_new_tokens=max_new_tokens, mode=mode)
    return rouge(preds, [r["summary"] for r in rows])
