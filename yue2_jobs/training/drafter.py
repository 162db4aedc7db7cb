"""`yue2 train-drafter`: train the drafter of any checkpoint on unlabelled inputs.

The drafter is the NAR branch, the confidence head and the draft vocabulary. Its targets are the
checkpoint's own greedy `ar` outputs (its generation config, repetition controls included), which
is all verification compares drafts with, so any texts the model will be asked to summarise will
do: no reference summaries. The encoder and the AR branch are frozen and saved byte for byte as
they were (checked on the written file and said in its manifest), so every `ar` and `hybrid`
output of the new checkpoint is the old one's; only the speed changes.

1. Load the checkpoint (verified) and fingerprint its encoder and AR weights.
2. Hold out `eval_rows` inputs (seeded); decode every input with `ar` (`distill.py`), the
   outputs cached in the run's state directory as they come (its arguments and inputs recorded
   there first, so a run with others never reads the cache).
3. Measure the drafter it has: teacher-forced tau on the held-out outputs, and live `hybrid` tau.
4. Build the draft vocabulary from the training outputs; `fresh` restarts the drafter from the
   AR branch (`Yue2ForConditionalGeneration.init_drafter_from_ar`), else it is fine-tuned.
5. Train the NAR branch, then the confidence head (`losses.stage_loss`), with a progress bar and
   resumable state every `save_every` steps: run the same command again after a kill.
6. Measure again, write the checkpoint, check the AR weights, write the manifest last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from yue2_jobs.errors import CheckpointError, DataError
from yue2_jobs.model.checkpoint import directory_version, load_verified, save_checkpoint
from yue2_jobs.model.device import resolve_device
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration, is_drafter_key
from yue2_jobs.training.batches import batch_for_step, collate
from yue2_jobs.training.distill import Pairs, build_draft_vocab, distilled_pairs
from yue2_jobs.training.draft_quality import live, teacher_forced
from yue2_jobs.training.draft_vocab import DEFAULT_COVERAGE
from yue2_jobs.training.inputs import read_input_file
from yue2_jobs.training.losses import stage_loss
from yue2_jobs.training.train import lr_at, train_mode, trainable

STAGES = ("nar", "confidence")


@dataclass
class DrafterArgs:
    checkpoint: str
    out: str
    inputs: str | None = None  # a JSON Lines file (`inputs.py`); or texts passed to `train_drafter`
    steps: int = 2000  # NAR-branch optimizer steps
    confidence_steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 100
    max_source_tokens: int = 0  # 0: the checkpoint's own limit
    max_new_tokens: int = 48  # the pipeline's default summary length
    max_inputs: int = 0  # 0: every input
    eval_rows: int = 64
    draft_coverage: float = DEFAULT_COVERAGE
    fresh: bool = False
    nar_layers: int = 0  # 0: the checkpoint's; another number reshapes the drafter (and starts it fresh)
    block_size: int = 0  # K, drafts per step; 0: the checkpoint's; another number starts the drafter fresh
    seed: int = 0
    device: str = "auto"
    save_every: int = 200
    threads: int = 0
    stop_after: int = 0  # stop (saving resumable state) after this many steps of this run; 0 = never

    def identity(self) -> dict[str, object]:
        """The arguments a resumed run must share with the run it continues."""
        return {k: v for k, v in asdict(self).items() if k not in ("stop_after", "threads", "save_every", "device")}


def ar_fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every encoder and AR-branch entry of a state dict: name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name in sorted(k for k in state if not is_drafter_key(k)):
        t = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def _reshaped(model: Yue2ForConditionalGeneration, args: DrafterArgs) -> Yue2ForConditionalGeneration:
    """`model` itself, or (when `nar_layers` or `block_size` asks for another drafter shape) a model of
    that shape with `model`'s encoder and AR weights, its drafter still to be initialised."""
    cfg = model.config
    layers, k = args.nar_layers or cfg.nar_layers, args.block_size or cfg.nar_block_size
    if (layers, k) == (cfg.nar_layers, cfg.nar_block_size):
        return model
    new = Yue2ForConditionalGeneration(cfg.replaced(nar_layers=layers, nar_block_size=k, draft_vocab_size=0))
    keep = {name: t for name, t in model.state_dict().items() if not is_drafter_key(name)}
    result = new.load_state_dict(keep, strict=False)
    assert not result.unexpected_keys and all(is_drafter_key(n) for n in result.missing_keys)
    new.generation_config = model.generation_config
    return new.to(dtype=model.dtype).eval()  # type: ignore[call-arg]  # transformers types its `wraps`-decorated `to` as unbound


