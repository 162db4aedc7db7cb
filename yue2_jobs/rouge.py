"""ROUGE F1 with a tokenizer that sees CJK text (no torch: the API imports it for reports).

rouge-score's default tokenizer keeps only [a-z0-9] runs, so Chinese text would score 0;
`CjkAwareTokenizer` makes every CJK character a token and keeps Unicode word runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rouge_score import rouge_scorer

from yue2_jobs.sentences import is_degenerate

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
    degenerate: float = 0.0  # share of predictions that loop or stutter (`sentences.is_degenerate`)


def pair_scores(predictions: list[str], references: list[str]) -> list[dict[str, float]]:
    """ROUGE-1/2/L F1 (0..1) of each prediction against its reference."""
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=CjkAwareTokenizer())
    return [{k: s.fmeasure for k, s in scorer.score(ref, pred).items()}
            for pred, ref in zip(predictions, references, strict=True)]


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
    degenerate = sum(is_degenerate(p, r) for p, r in zip(predictions, references, strict=True)) / n
    return RougeResult(totals["rouge1"] / n, totals["rouge2"] / n, totals["rougeL"] / n, n, len(set(predictions)) / n,
                       degenerate)
