"""`make demo`: summarise held-out texts with the shipped `base` and `legal` checkpoints.

Runs in-process on the CPU with no servers: the embedded default until the job pipeline
lands. Shows each checkpoint on both eval sets, beside the reference summary, decoded in
`hybrid` mode (the output `ar` would give, in fewer decoder steps), with its step counts.
"""

from __future__ import annotations

import time
from pathlib import Path

from transformers.utils import logging as hf_logging

from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.model.data import read_split
from yue2_jobs.model.evaluate import summarize
from yue2_jobs.model.stats import SequenceStats, summarize_stats

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_PER_SET = 3


def main() -> None:
    hf_logging.disable_progress_bar()
    examples = {c: read_split(ROOT / "data", c, "eval")[:EXAMPLES_PER_SET] for c in ("general", "legal")}
    for name in ("base", "legal"):
        path = ROOT / "checkpoints" / name
        model, tokenizer = load_checkpoint(path)
        print(f"=== checkpoint {name} ({path.relative_to(ROOT)}, mode hybrid)")
        for corpus, rows in examples.items():
            t0 = time.perf_counter()
            stats: list[SequenceStats] = []
            preds = summarize(model, tokenizer, [r["text"] for r in rows], mode="hybrid", stats_out=stats)
            dt = time.perf_counter() - t0
            total = summarize_stats(stats)
            print(f"--- {corpus} eval set, {len(rows)} texts in {dt:.2f}s: {total['tokens']} tokens in "
                  f"{total['decoder_steps']} decoder steps (tau {total['tau']:.2f}, "
                  f"{100 * total['nar_share']:.0f}% drafted by the NAR branch)")
            for row, pred in zip(rows, preds, strict=True):
                print(f"  input:     {row['text'][:100]}…")
                print(f"  reference: {row['summary']}")
                print(f"  {name:<9}  {pred}")
        print()


if __name__ == "__main__":
    main()
