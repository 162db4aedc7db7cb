"""`yue2 convert-bart | train | train-drafter | eval | summarize`: the model tools (each imports torch
when run)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from yue2_jobs.cli.common import add_decoding, decoding
from yue2_jobs.core.paths import DATA

CONVERT_BART_DESCRIPTION = (
    "Import a local BART summariser as a YuE2 checkpoint. SRC is a directory written by transformers' "
    "BartForConditionalGeneration.save_pretrained (with the tokenizer's save_pretrained beside it): config.json "
    "with model_type 'bart', the weights as model.safetensors (pickle .bin files are refused), and the tokenizer "
    "as tokenizer.json or vocab.json + merges.txt. Post-LayerNorm BART only, not mBART. SRC is refused, in one "
    "line saying why, if any weight is missing, unexpected or of the wrong shape, or if the tokenizer does not "
    "load, has tokens beyond vocab_size (other than special ones like bart-large-cnn's <mask>, which are dropped, "
    "and said) or disagrees with config.json on the bos/eos/pad ids. DST (new, or empty) gets the encoder and AR "
    "decoder with BART's weights exactly, the tokenizer, and a manifest; the draft branch is untrained (NAR layers "
    "copied from the AR top layers, slot embeddings and confidence head fresh): train it with `yue2 train-drafter`."
)


def _convert_bart(args: argparse.Namespace) -> None:
    from yue2_jobs.model.convert import convert_bart_checkpoint

    # a refused source raises a CheckpointError: `yue2` prints its one line and exits 2
    print(convert_bart_checkpoint(args.src, args.dst).message)


def _train(args: argparse.Namespace) -> None:
    from yue2_jobs.training.train import TrainArgs, train

    train(TrainArgs(**{k: v for k, v in vars(args).items() if k in TrainArgs.__dataclass_fields__}))


def _batch_texts(batch_id: str) -> list[str]:
    """A finished batch's input texts, read from the pipeline's storage (`jobs.batch_inputs`)."""
    from yue2_jobs.cli.common import settings
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.jobs.batch_inputs import iter_batch_texts
    from yue2_jobs.storage import storage_from_url

    s = settings()
    store = storage_from_url(s.resolved_storage_url, endpoint_url=s.s3_endpoint_url, region=s.s3_region)
    with session_factory(s.resolved_database_url)() as session:
        return list(iter_batch_texts(session, storage=store, settings=s, batch_id=batch_id))


def _train_drafter(args: argparse.Namespace) -> None:
    from yue2_jobs.training.drafter import DrafterArgs, train_drafter

    texts = _batch_texts(args.batch) if args.batch else None  # train_drafter refuses --inputs beside it
    train_drafter(DrafterArgs(**{k: v for k, v in vars(args).items() if k in DrafterArgs.__dataclass_fields__}),
                  texts=texts, source=f"batch {args.batch}" if args.batch else None)


def _eval(args: argparse.Namespace) -> None:
    from yue2_jobs.training.evaluate import evaluate_checkpoint, lead_baseline

    rows = []
    for corpus in args.set:
        results = [("lead-1", lead_baseline(data_dir=args.data, corpus=corpus, split=args.split, limit=args.limit))]
        results += [(str(ckpt), evaluate_checkpoint(ckpt, data_dir=args.data, corpus=corpus, split=args.split,
                                                    limit=args.limit, batch_size=args.batch_size,
                                                    params=decoding(args), dtype=args.dtype))
                    for ckpt in args.checkpoint]
        rows += [{"checkpoint": name, "set": corpus, "split": args.split, "dtype": args.dtype, "n": r.count,
                  "rouge1": r.rouge1,
                  "rouge2": r.rouge2, "rougeL": r.rougeL, "distinct": r.distinct, "degenerate": r.degenerate}
                 for name, r in results]
    print(f"{'checkpoint':<24} {'set':<8} {'n':>5} {'ROUGE-1':>8} {'ROUGE-2':>8} {'ROUGE-L':>8} {'distinct':>9} "
          f"{'degenerate':>11}")
    for row in rows:
        print(f"{Path(row['checkpoint']).name:<24} {row['set']:<8} {row['n']:>5} "
              f"{100 * row['rouge1']:>8.2f} {100 * row['rouge2']:>8.2f} {100 * row['rougeL']:>8.2f} "
              f"{100 * row['distinct']:>8.1f}% {100 * row['degenerate']:>10.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


def _summarize(args: argparse.Namespace) -> None:
    from yue2_jobs.decode.session import DecodeSession

    params = decoding(args)
    session = DecodeSession.load(args.checkpoint, device="cpu", dtype=args.dtype)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for text, summary in zip(texts, session.summarize(texts, params), strict=True):
        print(json.dumps({"input": text[:80] + ("…" if len(text) > 80 else ""), "summary": summary},
                         ensure_ascii=False))


def _add_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="float32", choices=["float32", "int8"],
                   help="weights on the CPU: float32, or int8 matrices (faster at BART sizes; ROUGE-L within a "
                        "point of float32 on the shipped eval sets, docs/measured.md)")


def add_commands(sub: Any, *, train_arguments: bool) -> None:
    """`train_arguments=False` leaves the train and train-drafter commands' options out: they come from
    the training modules, which import torch, and no other command need pay for it."""
    p = sub.add_parser("convert-bart", help="import a local BartForConditionalGeneration directory",
                       description=CONVERT_BART_DESCRIPTION)
    p.add_argument("src", help="a local directory saved by BartForConditionalGeneration.save_pretrained and the "
                               "tokenizer's save_pretrained: config.json (model_type bart), model.safetensors, "
                               "tokenizer.json or vocab.json + merges.txt")
    p.add_argument("dst", help="the YuE2 checkpoint directory to write (new, or empty)")
    p.set_defaults(func=_convert_bart)

    p = sub.add_parser("train", help="train (or fine-tune with --init) a checkpoint in three stages")
    if train_arguments:
        from yue2_jobs.training.train import add_arguments

        add_arguments(p)
    p.set_defaults(func=_train)

    p = sub.add_parser("train-drafter", help="train a checkpoint's drafter on unlabelled inputs (its own outputs "
                                             "are the targets; the AR weights stay byte-identical)")
    if train_arguments:
        from yue2_jobs.training.drafter import add_arguments as add_drafter_arguments

        add_drafter_arguments(p)
    p.add_argument("--batch", default=None, help="train on a finished batch's inputs, read from the pipeline's "
                                                 "storage (YUE2_* settings), instead of --inputs")
    p.set_defaults(func=_train_drafter)

    p = sub.add_parser("eval", help="ROUGE-1/2/L and degenerate share of checkpoints (and lead-1) on held-out sets")
    p.add_argument("checkpoint", nargs="+", help="checkpoint directories to score, e.g. checkpoints/base")
    p.add_argument("--set", action="append", choices=["general", "legal"], required=True,
                   help="eval set; repeat for several")
    p.add_argument("--data", default=str(DATA), help="corpus directory (default: the shipped eval sets)")
    p.add_argument("--split", default="eval", choices=["eval", "test"], help="held-out split (default eval)")
    p.add_argument("--limit", type=int, default=None, help="first N rows only")
    p.add_argument("--batch-size", type=int, default=32, help="texts decoded together")
    add_decoding(p)
    _add_dtype(p)
    p.add_argument("--json", default=None, help="also write the rows here")
    p.set_defaults(func=_eval)

    p = sub.add_parser("summarize", help="summarise texts given as arguments (or one per stdin line)")
    p.add_argument("checkpoint", help="a checkpoint directory, e.g. checkpoints/base")
    p.add_argument("text", nargs="*", help="texts to summarise (default: one per line of standard input)")
    add_decoding(p)
    _add_dtype(p)
    p.set_defaults(func=_summarize)
