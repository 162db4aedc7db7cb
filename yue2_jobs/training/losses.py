"""What each training stage optimises (`stage_loss`), and the run's closing diagnostics: how much
the model reads its input, and how well the confidence head is calibrated."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration, shift_tokens_right
from yue2_jobs.training.batches import collate


class NarBatch(NamedTuple):
    """Every valid draft slot of a batch (N of them), as the NAR stages train on them."""

    draft_logits: torch.Tensor  # (N, V_d) over the draft vocabulary
    conf_logits: torch.Tensor  # (N,) the confidence head's logits of p(accept)
    target: torch.Tensor  # (N,) the token the AR branch chose there (what verification compares with)
    target_logp: torch.Tensor  # (N, V_d) the AR branch's log-probabilities there, on the draft vocabulary
    drafts: torch.Tensor  # (N,) the token ids the draft logits choose


def nar_batch(model: Yue2ForConditionalGeneration, batch: dict[str, torch.Tensor]) -> NarBatch:
    """Draft every valid slot of `batch`, whose labels are the AR branch's own greedy outputs.

    The targets are those outputs, not the AR argmax at each position: with repetition controls
    on (base's penalty and n-gram ban) the two differ, and verification accepts a draft only if it
    equals the controlled choice. The NAR branch reads, as at inference, the AR hidden state at t
    and the token chosen there. Only the valid slots are projected (most of this stage's cost).
    """
    cfg, k = model.config, model.config.nar_block_size
    labels = batch["labels"]  # (B, T): AR greedy sequence, -100 after its EOS
    t = labels.shape[1]
    chosen = labels.clamp(min=0)  # (B, T); the -100 positions are never valid
    with torch.no_grad():
        enc = model.encode(batch["input_ids"], batch["attention_mask"])
        dec_in = shift_tokens_right(labels, pad_token_id=cfg.pad_token_id,
                                    decoder_start_token_id=cfg.decoder_start_token_id)
        hidden = model.decode(dec_in, enc)  # (B, T, C): hidden[t] chose labels[t]
        # Slot j at position t drafts label index t + 1 + j.
        idx = torch.arange(t, device=labels.device)[:, None] + 1 + torch.arange(k, device=labels.device)  # (T, K)
        idx_c = idx.clamp(max=t - 1)
        valid = (idx < t)[None] & (labels[:, idx_c] != -100) & (labels != -100)[:, :, None]  # (B, T, K)
        # Gather only the valid rows: indexing hidden[:, idx_c] would build a (B, T, K, C) tensor.
        rows, positions, slots = valid.nonzero(as_tuple=True)  # the order of boolean indexing
        at = idx_c[positions, slots]
        target = labels[rows, at]  # (N,)
        target_logp = model.draft_logits(hidden[rows, at]).float().log_softmax(-1)  # (N, V_d)
    # The NAR cross-attention projections train in stage 2, so they are recomputed with grad.
    enc.nar_cross_kv = [layer.encoder_attn.project_kv(enc.hidden) for layer in model.nar_blocks()]
    states = model.draft_hidden(hidden, chosen, enc)[valid]  # (N, C)
    draft_logits = model.draft_logits(states)  # (N, V_d)
    return NarBatch(draft_logits, model.confidence_head(states, draft_logits), target, target_logp,
                    model.draft_tokens(draft_logits.detach()))


def stage_loss(model: Yue2ForConditionalGeneration, stage: str, batch: dict[str, torch.Tensor], *,
                label_smoothing: float = 0.0) -> torch.Tensor:
    if stage in ("denoise", "ar"):
        logits = model(**batch).logits  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100,
                               label_smoothing=label_smoothing if stage == "ar" else 0.0)
    nb = nar_batch(model, batch)
    if stage == "nar":
        logp = nb.draft_logits.float().log_softmax(-1)  # (N, V_d)
        # Cross-entropy to the AR distribution (KL's gradient without its entropy term's cost)
        # beside the hard target; a target outside the draft vocabulary has only the former.
        soft = -(nb.target_logp.exp() * logp).sum(-1).mean()
        return F.nll_loss(logp, _draft_index(model, nb.target), ignore_index=-100) + 0.5 * soft
    return F.binary_cross_entropy_with_logits(nb.conf_logits, (nb.drafts == nb.target).float())


def _draft_index(model: Yue2ForConditionalGeneration, tokens: torch.Tensor) -> torch.Tensor:
    """Each token's column in the draft logits, -100 for a token outside the draft vocabulary."""
    if model.draft_vocab is None:
        return tokens
    column = torch.full((model.config.vocab_size,), -100, dtype=torch.long, device=tokens.device)
    column[model.draft_vocab] = torch.arange(model.draft_vocab.numel(), device=tokens.device)
    return column[tokens]


@torch.no_grad()
def input_dependence(model: Yue2ForConditionalGeneration, pairs: list[tuple[list[int], list[int]]],
                     device: torch.device) -> tuple[float, float]:
    """Teacher-forced loss on `pairs`, and the same loss with each input swapped for the one
    half the list away (neighbours in an eval split often share a source). Equal losses mean
    the model ignores its input; the gap is what reading it buys."""
    n = len(pairs)
    swapped = [(pairs[(i + n // 2) % n][0], tgt) for i, (_, tgt) in enumerate(pairs)]
    return mean_loss(model, pairs, device), mean_loss(model, swapped, device)


def mean_loss(model: Yue2ForConditionalGeneration, pairs: list[tuple[list[int], list[int]]],
               device: torch.device) -> float:
    model.eval()
    total = 0.0
    for start in range(0, len(pairs), 64):
        chunk = pairs[start : start + 64]
        total += model(**collate(chunk, model.config.pad_token_id, device)).loss.item() * len(chunk)
    return total / len(pairs)


@torch.no_grad()
def reliability_table(model: Yue2ForConditionalGeneration, pairs: list[tuple[list[int], list[int]]],
                      device: torch.device, bins: int = 10) -> str:
    """Calibration of the confidence head: predicted p(accept) vs observed acceptance, per bin."""
    model.eval()
    probs, hits = [], []
    for start in range(0, len(pairs), 64):
        batch = collate(pairs[start : start + 64], model.config.pad_token_id, device)
        nb = nar_batch(model, batch)
        probs.append(nb.conf_logits.sigmoid().cpu())
        hits.append((nb.drafts == nb.target).float().cpu())
    p, h = torch.cat(probs), torch.cat(hits)
    lines = ["  p(accept) bin   count   mean p   accepted", "  -------------   -----   ------   --------"]
    ece = 0.0
    for i in range(bins):
        lo, hi = i / bins, (i + 1) / bins
        m = (p >= lo) & ((p < hi) if i < bins - 1 else (p <= hi))
        if m.any():
            ece += m.sum().item() / len(p) * abs(p[m].mean().item() - h[m].mean().item())
            lines.append(f"  [{lo:.1f}, {hi:.1f})    {int(m.sum()):6d}   {p[m].mean():.3f}    {h[m].mean():.3f}")
    thr = model.config.nar_threshold
    above = p >= thr
    lines.append(f"  draft tokens: {len(p)}, equal to the AR choice: {h.mean():.3f}, ECE: {ece:.3f}")
    if above.any():
        lines.append(f"  at nar_threshold {thr}: {above.float().mean():.3f} of drafts pass, "
                     f"{h[above].mean():.3f} of those equal the AR choice")
    return "\n".join(lines)
