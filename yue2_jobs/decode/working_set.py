"""The continuous engine's working set: per-row decoder state, self-attention caches,
cross-attention K/V and encoder mask of every slot, and which request holds each slot.

`ContinuousBatcher` decides what goes in and out (admission, preemption, collection); this type
only stores the rows and keeps their tensors aligned as rows are added, compacted and cleared.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
import torch.nn.functional as F

from yue2_jobs.decode.params import Mode
from yue2_jobs.decode.requests import DecodeRequest
from yue2_jobs.decode.rows import Rows
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration, Yue2KVCache

K = TypeVar("K", bound=Hashable)
KV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Slot(Generic[K]):
    """A live row: its request, the mode it decodes in (`ar` or `hybrid`: what `auto` resolved
    to at admission) and its admission order (preemption takes the newest)."""

    request: DecodeRequest[K]
    mode: Mode
    seq: int


class WorkingSet(Generic[K]):
    """Every per-row tensor of the engine, one row per slot; a slot is live or idle (None)."""

    def __init__(self, model: Yue2ForConditionalGeneration, *, t_buf: int, t_cache: int) -> None:
        self.model, self.t_buf, self.t_cache = model, t_buf, t_cache
        self.k = model.config.nar_block_size
        self.device = model.shared.weight.device
        self.slots: list[Slot[K] | None] = []
        self.reach = 0  # a bound on every row's cached length, read with the finished flags
        self.max_drafts = 0  # a bound on every row's n_drafts, read with them (a new row holds none)
        self.st = Rows.empty(0, k=self.k, t_buf=t_buf, device=self.device)
        self.caches: list[Yue2KVCache] = []
        self.kv: list[KV] = []
        self.enc_mask = torch.empty(0)
        self.clear()

    @property
    def live(self) -> int:
        return sum(s is not None for s in self.slots)

    def live_slots(self) -> list[Slot[K]]:
        return [s for s in self.slots if s is not None]

    def clear(self) -> None:
        """No rows at all."""
        cfg, dev = self.model.config, self.device
        dtype = self.model.shared.weight.dtype
        h = cfg.decoder_attention_heads
        d = cfg.d_model // h
        self.slots = []
        self.reach = self.max_drafts = 0
        self.st = Rows.empty(0, k=self.k, t_buf=self.t_buf, device=dev)
        self.caches = self.model.new_caches(batch_size=0, max_len=self.t_cache)
        n_kv = cfg.decoder_layers + cfg.nar_layers
        self.kv = [(torch.empty(0, h, 0, d, dtype=dtype, device=dev), torch.empty(0, h, 0, d, dtype=dtype, device=dev))
                   for _ in range(n_kv)]
        self.enc_mask = torch.empty(0, 1, 1, 0, dtype=dtype, device=dev)  # (A, 1, 1, S) additive

    def grow(self, n: int) -> None:
        """Append n idle rows to every per-row tensor."""
        def more(x: torch.Tensor, fill: float | int | bool = 0) -> torch.Tensor:
            return torch.cat([x, x.new_full((n, *x.shape[1:]), fill)])

        self.st = self.st.grow(n)
        for cache in self.caches:
            cache.k, cache.v = more(cache.k), more(cache.v)
        self.kv = [(more(k), more(v)) for k, v in self.kv]
        self.enc_mask = more(self.enc_mask, float("-inf"))
        self.slots += [None] * n

    def write_sources(self, idx: torch.Tensor, mask: torch.Tensor, kvs: list[KV]) -> None:
        """Write newcomers' encoder side into rows `idx` (N,): additive mask (N, 1, 1, S) and
        every layer's cross-attention K/V (N, H, S, D), widening the set's source length or
        padding theirs (masked) so both match."""
        s_new, s_cur = mask.shape[-1], self.enc_mask.shape[-1]
        if s_new > s_cur:
            extra = s_new - s_cur
            self.kv = [(F.pad(k, (0, 0, 0, extra)), F.pad(v, (0, 0, 0, extra))) for k, v in self.kv]
            self.enc_mask = F.pad(self.enc_mask, (0, extra), value=float("-inf"))
        elif s_new < s_cur:
            extra = s_cur - s_new
            mask = F.pad(mask, (0, extra), value=float("-inf"))
            kvs = [(F.pad(k, (0, 0, 0, extra)), F.pad(v, (0, 0, 0, extra))) for k, v in kvs]
        self.enc_mask[idx] = mask
        for (k_all, v_all), (k, v) in zip(self.kv, kvs, strict=True):
            k_all[idx], v_all[idx] = k, v

    def keep(self, keep: list[int]) -> None:
        """Compact the working set to the rows `keep`, in that order."""
        if not keep:
            self.clear()
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.st = self.st.select(idx)
        for cache in self.caches:
            cache.select(idx)
        self.kv = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.kv]
        self.enc_mask = self.enc_mask.index_select(0, idx)
        self.slots = [self.slots[i] for i in keep]

    def encoder_state(self) -> Yue2EncoderState:
        """The rows' encoder side as the engine step reads it (the step never reads `hidden`)."""
        n_ar = self.model.config.decoder_layers
        return Yue2EncoderState(hidden=self.enc_mask, mask=self.enc_mask, cross_kv=self.kv[:n_ar],
                                nar_cross_kv=self.kv[n_ar:])
