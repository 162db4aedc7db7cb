"""How good a checkpoint's drafter is, teacher-forced: per-slot accuracy and the tau it allows.

The AR branch greedily decodes the eval set (its own controlled outputs: what verification
compares with) and `yue2_jobs.training.draft_quality.teacher_forced` measures the drafter on them
(how, in its docstring): per-slot accuracy and tau with every draft verified. With `--controls`,
the checkpoint's repetition controls are also applied to the draft logits, with the true prefix as
context (the context a draft has whenever the drafts before it are right).

    python benchmarks/drafter.py --checkpoint checkpoints/base --eval-set general [--controls]

Measured with this script (issue 27): base's drafter is right on slot 1 for 47 % of positions
and tau is 1.75 (1.85 with the controls applied to drafts); `hybrid` measures a little less
(1.46-1.53) because the confidence head stops verifying some runs.
"""

from __future__ import annotations

import argparse
import json

import torch
from bench_args import ROOT

from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration
from yue2_jobs.training.batches import encode_pairs
from yue2_jobs.training.data import read_split
from yue2_jobs.training.distill import distilled_pairs
from yue2_jobs.training.draft_quality import teacher_forced


def ar_targets(model: Yue2ForConditionalGeneration, pairs: list[tuple[list[int], list[int]]],
               max_new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """Each input with the AR branch's greedy output (controls on) in place of its reference."""
    return distilled_pairs(model, [src for src, _ in pairs], max_new_tokens=max_new_tokens,
                           device=torch.device("cpu"), desc="ar outputs")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "base"))
    p.add_argument("--eval-set", default="general", help="corpus under data/ whose eval split is read")
    p.add_argument("--texts", type=int, default=400, help="eval texts read (from the start of the split)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--controls", action="store_true", help="apply the repetition controls to the drafts too")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_checkpoint(args.checkpoint)
    rows = read_split(ROOT / "data", args.eval_set, "eval")[: args.texts]
    limit = tokenizer.model_max_length
    pairs = ar_targets(model, encode_pairs(tokenizer, rows, max_source_tokens=limit, max_target_tokens=1),
                       args.max_new_tokens)
    tf = teacher_forced(model, pairs, device=torch.device("cpu"), controls=args.controls)
    result = {"checkpoint": args.checkpoint, "eval_set": args.eval_set, "positions": tf.positions,
              "controls_on_drafts": args.controls, "slot_accuracy": tf.slot_accuracy,
              "tau_all_verified": tf.tau}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
