"""`yue2` command line: train, evaluate, convert and run YuE2 checkpoints."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformers.utils import logging as hf_logging

from yue2_jobs.errors import Yue2Error
from yue2_jobs.model.generation import MODES


def _cmd_convert_bart(args: argparse.Namespace) -> None:
    from yue2_jobs.model.convert import convert_bart_checkpoint

    print(f"wrote {convert_bart_checkpoint(args.src, args.dst)}")


def _cmd_train(args: argparse.Namespace) -> None:
    from yue2_jobs.model.train import TrainArgs, train

    train(TrainArgs(**{k: v for k, v in vars(args).items() if k in TrainArgs.__dataclass_fields__}))


def _cmd_eval(args: argparse.Namespace) -> None:
    from yue2_jobs.model.evaluate import evaluate_checkpoint

    rows = []
    for corpus in args.set:
        r = evaluate_checkpoint(args.checkpoint, data_dir=args.data, corpus=corpus, limit=args.limit,
                                batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, mode=args.mode)
        rows.append({"checkpoint": str(args.checkpoint), "set": corpus, "n": r.count,
                     "rouge1": r.rouge1, "rouge2": r.rouge2, "rougeL": r.rougeL, "distinct": r.distinct})
    print(f"{'checkpoint':<24} {'set':<8} {'n':>5} {'ROUGE-1':>8} {'ROUGE-2':>8} {'ROUGE-L':>8} {'distinct':>9}")
    for row in rows:
        print(f"{Path(row['checkpoint']).name:<24} {row['set']:<8} {row['n']:>5} "
              f"{100 * row['rouge1']:>8.2f} {100 * row['rouge2']:>8.2f} {100 * row['rougeL']:>8.2f} "
              f"{100 * row['distinct']:>8.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


def _cmd_summarize(args: argparse.Namespace) -> None:
    from yue2_jobs.model.checkpoint import load_checkpoint
    from yue2_jobs.model.evaluate import summarize

    model, tokenizer = load_checkpoint(args.checkpoint)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for text, summary in zip(texts, summarize(model, tokenizer, texts, max_new_tokens=args.max_new_tokens,
                                              mode=args.mode), strict=True):
        print(json.dumps({"input": text[:80] + ("…" if len(text) > 80 else ""), "summary": summary},
                         ensure_ascii=False))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="yue2", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert-bart", help="import a local BartForConditionalGeneration directory")
    p.add_argument("src")
    p.add_argument("dst")
    p.set_defaults(func=_cmd_convert_bart)

    from yue2_jobs.model.train import add_arguments

    p = sub.add_parser("train", help="train (or fine-tune with --init) a checkpoint in three stages")
    add_arguments(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="ROUGE-1/2/L of a checkpoint on held-out eval sets")
    p.add_argument("checkpoint")
    p.add_argument("--set", action="append", choices=["general", "legal"], required=True,
                   help="eval set; repeat for several")
    p.add_argument("--data", default="data")
    p.add_argument("--limit", type=int, default=None, help="first N rows only")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--mode", default="ar", choices=MODES, help="decoding mode (default ar)")
    p.add_argument("--json", default=None, help="also write the rows here")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("summarize", help="summarise texts given as arguments (or one per stdin line)")
    p.add_argument("checkpoint")
    p.add_argument("text", nargs="*")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--mode", default="hybrid", choices=MODES, help="decoding mode (default hybrid)")
    p.set_defaults(func=_cmd_summarize)
    return parser


def main(argv: list[str] | None = None) -> int:
    hf_logging.disable_progress_bar()
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except Yue2Error as exc:
        print(f"yue2: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
