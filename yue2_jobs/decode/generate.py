"""YuE2 generation of one batch as small functions over a preallocated KV cache (gpt-fast style).

`generate` (what `DecodeSession.generate` runs) is the one entry point for every mode:

- `ar`, `hybrid`, `hybrid_fast`, `prompt_lookup`: `prefill`, then the engine step
  (`engine.py`) in `loop.decode_batch`: one static-shape step for all four, differing
  only in where drafts come from and which are trusted;
- `nar`: fully parallel refinement (`nar.py`).

`sampling.py` defines how tokens are chosen for all of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from yue2_jobs.decode.auto_mode import ModeChooser
from yue2_jobs.decode.loop import DraftPolicy, PromptLookupDrafter, decode_batch
from yue2_jobs.decode.nar import nar_generate
from yue2_jobs.decode.params import AUTO, DEFAULT_MIN_ACCEPT_PROB, DecodingParams, Mode
from yue2_jobs.decode.sampling import SamplingParams
from yue2_jobs.decode.stats import SequenceStats, StatsRecorder
from yue2_jobs.decode.steps import Steps
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration

DEFAULT_NAR_ITERATIONS = 4


@dataclass
class Yue2GenerateOutput:
    """`sequences` (B, 1 + n): start token, generated tokens, `pad_token_id` after a row's EOS;
    `stats`: one `SequenceStats` per row; `mode`: the decoding mode used."""

    sequences: torch.Tensor
    stats: list[SequenceStats] = field(default_factory=list)
    mode: Mode = "ar"


def prefill(steps: Steps, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> Yue2EncoderState:
    """Run the encoder once and precompute every layer's cross-attention K/V (`Steps.prefill`)."""
    return steps.prefill(input_ids, attention_mask)


@torch.inference_mode()
def generate(steps: Steps, chooser: ModeChooser, *, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             params: DecodingParams, min_accept_prob: float = DEFAULT_MIN_ACCEPT_PROB,
             nar_iterations: int = DEFAULT_NAR_ITERATIONS, sync_every: int | None = None) -> Yue2GenerateOutput:
    """Generate for a batch of encoder inputs (B, S), decoded as `params` says, on `steps`' model.

    `sequences` (B, 1 + n) start with the decoder start token, as Hugging Face's `generate`
    returns them; rows that finished early are padded with `pad_token_id`. `auto` asks `chooser`
    for `ar` or `hybrid` (whichever this session measured faster at this batch size) and tells it
    what the batch cost; `nar` runs `nar_iterations` parallel refinement passes. Every mode but
    `nar` runs the engine step; `sync_every` steps pass between host reads (default: the
    device's, `loop.SYNC_EVERY`).
    """
    model = steps.model
    mode = params.mode
    threshold = _checked(model, input_ids=input_ids, attention_mask=attention_mask, params=params,
                         min_accept_prob=min_accept_prob, nar_iterations=nar_iterations, sync_every=sync_every)
    sampling = SamplingParams.of(params, model.generation_config)
    generator = None
    if params.do_sample:
        generator = torch.Generator(device=input_ids.device)
        generator.manual_seed(0 if params.seed is None else params.seed)
    k = model.config.nar_block_size
    stats = StatsRecorder(input_ids.shape[0], max_nar_per_step=2 * k if mode == "hybrid_fast" else k,
                          device=input_ids.device)
    started = time.perf_counter()
    if mode == AUTO:  # sampled: `ar` and `hybrid` draw different tokens, so a seed must name one
        mode = "ar" if params.do_sample else chooser.choose(input_ids.shape[0])
    if mode == "nar":
        seqs = nar_generate(model, layout=steps.layout(), input_ids=input_ids, attention_mask=attention_mask,
                            max_new_tokens=params.max_new_tokens, params=sampling, iterations=nar_iterations,
                            stats=stats)
        return Yue2GenerateOutput(sequences=seqs, stats=stats.finish(), mode=mode)
    policy = DraftPolicy(source="nar", trust_threshold=threshold if mode == "hybrid_fast" else None,
                         min_accept_prob=min_accept_prob)
    if mode == "ar":
        policy = DraftPolicy(source="none")
    elif mode == "prompt_lookup":
        lookup = PromptLookupDrafter(input_ids, attention_mask, pad_token_id=model.config.pad_token_id, k=k)
        policy = DraftPolicy(source="host", host_drafter=lookup)
    enc = prefill(steps, input_ids, attention_mask)
    buf, lengths = decode_batch(steps, enc=enc, batch_size=input_ids.shape[0], max_new_tokens=params.max_new_tokens,
                                params=sampling, generator=generator, policy=policy, stats=stats,
                                sync_every=sync_every)
    seqs = trim_to_lengths(buf, lengths, model.config.pad_token_id)
    if params.mode == AUTO and not params.do_sample:
        chooser.observe(mode, input_ids.shape[0], tokens=int((lengths - 1).sum()),
                        seconds=time.perf_counter() - started)
    return Yue2GenerateOutput(sequences=seqs, stats=stats.finish(), mode=mode)


def _checked(model: Yue2ForConditionalGeneration, *, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             params: DecodingParams, min_accept_prob: float, nar_iterations: int, sync_every: int | None) -> float:
    """`generate`'s arguments checked against the model, each error naming its field; returns the
    `hybrid_fast` trust threshold."""
    limit = model.config.max_position_embeddings - 1  # the start token takes one position
    if params.max_new_tokens > limit:
        raise ValueError(f"max_new_tokens must be between 1 and {limit} (max_position_embeddings - 1), "
                         f"got {params.max_new_tokens}")
    threshold = model.config.nar_threshold if params.nar_threshold is None else params.nar_threshold
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
    return threshold


def trim_to_lengths(buf: torch.Tensor, lengths: torch.Tensor, pad: int) -> torch.Tensor:
    """`generate`'s output from a decode buffer: rows of `buf` (B, T) cut to their lengths (B,),
    padded to the longest."""
    width = int(lengths.max())
    out = buf[:, :width].clone()
    return out.masked_fill(torch.arange(width, device=buf.device) >= lengths[:, None], pad)
