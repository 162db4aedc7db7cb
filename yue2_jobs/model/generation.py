"""YuE2 generation as small functions over a preallocated KV cache (gpt-fast style).

`generate` is the one entry point; `prefill` / `decode_one_token` / `select_next_token` are
the pieces the hybrid and NAR modes reuse. The only host synchronisation per step is the
"has every row finished?" check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration, Yue2KVCache, Yue2StepLayout

MODES = ("ar", "hybrid", "hybrid_fast", "nar")
DEFAULT_MAX_NEW_TOKENS = 64


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
    logits = logits.float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p (the best one always stays).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


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
    mode: str = "ar",
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> torch.Tensor:
    """Generate for a batch of encoder inputs.

    Returns (B, 1 + n) token ids that start with the decoder start token, as Hugging Face's
    `generate` does; rows that finished early are padded with `pad_token_id`.
    `max_new_tokens` defaults to 64 (or less, for a model with fewer positions); a larger
    value than the model's positions allow is an error, never silently cut.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "ar":
        raise NotImplementedError(f"mode {mode!r} is not implemented yet; only 'ar' is available")
    limit = model.config.max_position_embeddings - 1  # the start token takes one position
    if max_new_tokens is None:
        max_new_tokens = min(DEFAULT_MAX_NEW_TOKENS, limit)
    if not 1 <= max_new_tokens <= limit:
        raise ValueError(f"max_new_tokens must be between 1 and {limit} (max_position_embeddings - 1), "
                         f"got {max_new_tokens}")
    params = SamplingParams(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)
    generator = None
    if do_sample:
        generator = torch.Generator(device=input_ids.device)
        generator.manual_seed(0 if seed is None else seed)
    return _generate_ar(model, input_ids=input_ids, attention_mask=attention_mask,
                        max_new_tokens=max_new_tokens, params=params, generator=generator)


def _generate_ar(model: Yue2ForConditionalGeneration, *, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None, max_new_tokens: int, params: SamplingParams,
                 generator: torch.Generator | None) -> torch.Tensor:
    cfg, gen = model.config, model.generation_config
    b = input_ids.shape[0]
    total = 1 + max_new_tokens
    enc = prefill(model, input_ids, attention_mask)
    caches = model.new_caches(batch_size=b, max_len=total)
    layout = model.step_layout()
    tokens = input_ids.new_full((b, total), cfg.pad_token_id)  # (B, T_max)
    tokens[:, 0] = cfg.decoder_start_token_id
    finished = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
    forced = tokens.new_empty(b)
    length = 1
    for pos in range(total - 1):
        logits = decode_one_token(model, tokens[:, pos], enc, caches, position=pos, layout=layout)  # (B, V)
        if pos == 0 and gen.forced_bos_token_id is not None:
            nxt = forced.fill_(gen.forced_bos_token_id)
        elif pos == total - 2 and gen.forced_eos_token_id is not None:
            nxt = forced.fill_(gen.forced_eos_token_id)
        else:
            nxt = select_next_token(logits, params, generator)  # (B,)
        nxt = nxt.masked_fill(finished, cfg.pad_token_id)
        tokens[:, pos + 1] = nxt
        length = pos + 2
        finished |= nxt == cfg.eos_token_id
        if bool(finished.all()):  # the one host sync per step
            break
    return tokens[:, :length]
