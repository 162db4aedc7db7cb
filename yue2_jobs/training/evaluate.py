"""ROUGE evaluation of a checkpoint on a held-out split (the scoring itself: `yue2_jobs.rouge`)."""

from __future__ import annotations

from pathlib import Path

from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.rouge import CjkAwareTokenizer, RougeResult, rouge
from yue2_jobs.sentences import lead
from yue2_jobs.training.data import read_split

__all__ = ["CjkAwareTokenizer", "RougeResult", "evaluate_checkpoint", "lead_baseline", "rouge"]


def evaluate_checkpoint(checkpoint: str | Path, *, data_dir: str | Path, corpus: str, split: str = "eval",
                        limit: int | None = None, batch_size: int = 32,
                        params: DecodingParams | None = None, dtype: str = "float32") -> RougeResult:
    """ROUGE of `checkpoint`'s summaries (decoded as `params` says, on the CPU in `dtype`: `float32`
    or `int8`) against the split's references."""
    session = DecodeSession.load(checkpoint, device="cpu", dtype=dtype)
    rows = read_split(data_dir, corpus, split)[:limit]
    preds = session.summarize([r["text"] for r in rows], params, batch_size=batch_size)
    return rouge(preds, [r["summary"] for r in rows])


def lead_baseline(*, data_dir: str | Path, corpus: str, split: str = "eval", limit: int | None = None) -> RougeResult:
    """The lead-1 baseline: each input's first sentence as its summary, no model."""
    rows = read_split(data_dir, corpus, split)[:limit]
    return rouge([lead(r["text"]) for r in rows], [r["summary"] for r in rows])
