"""Draft-and-verify decoding: `hybrid`, `hybrid_fast` and `prompt_lookup`, batched.

One loop serves all three; they differ in where drafts come from and which are taken on trust:

- `hybrid`: the NAR branch drafts the next k tokens after every step; the next step feeds
  them through the AR branch (blockwise parallel decoding) and keeps the longest prefix the
  AR branch agrees with, plus the AR branch's own next token. The confidence head sets each
  row's draft length. Greedy output equals `ar` greedy; with sampling, speculative sampling's
  acceptance rule keeps the output distribution equal to `ar` sampling's.
- `hybrid_fast`: drafts whose confidence is >= `nar_threshold` (a leading run) are committed
  at once, unverified (lossy); the rest are verified as in `hybrid`. A threshold of 1.0
  commits nothing unverified and is `hybrid`.
- `prompt_lookup`: drafts copied from the input or the output so far after the latest
  n-gram match (prompt lookup decoding, no training); verified as in `hybrid`.

Rows keep their own lengths: row b has `committed[b]` tokens, of which the cache holds the
first `cached[b]`. Each step feeds, per row, the committed tokens not yet cached and then
the drafts to verify, at the row's own positions (`Yue2ForConditionalGeneration.decode_block`).
Rows that finish are dropped from the batch once a quarter of it has finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from yue2_jobs.model.generation import SamplingParams, first_true, forced_tokens, leading_run, processed_probs
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration
from yue2_jobs.model.stats import StatsRecorder

LOOKUP_NGRAM = 3  # longest n-gram prompt lookup matches (it falls back to shorter ones)


class HostDrafter(Protocol):
    """Drafts computed on the host, row by row: the interface prompt lookup implements."""

    def draft(self, row: int, output: list[int]) -> list[int]:
        """Up to k draft tokens to follow `output` (the tokens generated so far) in batch row `row`."""
        ...


@dataclass(frozen=True)
class DraftPolicy:
    """How drafts are made and trusted.

    `host_drafter`: None drafts with the NAR branch; otherwise drafts come from it (prompt
    lookup, or any other `HostDrafter`). `trust_threshold`: NAR drafts with confidence at
    least this are committed unverified (None: every draft is verified). `min_accept_prob`:
    a NAR draft is verified only while the product of the confidences up to it is at least this.
    """

    host_drafter: HostDrafter | None = None
    trust_threshold: float | None = None
    min_accept_prob: float = 0.0


class PromptLookupDrafter:
    """Prompt lookup decoding's drafts: after the latest earlier occurrence of the output's last
    n tokens (n = LOOKUP_NGRAM down to 1) in the input followed by the output, copy what came next."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, pad_token_id: int,
                 k: int) -> None:
        mask = input_ids.ne(pad_token_id) if attention_mask is None else attention_mask.bool()
        self.sources = [row[m].tolist() for row, m in zip(input_ids, mask, strict=True)]
        self.k = k

    def draft(self, row: int, output: list[int]) -> list[int]:
        hay = self.sources[row] + output
        for n in range(min(LOOKUP_NGRAM, len(output)), 0, -1):
            pattern = hay[-n:]
            for i in range(len(hay) - n - 1, -1, -1):
                if hay[i : i + n] == pattern:
                    return hay[i + n : i + n + self.k]
        return []


