"""The per-row state of a decode working set: what the engine step (`engine.py`) reads and writes.

Every field is a tensor with one row per sequence on dim 0, so a working set is compacted, grown or
copied into a CUDA graph's static buffers field by field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

Setting = torch.Tensor | int | float | bool  # per row (N,), or one value for every row

@dataclass
class Rows:
    """Per-row decode state of a working set: every field holds A rows on dim 0."""

    buf: torch.Tensor  # (A, T_buf) long: start token, committed tokens, then scratch
    committed: torch.Tensor  # (A,) tokens decided, start token included
    cached: torch.Tensor  # (A,) of which the KV caches hold the first `cached`
    finished: torch.Tensor  # (A,) bool
    total: torch.Tensor  # (A,) 1 + max_new_tokens: the last position is always EOS
    min_total: torch.Tensor  # (A,) EOS is banned at positions below this
    draft_on: torch.Tensor  # (A,) bool: the NAR branch drafts for this row
    accept_p: torch.Tensor  # (A,) float: drafts are verified while their joint confidence is >= this
    trust_p: torch.Tensor  # (A,) float: drafts with confidence >= this are committed unverified
    drafts: torch.Tensor  # (A, K) long: drafts awaiting verification, left-aligned
    n_drafts: torch.Tensor  # (A,) how many of them to verify
    steps: torch.Tensor  # (A,) decoder steps that committed tokens for the row
    nar: torch.Tensor  # (A,) tokens from drafts
    ar: torch.Tensor  # (A,) tokens the AR branch chose
    drafted: torch.Tensor  # (A,) drafts verified
    histogram: torch.Tensor  # (A, 2K + 1): steps that committed n draft tokens

    @classmethod
    def empty(cls, n: int, *, k: int, t_buf: int, device: torch.device) -> Rows:
        """n idle rows (finished, nothing to decode)."""
        def longs(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.long, device=device)

        def floats() -> torch.Tensor:
            return torch.zeros(n, dtype=torch.float, device=device)

        return cls(buf=longs(n, t_buf), committed=longs(n), cached=longs(n),
                   finished=torch.ones(n, dtype=torch.bool, device=device), total=longs(n), min_total=longs(n),
                   draft_on=torch.zeros(n, dtype=torch.bool, device=device), accept_p=floats(), trust_p=floats(),
                   drafts=longs(n, k), n_drafts=longs(n), steps=longs(n), nar=longs(n), ar=longs(n),
                   drafted=longs(n), histogram=longs(n, 2 * k + 1))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def select(self, idx: torch.Tensor) -> Rows:
        """The rows `idx` (A',), in that order."""
        return Rows(**{name: x.index_select(0, idx) for name, x in self.tensors().items()})

    def grow(self, n: int) -> Rows:
        """These rows followed by n idle ones."""
        more = Rows.empty(n, k=self.drafts.shape[1], t_buf=self.buf.shape[1], device=self.buf.device)
        return Rows(**{name: torch.cat([x, getattr(more, name)]) for name, x in self.tensors().items()})

    def start(self, idx: torch.Tensor, *, start_token: int, pad: int, total: Setting, min_total: Setting,
              draft_on: Setting, accept_p: Setting, trust_p: Setting) -> None:
        """(Re)start the rows `idx` (N,) as new sequences; each setting is (N,) or one value for all."""
        self.buf[idx] = pad
        self.buf[idx, 0] = start_token
        for name, value in (("committed", 1), ("cached", 0), ("finished", False), ("n_drafts", 0), ("steps", 0),
                            ("nar", 0), ("ar", 0), ("drafted", 0), ("histogram", 0)):
            getattr(self, name)[idx] = value
        self.total[idx], self.min_total[idx], self.draft_on[idx] = total, min_total, draft_on
        self.accept_p[idx], self.trust_p[idx] = accept_p, trust_p
