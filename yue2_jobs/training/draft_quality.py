"""How good a drafter is: teacher-forced slot accuracy and the tau it allows, and live tau.

Teacher-forced: the targets are the checkpoint's own greedy outputs (what verification compares
with). At every position t the drafter drafts slots 1..K from the AR hidden state at t and the
token chosen there, exactly as `hybrid` does after accepting up to t. Slot j is right when it
equals the output token at t + 1 + j; a step accepts the leading run of right slots, so tau with
every draft verified is 1 + the mean run. Live: `hybrid` decodes the inputs and tau is the tokens
it committed per decoder step (the confidence head may stop verifying some runs, so it is a
little lower).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from yue2_jobs.decode.sampling import SamplingParams, repetition_controls
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration, shift_tokens_right
from yue2_jobs.training.batches import collate

Pairs = list[tuple[list[int], list[int]]]


@dataclass(frozen=True)
class TeacherForced:
    """Per-slot accuracy (share of positions whose slot j is right) and tau with every draft verified."""

    slot_accuracy: list[float]
    tau: float
    positions: int

    def line(self) -> str:
        slots = "/".join(f"{100 * a:.0f}" for a in self.slot_accuracy)
        return f"teacher-forced tau {self.tau:.2f} (slot accuracy {slots} %, {self.positions} positions)"


@dataclass(frozen=True)
class Live:
    """`hybrid` on real inputs: tokens per decoder step and the share of verified drafts accepted."""

    tau: float
    acceptance: float
    tokens: int

    def line(self) -> str:
        return (f"live tau {self.tau:.2f} (hybrid, {100 * self.acceptance:.0f} % of drafts accepted, "
                f"{self.tokens} tokens)")


@torch.inference_mode()
def slot_hits(model: Yue2ForConditionalGeneration, batch: dict[str, torch.Tensor],
              controls: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Right slots (P, K) at the P positions that have a next token, and their leading runs (P,).
    `controls`: the checkpoint's repetition controls are applied to the drafts too."""
    cfg, k = model.config, model.config.nar_block_size
    labels = batch["labels"]  # (B, T)
    t, dev = labels.shape[1], labels.device
    enc = model.encode(batch["input_ids"], batch["attention_mask"])
    dec_in = shift_tokens_right(labels, pad_token_id=cfg.pad_token_id,
                                decoder_start_token_id=cfg.decoder_start_token_id)
    hidden = model.decode(dec_in, enc)  # (B, T, C): hidden[:, t] chose labels[:, t]
    logits, _ = model.draft(hidden, labels.clamp(min=0), enc)  # (B, T, K, V_d)
    if controls:
        logits = _controlled(model, logits, labels)
    drafts = model.draft_tokens(logits)  # (B, T, K)
    at = torch.arange(t, device=dev)[:, None] + 1 + torch.arange(k, device=dev)  # (T, K): the label each slot drafts
    truth = labels[:, at.clamp(max=t - 1)]  # (B, T, K)
    right = (drafts == truth) & (at < t) & (truth != -100)
    has_next = (labels != -100) & (torch.arange(t, device=dev) < t - 1)  # (B, T)
    right = right[has_next]  # (P, K)
    return right, right.long().cumprod(-1).sum(-1)


def _controlled(model: Yue2ForConditionalGeneration, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Draft logits (B, T, K, V_d) after the checkpoint's repetition controls, each slot's context
    being the start token and the true labels before the token it drafts."""
    cfg, params = model.config, SamplingParams.greedy(model.generation_config)
    if not params.controls_repetition:
        return logits
    b, t, k, vd = logits.shape
    dev = logits.device
    ids = model.draft_vocab if model.draft_vocab is not None else torch.arange(cfg.vocab_size, device=dev)
    full = logits.new_full((b, t * k, cfg.vocab_size), float("-inf"))
    full[..., ids] = logits.reshape(b, t * k, vd)
    seq = torch.cat([torch.full((b, 1), cfg.decoder_start_token_id, device=dev), labels.clamp(min=0),
                     torch.full((b, k + 2), cfg.pad_token_id, device=dev)], 1)  # (B, 1 + T + K + 2)
    length = (torch.arange(t, device=dev)[:, None] + 2 + torch.arange(k, device=dev)).reshape(1, -1).expand(b, -1)
    return repetition_controls(full, seq, length, params)[..., ids].reshape(b, t, k, vd)


def teacher_forced(model: Yue2ForConditionalGeneration, distilled: Pairs, *, device: torch.device,
                   controls: bool = False, batch_size: int = 16) -> TeacherForced:
    """Slot accuracy and tau over `distilled` (source, the checkpoint's own output) pairs."""
    model.eval()
    rights, runs = [], []
    for start in range(0, len(distilled), batch_size):
        batch = collate(distilled[start : start + batch_size], model.config.pad_token_id, device)
        right, run = slot_hits(model, batch, controls)
        rights.append(right.float().cpu())
        runs.append(run.float().cpu())
    right, run = torch.cat(rights), torch.cat(runs)
    if not len(run):
        return TeacherForced([0.0] * model.config.nar_block_size, 1.0, 0)
    return TeacherForced([round(x, 4) for x in right.mean(0).tolist()], round(1 + run.mean().item(), 4), len(run))


def live(model: Yue2ForConditionalGeneration, sources: Sequence[list[int]], *, max_new_tokens: int,
         device: torch.device, batch_size: int = 16) -> Live:
    """`hybrid` over `sources`: committed tokens per decoder step, and drafts accepted / drafts verified."""
    model.eval()
    session = DecodeSession(model)
    pad = model.config.pad_token_id
    tokens = steps = nar = drafted = 0
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    for start in range(0, len(order), batch_size):
        batch = collate([(list(sources[i]), [pad]) for i in order[start : start + batch_size]], pad, device)
        out = session.generate(batch["input_ids"], batch["attention_mask"], mode="hybrid",
                               max_new_tokens=max_new_tokens)
        for s in out.stats:
            tokens, steps, nar, drafted = (tokens + s.tokens, steps + s.decoder_steps, nar + s.nar_tokens,
                                           drafted + s.drafted_tokens)
    return Live(round(tokens / max(1, steps), 4), round(nar / max(1, drafted), 4), tokens)
