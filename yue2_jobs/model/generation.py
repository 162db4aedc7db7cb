"""YuE2 generation as small functions over a preallocated KV cache (gpt-fast style).

`generate` is the one entry point for every mode:

- `ar`, `hybrid`, `hybrid_fast`, `prompt_lookup`: `prefill`, then the engine step
  (`engine.py`) in `decode_loop.decode_batch`: one static-shape step for all four, differing
  only in where drafts come from and which are trusted;
- `nar`: fully parallel refinement (`nar_decode.py`).

`sampling.py` defines how tokens are chosen for all of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from yue2_jobs.model.auto_mode import chooser_for
from yue2_jobs.model.decode_loop import DraftPolicy, PromptLookupDrafter, decode_batch
from yue2_jobs.model.decoding import AUTO, MODES, DecodingParams  # noqa: F401 - MODES re-exported
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration
from yue2_jobs.model.sampling import (  # noqa: F401 - re-exported: the sampling API's historic home
    SamplingParams,
    first_true,
    forced_tokens,
    leading_run,
    processed_probs,
    repetition_defaults,
    sampling_params,
    select_next_token,
)
from yue2_jobs.model.stats import SequenceStats, StatsRecorder

DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_NAR_ITERATIONS = 4
# `hybrid` verifies a NAR draft token only while the confidence head's joint p(accept) up to it
# is at least this: at batch 1 a verified slot costs almost nothing, at batch 32 it costs a token.
DEFAULT_MIN_ACCEPT_PROB = 0.05


@dataclass
class Yue2GenerateOutput:
    """`sequences` (B, 1 + n): start token, generated tokens, `pad_token_id` after a row's EOS;
    `stats`: one `SequenceStats` per row; `mode`: the decoding mode used."""

    sequences: torch.Tensor
    stats: list[SequenceStats] = field(default_factory=list)
    mode: str = "ar"


def prefill(model: Yue2ForConditionalGeneration, input_ids: torch.Tensor,
            attention_mask: torch.Tensor | None) -> Yue2EncoderState:
    """Run the encoder once and precompute every layer's cross-attention K/V."""
    return model.encode(input_ids, attention_mask)


