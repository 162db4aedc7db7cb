"""YuE2 generation as small functions over a preallocated KV cache (gpt-fast style).

`generate` is the one entry point for every mode:

- `ar`: one AR step per token (`prefill`, then `decode_one_token` in a loop);
- `hybrid`, `hybrid_fast`, `prompt_lookup`: draft and verify (`speculative.py`);
- `nar`: fully parallel refinement (`nar_decode.py`).

`select_next_token` / `processed_probs` define sampling for all of them. In `ar` mode the
only host synchronisation per step is the "has every row finished?" check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration, Yue2KVCache, Yue2StepLayout
from yue2_jobs.model.stats import SequenceStats, StatsRecorder

MODES = ("ar", "hybrid", "hybrid_fast", "nar", "prompt_lookup")
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


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. `do_sample=False` is greedy and ignores the rest."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def select_next_token(logits: torch.Tensor, params: SamplingParams,
                      generator: torch.Generator | None) -> torch.Tensor:
    """logits (B, V) -> token ids (B,)."""
    if not params.do_sample:
        return logits.argmax(-1)
    return torch.multinomial(processed_probs(logits, params), 1, generator=generator).squeeze(-1)


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution (..., V): temperature, then top-k, then top-p."""
    shape = logits.shape
    logits = logits.reshape(-1, shape[-1]).float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p (the best one always stays).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return logits.softmax(-1).view(shape)


def forced_tokens(target_pos: torch.Tensor, total: int, gen) -> torch.Tensor:
    """The generation config's forced token for each position in `target_pos`: BOS at position
    1, EOS at the last one (`total - 1`), -1 where the model chooses freely."""
    forced = torch.full_like(target_pos, -1)
    if gen.forced_bos_token_id is not None:
        forced = forced.masked_fill(target_pos == 1, gen.forced_bos_token_id)
    if gen.forced_eos_token_id is not None:
        forced = forced.masked_fill(target_pos == total - 1, gen.forced_eos_token_id)
    return forced


