"""How the next token is chosen, shared by every decoding mode: sampling parameters, the
sampling distribution, forced tokens and two small mask reductions the decoders use."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig


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


def forced_tokens(target_pos: torch.Tensor, total: int | torch.Tensor, gen: GenerationConfig) -> torch.Tensor:
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