@torch.inference_mode()
def generate(
    model: Yue2ForConditionalGeneration,
    *,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    params: DecodingParams | None = None,
    min_accept_prob: float = DEFAULT_MIN_ACCEPT_PROB,
    nar_iterations: int = DEFAULT_NAR_ITERATIONS,
    sync_every: int | None = None,
    return_dict_in_generate: bool = False,
    **decoding: Any,
) -> torch.Tensor | Yue2GenerateOutput:
    """Generate for a batch of encoder inputs, decoded as `params` (`DecodingParams`: mode,
    length, sampling, repetition controls) says; keyword arguments named like its fields
    (`mode="ar"`, `max_new_tokens=32`, as Hugging Face's `generate` takes them) override it.

    Returns (B, 1 + n) token ids that start with the decoder start token, as Hugging Face's
    `generate` does; rows that finished early are padded with `pad_token_id`. With
    `return_dict_in_generate=True`, a `Yue2GenerateOutput` that adds per-row `SequenceStats`.
    `max_new_tokens` defaults to 64 (or less, for a model with fewer positions); a larger
    value than the model's positions allow is an error, never silently cut. `auto` picks `ar` or
    `hybrid`, whichever this model has measured faster at this batch size (`auto_mode.py`); `nar`
    runs `nar_iterations` parallel refinement passes. Every mode but `nar` runs the engine step
    (`engine.py`); `sync_every` steps pass between host reads (default: the device's,
    `decode_loop.SYNC_EVERY`).
    """
    params = (params or DecodingParams()).with_(**decoding)
    mode = params.mode
    max_new_tokens, threshold = _checked(model, input_ids=input_ids, attention_mask=attention_mask,
                                         max_new_tokens=params.max_new_tokens, nar_threshold=params.nar_threshold,
                                         min_accept_prob=min_accept_prob, nar_iterations=nar_iterations,
                                         sync_every=sync_every)
    sampling = sampling_params(params, model.generation_config)
    generator = None
    if params.do_sample:
        generator = torch.Generator(device=input_ids.device)
        generator.manual_seed(0 if params.seed is None else params.seed)
    k = model.config.nar_block_size
    stats = StatsRecorder(input_ids.shape[0], max_nar_per_step=2 * k if mode == "hybrid_fast" else k,
                          device=input_ids.device)
    chooser, started = None, time.perf_counter()
    if mode == AUTO:
        chooser = chooser_for(model)
        mode = chooser.choose(input_ids.shape[0])
    if mode == "nar":
        from yue2_jobs.model.nar_decode import nar_generate

        seqs = nar_generate(model, input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                            params=sampling, iterations=nar_iterations, stats=stats)
    else:
        policy = DraftPolicy(source="nar", trust_threshold=threshold if mode == "hybrid_fast" else None,
                             min_accept_prob=min_accept_prob)
        if mode == "ar":
            policy = DraftPolicy(source="none")
        elif mode == "prompt_lookup":
            lookup = PromptLookupDrafter(input_ids, attention_mask, pad_token_id=model.config.pad_token_id, k=k)
            policy = DraftPolicy(source="host", host_drafter=lookup)
        enc = prefill(model, input_ids, attention_mask)
        buf, lengths = decode_batch(model, enc=enc, batch_size=input_ids.shape[0], max_new_tokens=max_new_tokens,
                                    params=sampling, generator=generator, policy=policy, stats=stats,
                                    sync_every=sync_every)
        seqs = trim_to_lengths(buf, lengths, model.config.pad_token_id)
        if chooser is not None:
            chooser.observe(mode, input_ids.shape[0], tokens=int((lengths - 1).sum()),
                            seconds=time.perf_counter() - started)
    if return_dict_in_generate:
        return Yue2GenerateOutput(sequences=seqs, stats=stats.finish(), mode=mode)
    return seqs


def _checked(model: Yue2ForConditionalGeneration, *, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             max_new_tokens: int | None, nar_threshold: float | None, min_accept_prob: float,
             nar_iterations: int, sync_every: int | None) -> tuple[int, float]:
    """`generate`'s arguments checked, each error naming its field; returns (max_new_tokens, threshold)."""
    limit = model.config.max_position_embeddings - 1  # the start token takes one position
    if max_new_tokens is None:
        max_new_tokens = min(DEFAULT_MAX_NEW_TOKENS, limit)
    if not 1 <= max_new_tokens <= limit:
        raise ValueError(f"max_new_tokens must be between 1 and {limit} (max_position_embeddings - 1), "
                         f"got {max_new_tokens}")
    threshold = model.config.nar_threshold if nar_threshold is None else nar_threshold
    if not 0.0 <= min_accept_prob <= 1.0:
        raise ValueError(f"min_accept_prob must be between 0 and 1, got {min_accept_prob}")
    if nar_iterations < 1:
        raise ValueError(f"nar_iterations must be >= 1, got {nar_iterations}")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be (batch, length) with length >= 1, got shape {tuple(input_ids.shape)}")
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
                             f"got {tuple(attention_mask.shape)}")
        empty = (attention_mask.sum(1) == 0).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"attention_mask: rows {empty} attend to no token (each row needs at least one)")
    if sync_every is not None and sync_every < 1:
        raise ValueError(f"sync_every must be >= 1, got {sync_every}")
    return max_new_tokens, threshold


def trim_to_lengths(buf: torch.Tensor, lengths: torch.Tensor, pad: int) -> torch.Tensor:
    """`generate`'s output from a decode buffer: rows of `buf` (B, T) cut to their lengths (B,),
    padded to the longest."""
    width = int(lengths.max())
    out = buf[:, :width].clone()
    return out.masked_fill(torch.arange(width, device=buf.device) >= lengths[:, None], pad)