def leading_run(mask: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True in each row of (B, N)."""
    return mask.long().cumprod(1).sum(1)


def first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True in each row of (B, N); N where there is none."""
    n = mask.shape[1]
    return torch.where(mask, torch.arange(n, device=mask.device), n).min(1).values


def prefill(model: Yue2ForConditionalGeneration, input_ids: torch.Tensor,
            attention_mask: torch.Tensor | None) -> Yue2EncoderState:
    """Run the encoder once and precompute every layer's cross-attention K/V."""
    return model.encode(input_ids, attention_mask)


def decode_one_token(model: Yue2ForConditionalGeneration, token: torch.Tensor, enc: Yue2EncoderState,
                     caches: list[Yue2KVCache], *, position: int, layout: Yue2StepLayout) -> torch.Tensor:
    """token (B,) at `position` -> next-token logits (B, V), caches extended by one."""
    return model.decode_step(token, enc, caches=caches, position=position, layout=layout)  # (B, V)


@torch.inference_mode()
def generate(
    model: Yue2ForConditionalGeneration,
    *,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int | None = None,
    mode: str = "hybrid",
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    nar_threshold: float | None = None,
    min_accept_prob: float = DEFAULT_MIN_ACCEPT_PROB,
    nar_iterations: int = DEFAULT_NAR_ITERATIONS,
    return_dict_in_generate: bool = False,
) -> torch.Tensor | Yue2GenerateOutput:
    """Generate for a batch of encoder inputs.

    Returns (B, 1 + n) token ids that start with the decoder start token, as Hugging Face's
    `generate` does; rows that finished early are padded with `pad_token_id`. With
    `return_dict_in_generate=True`, a `Yue2GenerateOutput` that adds per-row `SequenceStats`.
    `max_new_tokens` defaults to 64 (or less, for a model with fewer positions); a larger
    value than the model's positions allow is an error, never silently cut.

    `mode`: `ar`, `hybrid` (the default: greedy output identical to `ar`; sampled output
    distributed as `ar`'s), `hybrid_fast` (drafts with confidence >= `nar_threshold`, default the config's,
    are kept unverified), `nar` (`nar_iterations` parallel refinement passes) or
    `prompt_lookup` (drafts copied from the input, verified; lossless like `hybrid`).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    limit = model.config.max_position_embeddings - 1  # the start token takes one position
    if max_new_tokens is None:
        max_new_tokens = min(DEFAULT_MAX_NEW_TOKENS, limit)
    if not 1 <= max_new_tokens <= limit:
        raise ValueError(f"max_new_tokens must be between 1 and {limit} (max_position_embeddings - 1), "
                         f"got {max_new_tokens}")
    threshold = model.config.nar_threshold if nar_threshold is None else nar_threshold
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"nar_threshold must be between 0 and 1, got {threshold}")
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
    params = SamplingParams(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)
    generator = None
    if do_sample:
        generator = torch.Generator(device=input_ids.device)
        generator.manual_seed(0 if seed is None else seed)
    k = model.config.nar_block_size
    stats = StatsRecorder(input_ids.shape[0], max_nar_per_step=2 * k if mode == "hybrid_fast" else k,
                          device=input_ids.device)
    if mode == "ar":
        seqs = _generate_ar(model, input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                            params=params, generator=generator, stats=stats)
    elif mode == "nar":
        from yue2_jobs.model.nar_decode import nar_generate

        seqs = nar_generate(model, input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                            params=params, iterations=nar_iterations, stats=stats)
    else:
        from yue2_jobs.model.speculative import DraftPolicy, PromptLookupDrafter, speculative_generate

        lookup = None
        if mode == "prompt_lookup":
            lookup = PromptLookupDrafter(input_ids, attention_mask, pad_token_id=model.config.pad_token_id, k=k)
        policy = DraftPolicy(host_drafter=lookup, trust_threshold=threshold if mode == "hybrid_fast" else None,
                             min_accept_prob=min_accept_prob)
        enc = prefill(model, input_ids, attention_mask)
        buf, lengths = speculative_generate(model, enc=enc, input_ids=input_ids, attention_mask=attention_mask,
                                            max_new_tokens=max_new_tokens, params=params, generator=generator,
                                            policy=policy, stats=stats)
        seqs = trim_to_lengths(buf, lengths, model.config.pad_token_id)
    if return_dict_in_generate:
        return Yue2GenerateOutput(sequences=seqs, stats=stats.finish(), mode=mode)
    return seqs


def trim_to_lengths(buf: torch.Tensor, lengths: torch.Tensor, pad: int) -> torch.Tensor:
    """`generate`'s output from a decode buffer: rows of `buf` (B, T) cut to their lengths (B,),
    padded to the longest."""
    width = int(lengths.max())
    out = buf[:, :width].clone()
    return out.masked_fill(torch.arange(width, device=buf.device) >= lengths[:, None], pad)


def _generate_ar(model: Yue2ForConditionalGeneration, *, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None, max_new_tokens: int, params: SamplingParams,
                 generator: torch.Generator | None, stats: StatsRecorder) -> torch.Tensor:
    cfg, gen = model.config, model.generation_config
    b = input_ids.shape[0]
    total = 1 + max_new_tokens
    enc = prefill(model, input_ids, attention_mask)
    caches = model.new_caches(batch_size=b, max_len=total)
    layout = model.step_layout()
    tokens = input_ids.new_full((b, total), cfg.pad_token_id)  # (B, T_max)
    tokens[:, 0] = cfg.decoder_start_token_id
    finished = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
    generated = torch.zeros(b, dtype=torch.long, device=input_ids.device)
    rows = torch.arange(b, device=input_ids.device)  # the rows still decoding
    forced = tokens.new_empty(b)
    length = 1
    for pos in range(total - 1):
        logits = decode_one_token(model, tokens[rows, pos], enc, caches, position=pos, layout=layout)  # (A, V)
        if pos == 0 and gen.forced_bos_token_id is not None:
            nxt = forced[: len(rows)].fill_(gen.forced_bos_token_id)
        elif pos == total - 2 and gen.forced_eos_token_id is not None:
            nxt = forced[: len(rows)].fill_(gen.forced_eos_token_id)
        else:
            nxt = select_next_token(logits, params, generator)  # (A,)
        done_before = finished[rows]
        nxt = nxt.masked_fill(done_before, cfg.pad_token_id)
        tokens[rows, pos + 1] = nxt
        generated[rows] += (~done_before).long()
        length = pos + 2
        done = done_before | (nxt == cfg.eos_token_id)
        finished[rows] = done
        n_done = int(done.sum())  # the one host sync per step
        if n_done == len(rows):
            break
        if 4 * n_done >= len(rows):  # finished rows stop costing compute once they are a quarter
            keep = (~done).nonzero().squeeze(1)
            rows = rows[keep]
            enc = enc.select(keep)
            for cache in caches:
                cache.select(keep)
    stats.record_ar_tokens(generated)
    return tokens[:, :length]
