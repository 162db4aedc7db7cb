"""How the next token is chosen, shared by every decoding mode: sampling parameters, the
repetition controls, the sampling distribution, forced tokens and two small mask reductions the
decoders use."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from yue2_jobs.decode.params import DecodingParams

# What a step reads when nothing is asked: greedy, no repetition controls.
_PLAIN = DecodingParams(repetition_penalty=1.0, no_repeat_ngram_size=0)


@dataclass(frozen=True)
class SamplingParams:
    """How each step chooses its next token: a request's `DecodingParams` as the engine step reads
    them. Nothing is declared twice: `resolved` is a `DecodingParams` holding the request's
    sampling fields and its repetition controls resolved to numbers (the request's, else the
    checkpoint generation config's, as Hugging Face's `generate` takes them), every other field
    at its default, so two requests that choose tokens alike have equal (hashable)
    `SamplingParams`: a `StepShape`, the key of captured CUDA graphs, holds one. `DecodingParams`
    checks every value, the generation config's included.

    `do_sample=False` is greedy and ignores temperature, top_k and top_p. `repetition_penalty`
    divides the (positive) logit of every token already in the decoder sequence by the penalty,
    and multiplies a negative one by it (1 is off); `no_repeat_ngram_size` n > 0 bans any token
    that would complete an n-gram the sequence already holds. The decoder sequence starts with the
    decoder start token."""

    resolved: DecodingParams = _PLAIN

    @classmethod
    def of(cls, params: DecodingParams, gen: GenerationConfig | None = None) -> SamplingParams:
        """The per-step parameters of a request decoded with generation config `gen` (None: a
        checkpoint without repetition controls)."""
        penalty = params.repetition_penalty
        if penalty is None:
            penalty = gen.repetition_penalty if gen is not None and gen.repetition_penalty is not None else 1.0
        ngram = params.no_repeat_ngram_size
        if ngram is None:
            ngram = (gen.no_repeat_ngram_size if gen is not None else 0) or 0
        return cls(DecodingParams(do_sample=params.do_sample, temperature=params.temperature, top_k=params.top_k,
                                  top_p=params.top_p, repetition_penalty=float(penalty),
                                  no_repeat_ngram_size=int(ngram)))

    @classmethod
    def greedy(cls, gen: GenerationConfig) -> SamplingParams:
        """Greedy with the checkpoint's repetition controls: what the continuous engine runs."""
        return cls.of(DecodingParams(), gen)

    @property
    def do_sample(self) -> bool:
        return self.resolved.do_sample

    @property
    def temperature(self) -> float:
        return self.resolved.temperature

    @property
    def top_k(self) -> int:
        return self.resolved.top_k

    @property
    def top_p(self) -> float:
        return self.resolved.top_p

    @property
    def repetition_penalty(self) -> float:
        return 1.0 if self.resolved.repetition_penalty is None else self.resolved.repetition_penalty

    @property
    def no_repeat_ngram_size(self) -> int:
        return self.resolved.no_repeat_ngram_size or 0

    @property
    def controls_repetition(self) -> bool:
        return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0


def select_next_token(logits: torch.Tensor, params: SamplingParams,
                      generator: torch.Generator | None) -> torch.Tensor:
    """logits (B, V) -> token ids (B,)."""
    if not params.do_sample:
        return logits.argmax(-1)
    return torch.multinomial(processed_probs(logits, params), 1, generator=generator).squeeze(-1)


def repetition_controls(logits: torch.Tensor, seq: torch.Tensor, length: torch.Tensor,
                        params: SamplingParams) -> torch.Tensor:
    """`params`' repetition controls applied to logits (A, W, V), where slot (a, w) predicts the
    token that follows seq[a, :length[a, w]]: seq (A, T) holds every slot's context as a prefix
    (the committed tokens, then the drafts being verified). Static shapes, no host sync.

    Both controls write at the context's token ids (gather, then scatter: A x W x T elements)
    rather than building an (A, W, V) mask of seen or banned ids, which cost 2-5x as much eager
    and far more compiled. A write that misses (a position outside the context) lands in a spare
    column V; the same id written twice gets the same value, so the order of writes is moot."""
    a, w, v = logits.shape
    t = seq.shape[1]
    n = params.no_repeat_ngram_size
    ngrams = n > 0 and t >= n
    if params.repetition_penalty == 1.0 and not ngrams:
        return logits
    pos = torch.arange(t, device=seq.device)
    ext = torch.cat([logits, logits.new_zeros(a, w, 1)], 2)  # (A, W, V + 1)
    if params.repetition_penalty != 1.0:
        idx = torch.where(pos < length[:, :, None], seq[:, None, :], v)  # (A, W, T)
        seen = ext.gather(2, idx)
        penalty = params.repetition_penalty
        ext = ext.scatter(2, idx, torch.where(seen < 0, seen * penalty, seen / penalty))
    if ngrams:
        # n-gram i is seq[i : i + n]; it bans seq[i + n - 1] where seq[i : i + n - 1] equals the
        # context's last n - 1 tokens and the whole n-gram lies inside the context.
        starts = pos[: t - n + 1]  # (G,)
        ok = (starts + n <= length[:, :, None])  # (A, W, G)
        if n > 1:
            grams = seq.unfold(1, n - 1, 1)[:, : t - n + 1]  # (A, G, n - 1)
            tail_at = (length - n + 1).clamp(min=0)  # (A, W): where the context's last n - 1 tokens start
            tail = seq.unfold(1, n - 1, 1).gather(1, tail_at[:, :, None].expand(-1, -1, n - 1))  # (A, W, n - 1)
            ok &= (grams[:, None] == tail[:, :, None]).all(-1)
        ext = ext.scatter(2, torch.where(ok, seq[:, None, n - 1 :], v), float("-inf"))  # (A, W, G) ids
    return ext[..., :v]


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
