"""`nar` mode: fully parallel decoding by iterative refinement (Mask-Predict style).

Every iteration runs the AR branch once over the whole canvas in parallel (causal, no cache)
and the NAR branch once from every position, so position p gets candidates from the AR head
at p - 1 and from the NAR slots drafted at p - 2 ... p - k - 1. The canvas is rewritten from
them:

- while the canvas is consistent with itself up to p - 1 (every token there equals the AR
  head's choice given the tokens before it), the AR candidate at p is exactly what `ar`
  greedy would emit, and it is taken;
- past that point, the candidate with the highest score is taken: the AR head's probability
  for its own choice, or the confidence head's p(accept) for a NAR draft. Tokens the
  previous iteration placed with low scores are thereby re-predicted, as Mask-Predict re-masks
  its least confident tokens.

The output length is predicted with the tokens: each row ends at the first EOS of its canvas
(and the canvas shrinks to the longest row after every iteration). Iteration 1 starts from a
canvas of mask tokens. The self-consistent prefix grows by at least one token per iteration
(by the accepted draft length, typically), so `iterations` >= the output length reproduces
`ar` greedy; fewer iterations are the lossy, faster setting. The repetition controls apply to the
AR head at every position, with the canvas before it as the context. Sampling is not used: `nar`
decodes greedily.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from yue2_jobs.decode.layout import StepLayout
from yue2_jobs.decode.sampling import SamplingParams, first_true, forced_tokens, leading_run, repetition_controls
from yue2_jobs.decode.stats import StatsRecorder
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration


@torch.inference_mode()
def nar_generate(model: Yue2ForConditionalGeneration, *, layout: StepLayout, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None,
                 max_new_tokens: int, params: SamplingParams, iterations: int, stats: StatsRecorder) -> torch.Tensor:
    """Decode every row in `iterations` parallel passes; returns (B, 1 + n) as `generate` does.
    The prefill and the vocabulary projection go through the session's `layout` (int8 in an int8
    session); the parallel passes over the canvas read the model's own weights."""
    if params.do_sample:
        raise ValueError("mode 'nar' decodes greedily; do_sample=True needs mode 'ar', 'hybrid' or 'hybrid_fast'")
    cfg, gen = model.config, model.generation_config
    k, eos, pad = cfg.nar_block_size, cfg.eos_token_id, cfg.pad_token_id
    b, dev = input_ids.shape[0], input_ids.device
    total = 1 + max_new_tokens
    enc = model.encode(input_ids, attention_mask, layout=layout)  # the prefill: encoder once, cross-attention K/V
    canvas = input_ids.new_full((b, total), cfg.unk_token_id)  # (B, T): mask tokens to start from
    canvas[:, 0] = cfg.decoder_start_token_id
    from_nar = torch.zeros(b, total, dtype=torch.bool, device=dev)
    positions = torch.arange(total, device=dev)
    width = total
    for _ in range(iterations):
        x = canvas[:, :width]
        hidden = model.decode(x, enc)  # (B, W, C): causal, every position at once
        logits = layout.lm_logits(hidden.reshape(-1, hidden.shape[-1])).reshape(b, x.shape[1], -1)  # (B, W, V)
        if params.controls_repetition:  # position t's context is the canvas up to t, as in `ar`
            logits = repetition_controls(logits, x, positions[1 : width + 1].expand(b, -1), params)
        logp = logits.float().log_softmax(-1)  # (B, W, V)
        ar_score, ar_pred = logp.max(-1)  # (B, W): candidates for positions 1 .. W
        ar_pred = _force(ar_pred, torch.arange(1, width + 1, device=dev), total, gen)
        d_logits, conf = model.draft(hidden, ar_pred, enc)  # (B, W, K, V_d), (B, W, K)
        d_pred, conf = model.draft_tokens(d_logits), conf.sigmoid()  # (B, W, K): slot j at t drafts t + 2 + j
        # Gather every position's candidates: AR from p - 1, NAR from p - 2 - j.
        best = ar_pred.new_full((b, total), pad)
        best_score = torch.full((b, total), float("-inf"), device=dev)
        best_nar = torch.zeros(b, total, dtype=torch.bool, device=dev)
        n = min(width, total - 1)
        best[:, 1 : n + 1], best_score[:, 1 : n + 1] = ar_pred[:, :n], ar_score[:, :n].exp()
        for j in range(k):
            lo = 2 + j  # the first position slot j can reach
            m = min(width, total - lo)
            if m <= 0:
                break
            cand, score = d_pred[:, :m, j], conf[:, :m, j]
            better = score > best_score[:, lo : lo + m]
            best[:, lo : lo + m] = torch.where(better, cand, best[:, lo : lo + m])
            best_score[:, lo : lo + m] = torch.where(better, score, best_score[:, lo : lo + m])
            best_nar[:, lo : lo + m] |= better
        # Up to the end of the self-consistent prefix, the AR choice is exact: take it.
        consistent = leading_run(x[:, 1:] == ar_pred[:, : width - 1])  # (B,) positions 1 .. c agree
        exact = positions[1:] <= (consistent + 1)[:, None]  # (B, T-1): positions whose AR candidate is exact
        exact &= positions[1:] <= n
        best[:, 1:] = torch.where(exact, _pad_to(ar_pred, total - 1, pad), best[:, 1:])
        best_nar[:, 1:] &= ~exact
        best[:, 1:] = _force(best[:, 1:], positions[1:], total, gen)
        canvas, from_nar = best, best_nar
        canvas[:, 0] = cfg.decoder_start_token_id
        # Shrink the canvas to the longest row (its first EOS), keeping one spare position.
        ends = _first_eos(canvas, eos)
        width = min(total, int(ends.max()) + 1)
    ends = _first_eos(canvas, eos)  # (B,): index of each row's EOS, or the last position
    out = canvas.masked_fill(positions > ends[:, None], pad)[:, : int(ends.max()) + 1]
    nar_tokens = (from_nar & (positions <= ends[:, None]) & (positions >= 1)).sum(1)
    stats.record_parallel(steps=iterations, nar=nar_tokens, ar=ends - nar_tokens)  # row b generated ends[b] tokens
    return out


def _first_eos(canvas: torch.Tensor, eos: int) -> torch.Tensor:
    """Index of the first EOS after the start token per row, else the last index."""
    hit = canvas == eos
    hit[:, 0] = False
    return first_true(hit).clamp(max=canvas.shape[1] - 1)


def _pad_to(x: torch.Tensor, width: int, pad: int) -> torch.Tensor:
    if x.shape[1] >= width:
        return x[:, :width]
    return torch.cat([x, x.new_full((x.shape[0], width - x.shape[1]), pad)], 1)


def _force(tokens: torch.Tensor, target_pos: torch.Tensor, total: int, gen: GenerationConfig) -> torch.Tensor:
    forced = forced_tokens(target_pos.expand_as(tokens), total, gen)
    return torch.where(forced >= 0, forced, tokens)
