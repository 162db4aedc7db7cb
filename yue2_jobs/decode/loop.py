"""`generate`'s decode loop: the engine step (`engine.py`) run to the end over one batch.

How drafts are made and trusted is a `DraftPolicy`: the NAR branch (`hybrid`), the NAR branch
with confident drafts taken on trust (`hybrid_fast`), a host drafter such as prompt lookup
(`prompt_lookup`), or none (`ar`). The host looks at the batch every `sync_every` steps (one small
read: how many rows are live, how far their caches reach and the most drafts a row holds, which
sizes the next step when it is narrowed); rows that finished are then flushed to the output, and
dropped from the working set once a quarter of it has finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from yue2_jobs.decode.engine import NEVER_TRUST, DraftSource, StepShape
from yue2_jobs.decode.rows import Rows
from yue2_jobs.decode.sampling import SamplingParams
from yue2_jobs.decode.stats import StatsRecorder
from yue2_jobs.decode.steps import Steps
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState

LOOKUP_NGRAM = 3  # longest n-gram prompt lookup matches (it falls back to shorter ones)
# Steps between host reads of the finished flags, by device type. On the CPU a read costs nothing
# (no queue to drain) while every step past a batch's end costs a full step, so 1 is fastest (the
# docs/decoding.md's "The decode engine" has the `benchmarks/decode.py --sync-every` figures). On a GPU each
# read waits for the queued steps; 4 wastes at most 3 steps per batch.
SYNC_EVERY = {"cpu": 1, "cuda": 4}


def default_sync_every(device: torch.device) -> int:
    return SYNC_EVERY.get(device.type, 1)


class HostDrafter(Protocol):
    """Drafts computed on the host, row by row: the interface prompt lookup implements."""

    def draft(self, row: int, output: list[int]) -> list[int]:
        """Up to k draft tokens to follow `output` (the tokens generated so far) in batch row `row`."""
        ...


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


@dataclass(frozen=True)
class DraftPolicy:
    """How drafts are made and trusted.

    `source`: "nar" drafts with the NAR branch, "host" with `host_drafter`, "none" never drafts
    (`ar`). `trust_threshold`: NAR drafts with confidence at least this are committed unverified
    (None: every draft is verified). `min_accept_prob`: a NAR draft is verified only while the
    product of the confidences up to it is at least this.
    """

    source: DraftSource = "nar"
    host_drafter: HostDrafter | None = None
    trust_threshold: float | None = None
    min_accept_prob: float = 0.0


@torch.inference_mode()
def decode_batch(steps: Steps, *, enc: Yue2EncoderState, batch_size: int,
                 max_new_tokens: int, params: SamplingParams, generator: torch.Generator | None,
                 policy: DraftPolicy, stats: StatsRecorder,
                 sync_every: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode every row; returns the tokens (B, >= 1 + max_new_tokens) and each row's length (B,).
    `sync_every` None: the device's default."""
    model = steps.model
    cfg = model.config
    k, pad, dev = cfg.nar_block_size, cfg.pad_token_id, enc.hidden.device
    b, total = batch_size, 1 + max_new_tokens
    t_buf, cache_len = total + 2 * k + 2, total + k + 1
    rows = Rows.empty(b, k=k, t_buf=t_buf, device=dev)
    everyone = torch.arange(b, device=dev)
    rows.start(everyone, start_token=cfg.decoder_start_token_id, pad=pad, total=total, min_total=0,
               draft_on=policy.source == "nar", accept_p=policy.min_accept_prob,
               trust_p=NEVER_TRUST if policy.trust_threshold is None else policy.trust_threshold)
    shape = StepShape.of(k=k, drafts=policy.source, params=params, trust=policy.trust_threshold is not None)
    caches = model.new_caches(batch_size=b, max_len=cache_len)
    layout = steps.layout()
    out = torch.full((b, t_buf), pad, dtype=torch.long, device=dev)
    out_len = torch.ones(b, dtype=torch.long, device=dev)
    ids = everyone  # (A,): batch row of each working row
    draft_q: list[torch.Tensor | None] = [None]
    reach = 0  # the host's bound on every row's cached length: attention reads reach + width positions
    every = 1 if policy.host_drafter is not None else (sync_every or default_sync_every(dev))
    # Read every step, no graph to replay, and rows that cost: feed only the slots drafts fill.
    narrow = every == 1 and steps.captured(shape) is None and layout.narrow_pays
    most = 0  # no row holds drafts yet
    while True:
        # A compiled step has a fixed width too, where it runs (sets of up to its row limit).
        step_shape = shape.narrowed(most) if narrow and not steps.covers(shape, rows=len(ids)) else shape
        for _ in range(every):
            steps.run(rows, enc, caches, layout=layout, shape=step_shape,
                      span=min(cache_len, reach + step_shape.width), generator=generator, draft_q=draft_q)
            reach += step_shape.width
        if policy.host_drafter is not None:
            _lookup_drafts(policy.host_drafter, ids, rows, total)
        n_live, reach, most = torch.stack([(~rows.finished).sum(), rows.cached.max(), rows.n_drafts.max()]).tolist()
        if n_live and n_live * 4 > 3 * len(ids):
            continue
        done = rows.finished.nonzero().squeeze(1)
        out[ids[done]] = rows.buf[done]
        out_len[ids[done]] = rows.committed[done]
        stats.record_rows(ids[done], steps=rows.steps[done], nar=rows.nar[done], ar=rows.ar[done],
                          drafted=rows.drafted[done], histogram=rows.histogram[done])
        if n_live == 0:
            return out, out_len
        keep = (~rows.finished).nonzero().squeeze(1)
        ids, rows, enc = ids[keep], rows.select(keep), enc.select(keep)
        for cache in caches:
            cache.select(keep)
        if draft_q[0] is not None:
            draft_q[0] = draft_q[0][keep]


def _lookup_drafts(lookup: HostDrafter, ids: torch.Tensor, rows: Rows, total: int) -> None:
    """Fill each live row's drafts from a host drafter (one host read of the rows)."""
    drafts, buf = rows.drafts, rows.buf
    n_drafts = torch.zeros_like(rows.n_drafts)
    k = drafts.shape[1]
    for i, (row, n, done) in enumerate(zip(ids.tolist(), rows.committed.tolist(), rows.finished.tolist(),
                                           strict=True)):
        if done:
            continue
        found = lookup.draft(row, buf[i, 1:n].tolist())[: min(k, total - n)]
        if found:
            drafts[i, : len(found)] = torch.tensor(found, dtype=drafts.dtype)
            n_drafts[i] = len(found)
    rows.n_drafts.copy_(n_drafts)
