"""The decode engine: one static-shape step for `ar`, `hybrid`, `hybrid_fast` and `prompt_lookup`.

`engine_step` advances every row of a working set (A rows) by one decoder step, the way
gpt-fast's `decode_one_token` does for one token: each row feeds its uncached committed tokens
and then the drafts to verify, `width` slots per row (1 for a set that never drafts, 1 + K
otherwise, or on the CPU 1 + the most drafts any row holds: `StepShape.narrowed`; unused slots
are padding), at its own positions. The AR branch's choices decide how
many drafts are accepted; the bonus token the AR branch picks after them is committed too; the
NAR branch then drafts the next K tokens from the hidden state that chose the bonus. Every
decision is a tensor op on the device and every state write is an in-place copy, so the step
never synchronises with the host and can be replayed from a CUDA graph (`graphs.py`; `steps.py`
runs a step from its graph or eagerly).

`ar` is the same step with no drafts (width 1, nothing to verify, no NAR pass). Greedy output is
`ar` greedy in every lossless mode (the repetition controls apply to every verified slot with
that slot's own context, so they keep it so); with sampling, speculative sampling's acceptance rule keeps
the distribution `ar`'s. `hybrid_fast` commits drafts whose confidence reaches the row's
`trust_p` without verifying them (lossy).

Rows that finish keep their slot until the host next looks (every `sync_every` steps): a
finished row commits nothing more, so no token past its EOS is ever returned.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Literal

import torch
from transformers import GenerationConfig

from yue2_jobs.decode.rows import Rows
from yue2_jobs.decode.sampling import (
    SamplingParams,
    first_true,
    forced_tokens,
    leading_run,
    processed_probs,
    repetition_controls,
)
from yue2_jobs.model.modeling_yue2 import (
    Yue2EncoderState,
    Yue2ForConditionalGeneration,
    Yue2KVCache,
    Yue2StepWeights,
)

DraftSource = Literal["none", "nar", "host"]
NEVER_TRUST = 2.0  # a `trust_p` above any confidence: every draft is verified
GREEDY = SamplingParams()


@dataclass(frozen=True)
class StepShape:
    """What is static about a working set's steps (the host knows it without reading the device).

    `width`: slots fed per row, 1 when the set never drafts, else 1 + K (or fewer: `narrowed`). `drafts`: where drafts
    come from. `trust`: some row may commit drafts unverified (`hybrid_fast`). `ban_eos`: some row
    has a minimum length. Work a flag rules out is skipped, not computed and masked.
    """

    width: int
    drafts: DraftSource = "nar"
    params: SamplingParams = GREEDY
    trust: bool = False
    ban_eos: bool = False

    @classmethod
    def of(cls, *, k: int, drafts: DraftSource, params: SamplingParams = GREEDY, trust: bool = False,
           ban_eos: bool = False) -> StepShape:
        return cls(width=1 if drafts == "none" else 1 + k, drafts=drafts, params=params, trust=trust,
                   ban_eos=ban_eos)

    def narrowed(self, max_drafts: int) -> StepShape:
        """This shape with only the slots the rows' drafts fill: 1 + `max_drafts` (the most drafts
        any row holds, which the host read with the finished flags), where that is allowed.

        For a host that reads every step and replays no graph (the CPU), where the layout says rows
        cost (`StepLayout.narrow_pays`): at base's width (192) MKL's product of 5 rows costs about
        2.5 of one row's, and base's rows verify 1.9 drafts a step on average (their confidence
        cuts the rest), so a static 1 + K slots computes three rows a step that verify nothing. Greedy
        steps without trusted drafts only: there each row feeds one committed token (its bonus)
        before its drafts. Width 1 still drafts (nothing to verify, then the NAR pass)."""
        if self.drafts == "none" or self.trust or self.params.do_sample:
            return self
        return replace(self, width=min(self.width, 1 + max_drafts))


def engine_step(model: Yue2ForConditionalGeneration, rows: Rows, enc: Yue2EncoderState, caches: list[Yue2KVCache], *,
                layout: Yue2StepWeights, shape: StepShape, span: int, generator: torch.Generator | None = None,
                draft_q: list[torch.Tensor | None] | None = None) -> None:
    """One decoder step over every row of `rows` (updated in place); see the module docstring.

    `span`: how many cache positions attention reads; any value above every row's last position
    is correct (the full cache length on a GPU, the live reach on the CPU). `draft_q`, when
    sampling, holds the drafts' sampling distributions (A, K, V) from step to step.
    """
    eos = model.config.eos_token_id
    w = shape.width
    slot = _arange(w, rows.buf.device)  # (W,)
    hidden, n_in = _feed(model, rows, enc, caches, layout=layout, shape=shape, span=span, slot=slot)
    logits = layout.lm_logits(hidden.reshape(-1, hidden.shape[-1])).view(hidden.shape[0], w, -1)  # (A, W, V)
    target = rows.committed[:, None] + slot  # (A, W): the position each prediction fills
    if shape.ban_eos:
        logits[:, :, eos] = logits[:, :, eos].masked_fill(target < rows.min_total[:, None], float("-inf"))
    if shape.params.controls_repetition:
        logits = repetition_controls(logits, _context(rows, w), target, shape.params)
    room = rows.total - rows.committed
    if shape.params.do_sample:
        n_acc, new = _accept_sampled(model, rows, logits, target, shape, generator, draft_q)
    else:  # the accepted drafts equal the AR choices, so the AR choices are the new tokens
        new = _force(logits.argmax(-1), target, rows.total, model.generation_config)  # (A, W)
        n_acc = None if shape.drafts == "none" else leading_run(
            (rows.drafts[:, : w - 1] == new[:, :-1]) & (slot[:-1] < rows.n_drafts[:, None]))
    rows.buf.scatter_(1, rows.committed[:, None] + slot, new)  # past the new `committed` it is scratch
    if n_acc is None:  # one new token per row, from the AR branch; every live row has room for it
        _commit_one(rows, done=(new[:, 0] == eos) | (room <= 1))
        return
    stepped = ~rows.finished
    bonus = new.gather(1, n_acc[:, None]).squeeze(1)  # (A,)
    first_eos = first_true(new == eos)  # (A,)
    count = torch.minimum(torch.minimum(n_acc, first_eos) + 1, room) * stepped
    from_nar = torch.minimum(n_acc, count)
    committed, finished = rows.committed + count, rows.finished | ((first_eos < count) | (count >= room))
    drafted = rows.n_drafts * stepped
    n_trust = None
    if shape.drafts == "nar":
        # The hidden state that predicted the bonus token (prediction slot from_nar) drafts on.
        at = from_nar[:, None, None].expand(-1, 1, hidden.shape[-1])
        committed, finished, n_trust = _next_drafts(model, rows, enc, layout=layout, shape=shape,
                                                    h_src=hidden.gather(1, at)[:, 0], bonus=bonus,
                                                    committed=committed, finished=finished, generator=generator,
                                                    draft_q=draft_q)
    assert n_in is not None  # a drafting shape (`ar` committed above), so `_feed` counted the fed tokens
    _commit(rows, stepped=stepped, n_in=n_in, count=count, from_nar=from_nar, n_trust=n_trust, committed=committed,
            finished=finished, drafted=drafted)


def _context(rows: Rows, w: int) -> torch.Tensor:
    """(A, T_buf): each row's committed tokens followed by its drafts, so slot s's context (the
    tokens before the position it predicts) is a prefix: committed + s tokens long."""
    if w == 1:
        return rows.buf
    k = rows.drafts.shape[1]
    at = (rows.committed[:, None] + _arange(k, rows.buf.device)).clamp(max=rows.buf.shape[1] - 1)  # (A, K)
    return rows.buf.scatter(1, at, rows.drafts)


def _arange(n: int, device: torch.device) -> torch.Tensor:
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return torch.arange(n, device=device)  # traced: a cached tensor would keep the tracer's fake one
    return _cached_arange(n, device)


@functools.cache
def _cached_arange(n: int, device: torch.device) -> torch.Tensor:
    with torch.inference_mode():
        return torch.arange(n, device=device)


def _feed(model: Yue2ForConditionalGeneration, rows: Rows, enc: Yue2EncoderState, caches: list[Yue2KVCache], *,
          layout: Yue2StepWeights, shape: StepShape, span: int,
          slot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the AR branch over each row's uncached committed tokens, then its drafts. Returns the
    hidden states (A, W, C) that predict drafts 0.. and then the bonus token, and how many
    committed tokens each row fed, n_in (A,) (None for `ar`: always one)."""
    w, k = shape.width, model.config.nar_block_size
    positions = rows.cached[:, None] + slot  # (A, W)
    tokens = rows.buf.gather(1, positions)  # (A, W)
    n_in = None
    if shape.drafts != "none":
        n_in = (rows.committed - rows.cached).clamp(min=1)  # (A,); a finished row may have none left
        d_idx = slot - n_in[:, None]  # (A, W): which draft a slot holds
        is_draft = (d_idx >= 0) & (d_idx < rows.n_drafts[:, None])
        tokens = torch.where(is_draft, rows.drafts.gather(1, d_idx.clamp(0, k - 1)), tokens)
    hidden = model.decode_block(tokens, enc, caches=caches, positions=positions, layout=layout, span=span)
    if n_in is not None and shape.trust:  # trusted tokens are fed uncached: slot n_in - 1 + i predicts draft i
        pred_slot = ((n_in - 1)[:, None] + slot).clamp(max=w - 1)  # (A, W)
        hidden = hidden.gather(1, pred_slot[:, :, None].expand(-1, -1, hidden.shape[-1]))
    return hidden, n_in


