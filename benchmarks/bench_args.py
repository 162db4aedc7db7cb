"""Command-line arguments every decode benchmark shares (they run as scripts: `python benchmarks/X.py`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

ROOT = Path(__file__).resolve().parent.parent


def parser_with_common_arguments(doc: str, *, out_name: str, texts_default: int, texts_help: str
                                 ) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--texts", type=int, default=texts_default, help=texts_help)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "base"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / out_name))
    return parser


def apply_common_arguments(args: argparse.Namespace) -> None:
    """Quiet transformers' logging and apply --threads."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