@torch.inference_mode()
def speculative_generate(model: Yue2ForConditionalGeneration, *, enc: Yue2EncoderState, input_ids: torch.Tensor,
                         attention_mask: torch.Tensor | None, max_new_tokens: int, params: SamplingParams,
                         generator: torch.Generator | None,
                         policy: DraftPolicy, stats: StatsRecorder) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode every row; returns the tokens (B, >= 1 + max_new_tokens) and each row's length (B,).

    Per-row state is kept for the working set only (A rows, with the caches and encoder state
    beside it): finished rows are flushed to the output when the set is compacted.
    """
    cfg, gen = model.config, model.generation_config
    k, eos, pad = cfg.nar_block_size, cfg.eos_token_id, cfg.pad_token_id
    dev = input_ids.device
    b = input_ids.shape[0]
    total = 1 + max_new_tokens
    out = input_ids.new_full((b, total + 2 * k + 2), pad)  # (B, T_buf): room for writes past the end
    out_len = torch.ones(b, dtype=torch.long, device=dev)
    ids = torch.arange(b, device=dev)  # (A,): batch row of each working row
    buf = out.clone()  # (A, T_buf)
    buf[:, 0] = cfg.decoder_start_token_id
    committed = torch.ones(b, dtype=torch.long, device=dev)  # (A,) tokens decided, start token included
    cached = torch.zeros(b, dtype=torch.long, device=dev)  # (A,) of which the caches hold K/V
    finished = torch.zeros(b, dtype=torch.bool, device=dev)
    drafts = input_ids.new_full((b, k), pad)  # (A, K): drafts awaiting verification, left-aligned
    n_drafts = torch.zeros(b, dtype=torch.long, device=dev)  # how many of them to verify
    draft_q: torch.Tensor | None = None  # (A, K, V) their sampling distributions, when sampling
    caches = model.new_caches(batch_size=b, max_len=total + k + 1)
    layout = model.step_layout()
    lookup = policy.host_drafter
    ar = torch.arange(k + 1, device=dev)

    while True:
        # ---- feed uncached committed tokens, then drafts; verify --------------------------
        n_in = (committed - cached).clamp(min=1)  # (A,); a finished row may have none left
        # Host sync 1 of 2: the block's width, how many slots to project, how far the caches reach.
        width, j, reach = torch.stack([(n_in + n_drafts).max(), n_drafts.max() + 1, cached.max()]).tolist()
        slot = ar[:width] if width <= k + 1 else torch.arange(width, device=dev)  # (W,)
        positions = cached[:, None] + slot  # (A, W)
        d_idx = slot - n_in[:, None]  # (A, W): which draft a slot holds
        is_draft = (d_idx >= 0) & (d_idx < n_drafts[:, None])
        tokens = torch.where(is_draft, drafts.gather(1, d_idx.clamp(0, k - 1)), buf.gather(1, positions))
        hidden = model.decode_block(tokens, enc, caches=caches, positions=positions, layout=layout,
                                    span=reach + width)  # (A, W, C)
        # Only the last committed slot and the draft slots predict tokens we need: project
        # J = 1 + (most drafts in a row) slots to the vocabulary, not all W.
        pred_slot = ((n_in - 1)[:, None] + ar[:j]).clamp(max=width - 1)  # (A, J): predicts draft i, then the bonus
        h = hidden.gather(1, pred_slot[:, :, None].expand(-1, -1, hidden.shape[-1]))  # (A, J, C)
        logits = layout.lm_logits(h.reshape(-1, h.shape[-1])).view(h.shape[0], j, -1)  # (A, J, V)
        forced = forced_tokens(committed[:, None] + ar[:j], total, gen)  # (A, J), -1 where free
        act_drafts = drafts[:, : j - 1]  # (A, J-1)
        in_range = ar[: j - 1] < n_drafts[:, None]  # (A, J-1)
        if params.do_sample:
            p = processed_probs(logits, params)  # (A, J, V)
            p = torch.where((forced >= 0)[:, :, None], torch.zeros_like(p).scatter_(
                2, forced.clamp(min=0)[:, :, None], 1.0), p)
            n_acc = torch.zeros_like(n_drafts)
            residual = p[:, 0]
            if j > 1:
                if lookup is not None:  # a copied draft is certain: q is one-hot on it
                    q = torch.zeros_like(p[:, : j - 1]).scatter_(2, act_drafts[:, :, None], 1.0)
                else:
                    q = draft_q[:, : j - 1]  # (A, J-1, V)
                p_d = p[:, : j - 1].gather(2, act_drafts[:, :, None]).squeeze(2)  # (A, J-1)
                q_d = q.gather(2, act_drafts[:, :, None]).squeeze(2).clamp(min=1e-20)
                u = torch.rand(p_d.shape, generator=generator, device=dev)
                n_acc = leading_run((u * q_d < p_d) & in_range)  # accept with probability min(1, p/q)
                p_n = p.gather(1, n_acc[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)  # (A, V)
                q_n = q.gather(1, n_acc.clamp(max=j - 2)[:, None, None].expand(-1, 1, q.shape[-1])).squeeze(1)
                # Rejected at n: draw from the residual max(0, p - q); all accepted: from p.
                residual = torch.where((n_acc < n_drafts)[:, None], (p_n - q_n).clamp(min=0), p_n)
                residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
            bonus = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # (A,)
        else:
            pred = torch.where(forced >= 0, forced, logits.argmax(-1))  # (A, J)
            n_acc = leading_run((act_drafts == pred[:, : j - 1]) & in_range)
            bonus = pred.gather(1, n_acc[:, None]).squeeze(1)
        new = torch.where(ar[: j - 1] < n_acc[:, None], act_drafts, pad)  # (A, J-1)
        new = torch.cat([new, new.new_zeros(new.shape[0], 1)], 1).scatter_(1, n_acc[:, None], bonus[:, None])
        count, done = _cut(new, n_acc + 1, eos=eos, room=total - committed)
        stepped = ~finished  # rows this step decoded for
        count = count * stepped
        from_nar = torch.minimum(n_acc, count)
        buf.scatter_(1, committed[:, None] + ar[:j], new)
        cached = torch.where(stepped, cached + n_in + from_nar, cached)
        committed = committed + count
        finished = finished | (done & stepped)

        # ---- next drafts -------------------------------------------------------------------
        n_trust = torch.zeros_like(n_drafts)
        n_drafts = torch.zeros_like(n_drafts)
        n_live = int((~finished).sum())  # host sync 2 of 2 (hybrid_fast's trusted commits add a third)
        if lookup is not None:
            n_drafts = _lookup_drafts(lookup, ids, finished, buf, committed, drafts, total)
        elif n_live:
            src = n_in - 1 + from_nar  # (A,): slot whose prediction was the bonus
            h_src = hidden.gather(1, src[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]  # (A, C)
            d_logits, conf = model.draft_step(h_src, bonus, enc, layout=layout)  # (A, K, V), (A, K)
            conf = conf.sigmoid()
            if params.do_sample:
                q = processed_probs(d_logits, params)  # (A, K, V)
                new_drafts = torch.multinomial(q.flatten(0, 1), 1, generator=generator).view(-1, k)
            else:
                q, new_drafts = None, d_logits.argmax(-1)
            live = ~finished
            room = total - committed
            if policy.trust_threshold is not None:
                n_trust, trust_done = _cut(new_drafts, leading_run(conf >= policy.trust_threshold), eos=eos, room=room)
                n_trust = n_trust * live
                buf.scatter_(1, committed[:, None] + ar[:k], new_drafts)
                committed = committed + n_trust
                finished = finished | (trust_done & (n_trust > 0))
                n_live = int((~finished).sum())
                room = room - n_trust
            # The rest, shifted left, are verified next step while their joint confidence lasts.
            shift = (ar[:k] + n_trust[:, None]).clamp(max=k - 1)  # (A, K)
            drafts = new_drafts.gather(1, shift)
            rest_conf = torch.where(ar[:k] + n_trust[:, None] < k, conf.gather(1, shift), 0.0)
            n_verify = torch.minimum(leading_run(rest_conf.cumprod(1) >= policy.min_accept_prob), room)
            n_drafts = n_verify * ~finished
            if q is not None:
                draft_q = q.gather(1, shift[:, :, None].expand(-1, -1, q.shape[-1]))
        # Trusted drafts count with the step whose hidden state drafted them.
        stats.record_step(ids[stepped], nar=(from_nar + n_trust)[stepped], ar=(count - from_nar)[stepped])

        # ---- drop finished rows from the working set -----------------------------------------
        if n_live == 0 or n_live * 4 <= 3 * len(ids):
            done_rows = finished.nonzero().squeeze(1)
            out[ids[done_rows]] = buf[done_rows]
            out_len[ids[done_rows]] = committed[done_rows]
            if n_live == 0:
                return out, out_len
            keep = (~finished).nonzero().squeeze(1)
            ids, buf, committed, cached, finished = ids[keep], buf[keep], committed[keep], cached[keep], finished[keep]
            drafts, n_drafts = drafts[keep], n_drafts[keep]
            draft_q = None if draft_q is None else draft_q[keep]
            enc = enc.select(keep)
            for cache in caches:
                cache.select(keep)


def _cut(new: torch.Tensor, count: torch.Tensor, *, eos: int, room: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """How many of `new` (A, N) to commit, wanting `count`: none past the first EOS or the
    length limit (`room` tokens left). Also says which rows that finishes."""
    first_eos = first_true(new == eos)  # (A,)
    n = torch.minimum(torch.minimum(count, first_eos + 1), room)
    return n, (first_eos < n) | (n >= room)


def _lookup_drafts(lookup: HostDrafter, ids: torch.Tensor, finished: torch.Tensor, buf: torch.Tensor,
                   committed: torch.Tensor, drafts: torch.Tensor, total: int) -> torch.Tensor:
    """Fill `drafts` (A, K) from a host drafter; returns how many each row got (A,)."""
    n_drafts = torch.zeros_like(committed)
    k = drafts.shape[1]
    for i, (row, n, done) in enumerate(zip(ids.tolist(), committed.tolist(), finished.tolist(), strict=True)):
        if done:
            continue
        found = lookup.draft(row, buf[i, 1:n].tolist())[: min(k, total - n)]
        if found:
            drafts[i, : len(found)] = torch.tensor(found, dtype=drafts.dtype)
            n_drafts[i] = len(found)
    return n_drafts
