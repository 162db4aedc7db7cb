"""Train a YuE2 checkpoint in stages (an optional denoising stage, then three).

0. Denoise (optional, for fresh models): reconstruct the opening of each input from a
   masked copy, so cross-attention learns to read the input before summarising.
1. AR: teacher-forced cross-entropy on (text -> summary) pairs; every weight trains. A
   share of each batch (`denoise_mix`) stays denoising: trained on summaries alone, a small
   model learns the summaries' language prior, stops reading its input and shuts the
   encoder off (the loss with every input swapped for another's equalled the true one);
   the reconstruction examples keep cross-attention alive while it learns to summarise.
2. NAR: encoder and AR branch frozen; the AR branch greedily decodes every training input
   and the NAR branch learns to draft those sequences (self-distillation: the AR branch's own
   choices as hard targets plus KL to its distribution at the drafted position). First the
   draft vocabulary is built from those outputs (`draft_vocab.shortlist`, `--draft-coverage`).
3. Confidence: only the confidence head trains, on "draft token == the AR branch's choice"; a
   reliability table on held-out inputs shows its calibration.

Seeded and deterministic: batch order and dropout are functions of (seed, step), so a run
resumed from its last save continues exactly as it would have. `--init CKPT` fine-tunes an
existing checkpoint (that is how `legal` is made from `base`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from yue2_jobs.model import Yue2Config, Yue2ForConditionalGeneration
from yue2_jobs.model.checkpoint import save_checkpoint
from yue2_jobs.model.device import resolve_device
from yue2_jobs.model.tokenizer import clean_copy, train_tokenizer
from yue2_jobs.training.batches import batch_for_step, collate, denoising_pairs, encode_pairs, mixed_batch
from yue2_jobs.training.data import read_split
from yue2_jobs.training.distill import build_draft_vocab, distilled_pairs
from yue2_jobs.training.draft_vocab import DEFAULT_COVERAGE
from yue2_jobs.training.losses import input_dependence, reliability_table, stage_loss

STAGES = ("denoise", "ar", "nar", "confidence")


@dataclass
class TrainArgs:
    data: str
    corpus: str
    out: str
    init: str | None = None
    preset: str = "tiny"
    vocab_size: int = 4096
    denoise_steps: int = 0
    denoise_mix: float = 0.5
    ar_steps: int = 1500
    nar_steps: int = 400
    confidence_steps: int = 200
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 100
    max_source_tokens: int = 128
    max_target_tokens: int = 48
    label_smoothing: float = 0.0  # AR stage only; spreads mass off the argmax, which curbs loops
    distill_rows: int = 0  # training inputs the AR branch decodes as NAR targets; 0 = all
    draft_coverage: float = DEFAULT_COVERAGE  # share of the AR outputs' tokens the draft vocabulary covers; 0 = all ids
    # The checkpoint's default repetition controls (generation_config.json); None keeps the
    # initial checkpoint's (off for a fresh model). The NAR targets are decoded with them.
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    seed: int = 0
    device: str = "auto"
    save_every: int = 250
    threads: int = 0
    stop_after: int = 0  # stop (saving resumable state) after this many steps of this run; 0 = never

    @property
    def token_limits(self) -> dict[str, int]:
        return {"max_source_tokens": self.max_source_tokens, "max_target_tokens": self.max_target_tokens}

    def identity(self) -> dict[str, object]:
        """The arguments a resumed run must share with the run it continues."""
        return {k: v for k, v in asdict(self).items() if k not in ("stop_after", "threads", "save_every")}


def lr_at(step: int, total: int, *, lr: float, warmup: int) -> float:
    """Linear warm-up, then a cosine down to a tenth of the peak at `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_mode(model: Yue2ForConditionalGeneration, stage: str) -> None:
    """Dropout only where weights train: the frozen encoder and AR branch must give the NAR
    stages the same hidden states and argmax targets they give at inference."""
    model.train(stage in ("denoise", "ar"))
    if stage == "nar":
        model.nar_layers.train()


def trainable(model: Yue2ForConditionalGeneration, stage: str) -> list[torch.nn.Parameter]:
    for p in model.parameters():
        p.requires_grad_(stage in ("denoise", "ar"))
    if stage == "nar":
        for mod in (model.nar_slot_embed, model.nar_layernorm_embedding, model.nar_layers):
            mod.requires_grad_(True)
    if stage == "confidence":
        model.confidence_head.requires_grad_(True)
    return [p for p in model.parameters() if p.requires_grad]


def _distill_subset(pairs: list[tuple[list[int], list[int]]], args: TrainArgs) -> list[tuple[list[int], list[int]]]:
    """A seeded sample of `distill_rows` training pairs (all of them when 0 or more than there are)."""
    if not args.distill_rows or args.distill_rows >= len(pairs):
        return pairs
    return random.Random(args.seed).sample(pairs, args.distill_rows)


def _load_or_init(args: TrainArgs, texts: list[str],
                  state_dir: Path) -> tuple[Yue2ForConditionalGeneration, PreTrainedTokenizerBase]:
    if args.init:
        return Yue2ForConditionalGeneration.from_pretrained(args.init), AutoTokenizer.from_pretrained(args.init)
    cfg = Yue2Config.from_preset(args.preset)
    if (state_dir / "meta.json").is_file():  # resuming: the saved state holds weights and tokenizer
        return Yue2ForConditionalGeneration(cfg), AutoTokenizer.from_pretrained(state_dir / "tokenizer")
    tokenizer = train_tokenizer(texts, vocab_size=cfg.vocab_size, model_max_length=cfg.max_position_embeddings)
    torch.manual_seed(args.seed)
    return Yue2ForConditionalGeneration(cfg), tokenizer


def _set_generation_defaults(model: Yue2ForConditionalGeneration, args: TrainArgs) -> None:
    if args.repetition_penalty is not None:
        model.generation_config.repetition_penalty = args.repetition_penalty
    if args.no_repeat_ngram_size is not None:
        model.generation_config.no_repeat_ngram_size = args.no_repeat_ngram_size


def _resume(state_dir: Path, args: TrainArgs, model: Yue2ForConditionalGeneration,
            tokenizer: PreTrainedTokenizerBase, device: torch.device
            ) -> tuple[PreTrainedTokenizerBase, dict[str, Any]]:
    """Load a stopped run's saved state into `model`; returns its tokenizer and where it stopped."""
    meta_path = state_dir / "meta.json"
    if not meta_path.is_file():
        return tokenizer, {"stage": STAGES[0], "step": 0}
    meta = json.loads(meta_path.read_text())
    if meta["args"] != args.identity():
        raise SystemExit(f"{state_dir} holds a run with other arguments; delete it or pass the same ones")
    state = load_file(state_dir / "model.safetensors", device=str(device))
    model.set_draft_vocab(state.get("draft_vocab"))  # built by the NAR stage, if the run got that far
    model.load_state_dict(state)
    print(f"resuming from {state_dir}: stage {meta['stage']}, step {meta['step']}")
    return AutoTokenizer.from_pretrained(state_dir / "tokenizer"), {"stage": meta["stage"], "step": meta["step"]}


def train(args: TrainArgs) -> Path | None:
    """Run (or resume) training; returns the checkpoint path, or None when stopped by stop_after."""
    torch.use_deterministic_algorithms(True)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    out = Path(args.out)
    state_dir = out.with_name(out.name + ".train-state")
    train_rows = read_split(args.data, args.corpus, "train")
    eval_rows = read_split(args.data, args.corpus, "eval")
    model, tokenizer = _load_or_init(args, [r["text"] + "\n" + r["summary"] for r in train_rows], state_dir)
    model.to(device)
    _set_generation_defaults(model, args)
    tokenizer, done = _resume(state_dir, args, model, tokenizer, device)
    pairs = encode_pairs(tokenizer, train_rows, **args.token_limits)
    eval_pairs = encode_pairs(tokenizer, eval_rows, **args.token_limits)
    steps = {"denoise": args.denoise_steps, "ar": args.ar_steps, "nar": args.nar_steps,
             "confidence": args.confidence_steps}
    budget = args.stop_after or -1
    distilled: list[tuple[list[int], list[int]]] = []
    for stage in STAGES[STAGES.index(done["stage"]):]:
        start = done["step"] if stage == done["stage"] else 0
        if start >= steps[stage]:
            continue
        params = trainable(model, stage)
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
        if start and (state_dir / "optimizer.pt").is_file():
            opt.load_state_dict(torch.load(state_dir / "optimizer.pt", weights_only=True))
        share = {"denoise": 1.0, "ar": args.denoise_mix}.get(stage, 0.0)
        if stage in ("denoise", "ar"):
            data = pairs
        else:  # the AR branch is frozen from here on: its greedy outputs serve both later stages
            distilled = distilled or distilled_pairs(model, [src for src, _ in _distill_subset(pairs, args)],
                                                     max_new_tokens=args.max_target_tokens, device=device,
                                                     desc=f"{stage}: AR targets")
            data = distilled
            if stage == "nar" and start == 0:
                print(build_draft_vocab(model, distilled, coverage=args.draft_coverage))
        denoising = (denoising_pairs(pairs, model.config, seed=args.seed, max_target_tokens=args.max_target_tokens)
                     if share else data)
        lengths = [len(src) for src, _ in data]
        bar = tqdm(range(start, steps[stage]), desc=f"stage {stage}", initial=start, total=steps[stage],
                   mininterval=0.2 if sys.stderr.isatty() else 30.0)
        for step in bar:
            if budget == 0:
                _save_state(state_dir, model, tokenizer, opt, args, stage, step)
                print(f"\nstopped after {args.stop_after} steps; run again with the same arguments to resume")
                return None
            budget -= 1
            train_mode(model, stage)
            torch.manual_seed(args.seed * 7919 + STAGES.index(stage) * 1_000_000 + step)
            indices = batch_for_step(lengths, step, args.batch_size, args.seed)
            batch = collate(mixed_batch(data, denoising, indices, share=share, seed=args.seed, step=step),
                             model.config.pad_token_id, device)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps[stage], lr=args.lr, warmup=args.warmup)
            loss = stage_loss(model, stage, batch, label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            if (step + 1) % args.save_every == 0 and step + 1 < steps[stage]:
                _save_state(state_dir, model, tokenizer, opt, args, stage, step + 1)
        bar.close()
        nxt = STAGES.index(stage) + 1
        if nxt < len(STAGES):
            _save_state(state_dir, model, tokenizer, None, args, STAGES[nxt], 0)
    _closing_report(model, eval_pairs, args, device)
    model.to("cpu")
    # Positions beyond the training length are untrained: inference truncates inputs there.
    # The corpus is the checkpoint's domain: A/B reports warn when it is scored on another's.
    save_checkpoint(model, clean_copy(tokenizer, model_max_length=args.max_source_tokens), out,
                    notes={"domain": args.corpus})
    shutil.rmtree(state_dir, ignore_errors=True)
    print(f"saved {out}")
    return out


def _closing_report(model: Yue2ForConditionalGeneration, eval_pairs: list[tuple[list[int], list[int]]],
                    args: TrainArgs, device: torch.device) -> None:
    """How much the model reads its input, and how well its confidence head is calibrated."""
    model.eval()
    true_loss, swapped_loss = input_dependence(model, eval_pairs, device)
    print(f"held-out AR loss {true_loss:.3f}; with inputs swapped between examples {swapped_loss:.3f}")
    print("confidence head reliability (held-out inputs, AR greedy sequences):")
    eval_distilled = distilled_pairs(model, [src for src, _ in eval_pairs], max_new_tokens=args.max_target_tokens,
                                     device=device, desc="eval targets")
    print(reliability_table(model, eval_distilled, device))


def _save_state(state_dir: Path, model: Yue2ForConditionalGeneration, tokenizer: PreTrainedTokenizerBase,
                opt: torch.optim.Optimizer | None, args: TrainArgs, stage: str, step: int) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, state_dir / "model.safetensors")
    tokenizer.save_pretrained(state_dir / "tokenizer")
    if opt is not None:
        torch.save(opt.state_dict(), state_dir / "optimizer.pt")
    else:
        (state_dir / "optimizer.pt").unlink(missing_ok=True)
    tmp = state_dir / "meta.json.tmp"
    tmp.write_text(json.dumps({"args": args.identity(), "stage": stage, "step": step}))
    tmp.replace(state_dir / "meta.json")


TRAIN_HELP = {
    "preset": "model size of a fresh model (Yue2Config presets; ignored with --init)",
    "vocab_size": "tokenizer vocabulary of a fresh model, in tokens",
    "denoise_steps": "steps of denoising pretraining before the AR stage",
    "denoise_mix": "share of AR-stage items replaced by their denoising twin (0-1)",
    "ar_steps": "optimizer steps of the AR stage (encoder and AR branch)",
    "nar_steps": "optimizer steps of the NAR stage (the drafter)",
    "confidence_steps": "optimizer steps of the confidence head",
    "batch_size": "pairs per optimizer step",
    "lr": "peak learning rate (AdamW)",
    "warmup": "steps of linear learning-rate warm-up",
    "max_source_tokens": "inputs are cut to this many tokens",
    "max_target_tokens": "summaries are cut to this many tokens",
    "label_smoothing": "AR-stage label smoothing (0-1)",
    "distill_rows": "training inputs the AR branch decodes as drafter targets (0: all)",
    "draft_coverage": "share of the AR outputs' tokens the draft vocabulary covers (0: every id)",
    "seed": "seed of the batch order, initialisation and dropout",
    "device": "cpu, cuda, or auto (cuda when available)",
    "save_every": "steps between resumable saves",
    "threads": "torch CPU threads (0: torch's default)",
    "stop_after": "stop after this many steps, saving resumable state (0: run to the end)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainArgs(data="", corpus="", out="")
    parser.add_argument("--data", default="data", help="directory built by `make data`")
    parser.add_argument("--corpus", required=True, choices=["general", "legal"], help="which corpus to train on")
    parser.add_argument("--out", required=True, help="checkpoint directory to write")
    parser.add_argument("--init", default=None, help="checkpoint to fine-tune instead of starting fresh")
    for name in ("preset", "vocab_size", "denoise_steps", "denoise_mix", "ar_steps", "nar_steps", "confidence_steps",
                 "batch_size", "lr", "warmup", "max_source_tokens", "max_target_tokens", "label_smoothing",
                 "distill_rows", "draft_coverage", "seed", "device", "save_every", "threads", "stop_after"):
        value = getattr(defaults, name)
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, help=TRAIN_HELP[name])
    parser.add_argument("--repetition-penalty", type=float, default=None,
                        help="default repetition_penalty written to the checkpoint's generation config")
    parser.add_argument("--no-repeat-ngram-size", type=int, default=None,
                        help="default no_repeat_ngram_size written to the checkpoint's generation config")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    train(TrainArgs(**vars(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