def _split(n: int, args: DrafterArgs) -> tuple[list[int], list[int]]:
    """(training, held-out) input indices: a seeded fifth at most, `eval_rows` at most, held out."""
    order = list(range(n))
    random.Random(args.seed).shuffle(order)
    held = min(args.eval_rows, n // 5)
    return sorted(order[held:]), sorted(order[:held])


def _measure(model: Yue2ForConditionalGeneration, held_out: Pairs, args: DrafterArgs,
             device: torch.device) -> dict[str, Any]:
    if not held_out:
        return {}
    tf = teacher_forced(model, held_out, device=device)
    lv = live(model, [src for src, _ in held_out], max_new_tokens=args.max_new_tokens, device=device)
    print(f"  {tf.line()}\n  {lv.line()}")
    return {"teacher_forced_tau": tf.tau, "slot_accuracy": tf.slot_accuracy, "live_tau": lv.tau,
            "acceptance": lv.acceptance, "held_out_inputs": len(held_out)}


def _save_state(state_dir: Path, model: Yue2ForConditionalGeneration, opt: torch.optim.Optimizer | None,
                meta: dict[str, Any]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    drafter = {k: v.detach().contiguous() for k, v in model.state_dict().items() if is_drafter_key(k)}
    save_file(drafter, state_dir / "drafter.safetensors")
    if opt is not None:
        torch.save(opt.state_dict(), state_dir / "optimizer.pt")
    else:
        (state_dir / "optimizer.pt").unlink(missing_ok=True)
    _write_meta(state_dir, meta)


def _write_meta(state_dir: Path, meta: dict[str, Any]) -> None:
    tmp = state_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(meta))
    tmp.replace(state_dir / "meta.json")


def _read_meta(state_dir: Path, identity: dict[str, object]) -> dict[str, Any]:
    """Where a stopped run left off, or a new run's start; written at once, before anything is cached
    in `state_dir`, so a cache is never read by a run with other arguments or inputs."""
    meta_path = state_dir / "meta.json"
    if not meta_path.is_file():
        meta: dict[str, Any] = {"identity": identity, "stage": STAGES[0], "step": 0, "before": None}
        state_dir.mkdir(parents=True, exist_ok=True)
        _write_meta(state_dir, meta)
        return meta
    meta = json.loads(meta_path.read_text())
    if meta["identity"] != identity:
        raise DataError(f"{state_dir} holds a run with other arguments or inputs; delete it or pass the same ones")
    return meta


def _load_drafter(state_dir: Path, model: Yue2ForConditionalGeneration, meta: dict[str, Any],
                  device: torch.device) -> None:
    """A stopped run's drafter, into `model` (nothing when the run had not saved one yet)."""
    if not (state_dir / "drafter.safetensors").is_file():
        return
    state = load_file(state_dir / "drafter.safetensors", device=str(device))
    model.set_draft_vocab(state.get("draft_vocab"))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise DataError(f"{state_dir} holds weights this checkpoint does not have: {result.unexpected_keys[:3]}")
    print(f"resuming from {state_dir}: stage {meta['stage']}, step {meta['step']}")


def _train_stage(model: Yue2ForConditionalGeneration, stage: str, data: Pairs, *, start: int, total: int,
                 budget: list[int], state_dir: Path, meta: dict[str, Any], args: DrafterArgs,
                 device: torch.device) -> bool:
    """Run `stage` from step `start` to `total`; False when the step budget ran out first (state saved)."""
    params = trainable(model, stage)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    if start and (state_dir / "optimizer.pt").is_file():
        opt.load_state_dict(torch.load(state_dir / "optimizer.pt", weights_only=True))
    lengths = [len(src) for src, _ in data]
    bar = tqdm(range(start, total), desc=f"train-drafter {stage}", initial=start, total=total, unit="step",
               mininterval=0.2 if sys.stderr.isatty() else 30.0)
    for step in bar:
        if budget[0] == 0:
            _save_state(state_dir, model, opt, {**meta, "stage": stage, "step": step})
            bar.close()
            return False
        budget[0] -= 1
        train_mode(model, stage)
        torch.manual_seed(args.seed * 7919 + STAGES.index(stage) * 1_000_000 + step)
        batch = collate([data[i] for i in batch_for_step(lengths, step, args.batch_size, args.seed)],
                        model.config.pad_token_id, device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, lr=args.lr, warmup=min(args.warmup, max(1, total // 10)))
        loss = stage_loss(model, stage, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if (step + 1) % args.save_every == 0 and step + 1 < total:
            _save_state(state_dir, model, opt, {**meta, "stage": stage, "step": step + 1})
    bar.close()
    return True


def _inputs_fingerprint(texts: list[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()


def _texts(args: DrafterArgs, texts: list[str] | None) -> list[str]:
    if (texts is None) == (args.inputs is None):
        raise DataError("train-drafter takes its inputs from --inputs FILE or --batch BATCH_ID: exactly one of them")
    found = texts if texts is not None else read_input_file(str(args.inputs))
    if args.max_inputs:
        found = found[: args.max_inputs]
    if len(found) < 2:
        raise DataError(f"train-drafter needs at least 2 inputs, got {len(found)}")
    return found


def train_drafter(args: DrafterArgs, *, texts: list[str] | None = None, source: str | None = None) -> Path | None:
    """Train (or resume training) the drafter of `args.checkpoint` on `texts` (or `args.inputs`);
    returns the new checkpoint's path, or None when stopped by `stop_after`. `source` names where
    `texts` came from, for the manifest."""
    texts = _texts(args, texts)
    out = Path(args.out)
    if out.exists():
        raise DataError(f"{out} exists; pass another --out or delete it")
    device = resolve_device(args.device)
    torch.use_deterministic_algorithms(device.type == "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_verified(args.checkpoint)
    tokenizer = loaded.tokenizer
    ar_before = ar_fingerprint(load_file(Path(args.checkpoint) / "model.safetensors"))
    state_dir = out.with_name(out.name + ".train-state")
    identity = {**args.identity(), "checkpoint_version": directory_version(args.checkpoint),
                "inputs_sha256": _inputs_fingerprint(texts)}
    meta = _read_meta(state_dir, identity)
    loaded.model.to(device)  # type: ignore[arg-type]  # transformers types its `wraps`-decorated `to` as unbound
    limit = args.max_source_tokens or min(int(tokenizer.model_max_length), loaded.model.config.max_position_embeddings)
    sources = tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
    train_idx, eval_idx = _split(len(sources), args)
    distilled = distilled_pairs(loaded.model, sources, max_new_tokens=args.max_new_tokens, device=device,
                                desc="ar outputs (targets)", cache=state_dir / "targets.jsonl")
    train_pairs, held_out = [distilled[i] for i in train_idx], [distilled[i] for i in eval_idx]
    print(f"{len(texts)} inputs: {len(train_pairs)} to train on, {len(held_out)} held out"
          + ("" if held_out else " (too few to hold any out: tau is not measured)"))
    if meta["before"] is None:  # the checkpoint's own drafter, before any restart or reshaping
        print("the drafter before:")
        meta["before"] = _measure(loaded.model, held_out, args, device)
        _write_meta(state_dir, meta)
    model = _reshaped(loaded.model, args).to(device)  # type: ignore[arg-type]  # as above
    torch.manual_seed(args.seed)
    if args.fresh or model is not loaded.model:
        model.init_drafter_from_ar()
    _load_drafter(state_dir, model, meta, device)
    steps = {"nar": args.steps, "confidence": args.confidence_steps}
    budget = [args.stop_after or -1]
    for stage in STAGES[STAGES.index(meta["stage"]):]:
        start = meta["step"] if stage == meta["stage"] else 0
        if stage == "nar" and start == 0:
            print(build_draft_vocab(model, train_pairs, coverage=args.draft_coverage))
        if not _train_stage(model, stage, train_pairs, start=start, total=steps[stage], budget=budget,
                            state_dir=state_dir, meta=meta, args=args, device=device):
            print(f"\nstopped after {args.stop_after} steps; run the same command again to resume")
            return None
        meta = {**meta, "stage": STAGES[min(STAGES.index(stage) + 1, len(STAGES) - 1)], "step": 0}
        if stage != STAGES[-1]:
            _save_state(state_dir, model, None, meta)
    model.eval()
    print("the drafter after:")
    after = _measure(model, held_out, args, device)
    notes: dict[str, object] = {"drafter": {
        "trained_by": "yue2 train-drafter", "from_checkpoint": str(args.checkpoint),
        "from_version": identity["checkpoint_version"], "fresh": args.fresh or model is not loaded.model,
        "nar_layers": model.config.nar_layers, "block_size": model.config.nar_block_size,
        "inputs": {"source": source or str(args.inputs), "count": len(texts), "sha256": identity["inputs_sha256"],
                   "held_out": len(held_out)},
        "steps": steps, "draft_vocab_size": model.config.draft_vocab_size,
        "ar_weights_sha256": ar_before, "ar_weights_identical": True,
        "before": meta["before"], "after": after,
    }}
    _write(model, tokenizer, out, ar_before=ar_before, notes=notes)
    shutil.rmtree(state_dir, ignore_errors=True)
    print(f"saved {out} (encoder and AR weights byte-identical to {args.checkpoint}: sha256 {ar_before[:12]})")
    return out


def _write(model: Yue2ForConditionalGeneration, tokenizer: Any, out: Path, *, ar_before: str,
           notes: dict[str, object]) -> None:
    """Save to a side directory, check its AR weights against the source's, then move it into place."""
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.to("cpu")  # type: ignore[arg-type]  # as above
    save_checkpoint(model, tokenizer, partial, notes=notes)
    ar_after = ar_fingerprint(load_file(partial / "model.safetensors"))
    if ar_after != ar_before:
        shutil.rmtree(partial, ignore_errors=True)  # its manifest would say what was not so
        raise CheckpointError(f"the encoder or AR weights written to {partial} differ from the source's "
                              f"(sha256 {ar_after[:12]} against {ar_before[:12]}); nothing was saved at {out}",
                              path=str(partial))
    partial.replace(out)


HELP = {
    "steps": "optimizer steps of the NAR branch",
    "confidence_steps": "optimizer steps of the confidence head",
    "batch_size": "inputs per optimizer step",
    "lr": "peak learning rate (AdamW)",
    "warmup": "steps of linear learning-rate warm-up (at most a tenth of a stage)",
    "max_source_tokens": "inputs are cut to this many tokens (0: the checkpoint's limit)",
    "max_new_tokens": "longest output decoded as a target, in tokens (the pipeline's default is 48)",
    "max_inputs": "use only the first N inputs (0: all)",
    "eval_rows": "inputs held out to measure tau before and after (at most a fifth of them)",
    "draft_coverage": "share of the outputs' tokens the draft vocabulary covers (0: every id)",
    "seed": "seed of the held-out split, batch order and dropout",
    "device": "cpu, cuda, or auto (cuda when available)",
    "save_every": "steps between resumable saves",
    "threads": "torch CPU threads (0: torch's default)",
    "stop_after": "stop after this many training steps, saving resumable state (0: run to the end)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DrafterArgs(checkpoint="", out="")
    parser.add_argument("checkpoint", help="the checkpoint directory whose drafter to train (shipped, trained or "
                                           "converted with convert-bart)")
    parser.add_argument("--out", required=True, help="the checkpoint directory to write (must not exist)")
    parser.add_argument("--inputs", default=None, help="JSON Lines (.gz too) with 'text' or 'input' per line, or "
                                                       "a batch input file as the API takes it")
    parser.add_argument("--fresh", action="store_true",
                        help="start the drafter afresh from the AR branch's top layers instead of fine-tuning it")
    parser.add_argument("--nar-layers", type=int, default=0,
                        help="layers of the NAR branch (0: the checkpoint's; another number starts it fresh)")
    parser.add_argument("--block-size", type=int, default=0,
                        help="K, tokens drafted per step (0: the checkpoint's; another number starts it fresh)")
    for name in HELP:
        value = getattr(defaults, name)
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, help=HELP[name])