def _force(tokens: torch.Tensor, target: torch.Tensor, total: torch.Tensor, gen: GenerationConfig) -> torch.Tensor:
    """tokens (A, W) with the generation config's forced tokens put in: EOS at each row's last
    position (total - 1), BOS at position 1."""
    if gen.forced_eos_token_id is not None:
        tokens = torch.where(target == (total - 1)[:, None], gen.forced_eos_token_id, tokens)
    if gen.forced_bos_token_id is not None:
        tokens = torch.where(target == 1, gen.forced_bos_token_id, tokens)
    return tokens


def _commit_one(rows: Rows, *, done: torch.Tensor) -> None:
    """`ar` (width 1, no drafts): each live row committed one AR token (its last if `done`). Finished rows are
    already finished, so `finished |= done` needs no live-row mask."""
    stepped = ~rows.finished
    rows.finished.logical_or_(done)
    for counter in (rows.committed, rows.cached, rows.steps, rows.ar):
        counter.add_(stepped)
    rows.histogram[:, 0].add_(stepped)


def _commit(rows: Rows, *, stepped: torch.Tensor, n_in: torch.Tensor, count: torch.Tensor,
            from_nar: torch.Tensor, n_trust: torch.Tensor | None, committed: torch.Tensor,
            finished: torch.Tensor, drafted: torch.Tensor) -> None:
    """Write the step's outcome into `rows`, in place (CUDA graphs replay into the same tensors)."""
    rows.committed.copy_(committed)
    rows.finished.copy_(finished)
    rows.steps.add_(stepped)
    rows.cached.add_((n_in + from_nar) * stepped)
    nar = from_nar if n_trust is None else from_nar + n_trust
    rows.nar.add_(nar)
    rows.ar.add_(count - from_nar)
    rows.drafted.add_(drafted)
    rows.histogram.scatter_add_(1, nar[:, None], stepped.long()[:, None])


