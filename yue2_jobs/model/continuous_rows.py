"""The continuous-batching engine's requests and results, and its working set: the per-row
tensors (decoder state, caches, cross-attention K/V, encoder mask) that rows are admitted into,
compacted, shed under memory pressure and cleared. `ContinuousBatcher` (`continuous.py`) builds
on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from yue2_jobs.model.engine import Rows
from yue2_jobs.model.generation import DEFAULT_MIN_ACCEPT_PROB
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration
from yue2_jobs.model.stats import SequenceStats

if TYPE_CHECKING:
    from collections import deque

RECOVER_EVERY = 64  # clean steps before an out-of-memory row cap is raised by one again


@dataclass
class DecodeRequest:
    """One sequence to decode. `input_ids`: the encoder input, no padding. `min_new_tokens`:
    EOS is not chosen before this many tokens (the last allowed token is always EOS)."""

    id: Any
    input_ids: list[int]
    max_new_tokens: int
    mode: str = "hybrid"
    min_new_tokens: int = 0
    min_accept_prob: float = DEFAULT_MIN_ACCEPT_PROB
    ran: str | None = None  # the mode it was decoded in: `mode`, or what `auto` resolved to at admission


@dataclass
class DecodeResult:
    """`tokens`: generated ids (EOS included, start token not). `error` set: the request failed;
    `isolate`: it failed with its whole step, so the culprit is unknown (rerun it alone)."""

    request: DecodeRequest
    tokens: list[int] = field(default_factory=list)
    stats: SequenceStats | None = None
    error: BaseException | None = None
    isolate: bool = False


@dataclass
class EngineCounters:
    """Cumulative counters for metrics: steps, row-slots used per step, tokens, drafts."""

    steps: int = 0
    live_rows: int = 0  # summed over steps: live_rows / steps is the mean occupancy
    slot_rows: int = 0  # rows computed (live + idle slots), summed over steps
    tokens: int = 0
    nar_tokens: int = 0
    drafted: int = 0
    preempted: int = 0
    oom_events: int = 0
    occupancy: list[int] = field(default_factory=list)  # live rows of each step since the last drain


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class WorkingSet:
    """The rows' storage; `ContinuousBatcher` sets these attributes in its constructor."""

    model: Yue2ForConditionalGeneration
    device: torch.device
    k: int
    t_buf: int
    t_cache: int
    counters: EngineCounters
    waiting: deque[DecodeRequest]
    rows: list[DecodeRequest | None]
    row_cap: int
    clean_steps: int

    @property
    def live(self) -> int:
        return sum(r is not None for r in self.rows)

    def _clear(self) -> None:
        cfg, dev = self.model.config, self.device
        dtype = self.model.shared.weight.dtype
        h = cfg.decoder_attention_heads
        d = cfg.d_model // h
        self.rows = []
        self.seq: list[int] = []  # admission order of each slot's request (preemption takes the newest)
        self.reach = 0  # a bound on every row's cached length, read with the finished flags
        self.st = Rows.empty(0, k=self.k, t_buf=self.t_buf, device=dev)
        self.caches = self.model.new_caches(batch_size=0, max_len=self.t_cache)
        n_kv = cfg.decoder_layers + cfg.nar_layers
        self.kv = [(torch.empty(0, h, 0, d, dtype=dtype, device=dev), torch.empty(0, h, 0, d, dtype=dtype, device=dev))
                   for _ in range(n_kv)]
        self.enc_mask = torch.empty(0, 1, 1, 0, dtype=dtype, device=dev)
        self.counters.occupancy = []

    def _grow(self, n: int) -> None:
        """Append n idle rows to every per-row tensor."""
        def more(x: torch.Tensor, fill: float | int | bool = 0) -> torch.Tensor:
            return torch.cat([x, x.new_full((n, *x.shape[1:]), fill)])

        self.st = self.st.grow(n)
        for cache in self.caches:
            cache.k, cache.v = more(cache.k), more(cache.v)
        self.kv = [(more(k), more(v)) for k, v in self.kv]
        self.enc_mask = more(self.enc_mask, float("-inf"))
        self.rows += [None] * n
        self.seq += [0] * n

    def _pad_source(self, s: int) -> None:
        """Widen the encoder-side tensors to s source positions (masked)."""
        extra = s - self.enc_mask.shape[-1]
        pad = torch.nn.functional.pad
        self.kv = [(pad(k, (0, 0, 0, extra)), pad(v, (0, 0, 0, extra))) for k, v in self.kv]
        self.enc_mask = pad(self.enc_mask, (0, extra), value=float("-inf"))

    def _keep(self, keep: list[int]) -> None:
        """Compact the working set to the rows `keep`, in that order."""
        if not keep:
            self._clear()
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.st = self.st.select(idx)
        for cache in self.caches:
            cache.select(idx)
        self.kv = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.kv]
        self.enc_mask = self.enc_mask.index_select(0, idx)
        self.rows = [self.rows[i] for i in keep]
        self.seq = [self.seq[i] for i in keep]

    def _encoder_state(self) -> Yue2EncoderState:
        n_ar = self.model.config.decoder_layers
        return Yue2EncoderState(hidden=self.enc_mask, mask=self.enc_mask, cross_kv=self.kv[:n_ar],
                                nar_cross_kv=self.kv[n_ar:])


    def _shed(self, exc: BaseException) -> list[DecodeResult]:
        """Out of memory on a step: requeue the newest half of the live rows (their progress is
        recomputed later) and cap the row count; a lone row fails alone."""
        self.counters.oom_events += 1
        live = [i for i, r in enumerate(self.rows) if r is not None]
        if len(live) == 1:
            req = self.rows[live[0]]
            assert req is not None
            self._clear()
            return [DecodeResult(request=req, error=exc)]
        live.sort(key=lambda i: self.seq[i])
        keep, back = live[: len(live) // 2], live[len(live) // 2:]
        self.waiting.extendleft(reversed([self.rows[i] for i in back]))  # type: ignore[misc]
        self.counters.preempted += len(back)
        self.row_cap = len(keep)
        self.clean_steps = 0
        self._keep(sorted(keep))
        return []

    def _evict_all(self, exc: BaseException) -> list[DecodeResult]:
        out = [DecodeResult(request=r, error=exc, isolate=True) for r in self.rows if r is not None]
        self._clear()
        return out