def _accept_sampled(model: Yue2ForConditionalGeneration, rows: Rows, logits: torch.Tensor, target: torch.Tensor,
                    shape: StepShape, generator: torch.Generator | None,
                    draft_q: list[torch.Tensor | None] | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Speculative sampling: accept draft i with probability min(1, p/q); on a rejection draw the
    bonus from the residual max(0, p - q), else from p. Returns n_acc (A,) (None for `ar`)
    and the new tokens (A, W): the accepted drafts, then the bonus token."""
    p = processed_probs(logits, shape.params)  # (A, W, V)
    forced = forced_tokens(target, rows.total[:, None], model.generation_config)  # (A, W), -1 where free
    one_hot = torch.zeros_like(p).scatter_(2, forced.clamp(min=0)[:, :, None], 1.0)
    p = torch.where((forced >= 0)[:, :, None], one_hot, p)
    w = p.shape[1]
    if shape.drafts == "none":  # sampled shapes are never narrowed: a drafting one is 1 + K wide
        return None, torch.multinomial(p[:, 0], 1, generator=generator)
    act = rows.drafts  # (A, K)
    q = draft_q[0] if draft_q else None
    if shape.drafts == "host" or q is None:  # a copied draft is certain: q is one-hot on it
        q = torch.zeros_like(p[:, : w - 1]).scatter_(2, act[:, :, None], 1.0)
    p_d = p[:, : w - 1].gather(2, act[:, :, None]).squeeze(2)  # (A, K)
    q_d = q.gather(2, act[:, :, None]).squeeze(2).clamp(min=1e-20)
    u = torch.rand(p_d.shape, generator=generator, device=p.device)
    in_range = torch.arange(w - 1, device=p.device) < rows.n_drafts[:, None]
    n_acc = leading_run((u * q_d < p_d) & in_range)
    p_n = p.gather(1, n_acc[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)  # (A, V)
    q_n = q.gather(1, n_acc.clamp(max=w - 2)[:, None, None].expand(-1, 1, q.shape[-1])).squeeze(1)
    residual = torch.where((n_acc < rows.n_drafts)[:, None], (p_n - q_n).clamp(min=0), p_n)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    bonus = torch.multinomial(residual, 1, generator=generator)  # (A, 1)
    new = torch.cat([act, bonus], 1).scatter(1, n_acc[:, None], bonus)  # drafts before n_acc, then the bonus
    return n_acc, new


def _next_drafts(model: Yue2ForConditionalGeneration, rows: Rows, enc: Yue2EncoderState, *, layout: Yue2StepWeights,
                 shape: StepShape, h_src: torch.Tensor, bonus: torch.Tensor, committed: torch.Tensor,
                 finished: torch.Tensor, generator: torch.Generator | None,
                 draft_q: list[torch.Tensor | None] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The NAR branch drafts K tokens after each row's bonus; with `shape.trust`, rows commit the
    confident leading run at once. Writes drafts and n_drafts (and trusted tokens) into `rows`;
    returns the new committed and finished (A,) and the trusted counts (A,) or None."""
    d_logits, conf = model.draft_step(h_src, bonus, enc, layout=layout)  # (A, K, V_d), (A, K)
    conf = conf.sigmoid()
    q = None
    if shape.params.do_sample:
        q = processed_probs(d_logits, shape.params)  # (A, K, V_d)
        drafts = torch.multinomial(q.flatten(0, 1), 1, generator=generator).view(conf.shape)
        ids = model.draft_vocab
        if ids is not None:  # the acceptance rule compares q with p over the whole vocabulary
            drafts = ids[drafts]
            q = q.new_zeros(*q.shape[:2], model.config.vocab_size).index_copy_(2, ids, q)
    else:
        drafts = model.draft_tokens(d_logits)  # (A, K)
    room = rows.total - committed
    n_trust = None
    if shape.trust:
        committed, finished, n_trust, drafts, conf, q = _trust(model, rows, drafts, conf, q, committed=committed,
                                                               finished=finished, room=room)
        room = room - n_trust
    # Verified next step while their joint confidence lasts.
    n_verify = torch.minimum(leading_run(conf.cumprod(1) >= rows.accept_p[:, None]), room)
    rows.drafts.copy_(drafts)
    rows.n_drafts.copy_(n_verify * (~finished & rows.draft_on))
    if q is not None and draft_q is not None:
        draft_q[:] = [q]
    return committed, finished, n_trust


def _trust(model: Yue2ForConditionalGeneration, rows: Rows, drafts: torch.Tensor, conf: torch.Tensor,
           q: torch.Tensor | None, *, committed: torch.Tensor, finished: torch.Tensor,
           room: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                        torch.Tensor | None]:
    """`hybrid_fast`: commit each live row's leading run of drafts with confidence >= its
    trust_p (cut at EOS and the length limit); the rest shift left, to be verified."""
    k = drafts.shape[1]
    kk = torch.arange(k, device=drafts.device)
    n_trust, trust_done = _cut(drafts, leading_run(conf >= rows.trust_p[:, None]),
                               eos=model.config.eos_token_id, room=room)
    n_trust = n_trust * (~finished & rows.draft_on)
    rows.buf.scatter_(1, committed[:, None] + kk, drafts)  # past the trusted run it is scratch
    finished = finished | (trust_done & (n_trust > 0))
    shift = (kk + n_trust[:, None]).clamp(max=k - 1)  # (A, K)
    conf = torch.where(kk + n_trust[:, None] < k, conf.gather(1, shift), 0.0)
    if q is not None:
        q = q.gather(1, shift[:, :, None].expand(-1, -1, q.shape[-1]))
    return committed + n_trust, finished, n_trust, drafts.gather(1, shift), conf, q


def _cut(new: torch.Tensor, count: torch.Tensor, *, eos: int, room: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """How many of `new` (A, N) to commit, wanting `count`: none past the first EOS or the
    length limit (`room` tokens left). Also says which rows that finishes."""
    first_eos = first_true(new == eos)  # (A,)
    n = torch.minimum(torch.minimum(count, first_eos + 1), room)
    return n, (first_eos < n) | (n >= room)
