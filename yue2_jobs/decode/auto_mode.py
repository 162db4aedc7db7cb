"""`auto`: the faster of the two lossless modes for each batch size, measured on the worker itself.

`ar` and `hybrid` give the same greedy tokens, so which one runs is purely a speed question, and the
answer depends on the checkpoint (how often its drafts are accepted), on the inputs (acceptance
follows the traffic), on the device and on the batch size. A worker therefore measures it on its own
work: the first batches of each batch-size bucket alternate between the two modes; after that every
batch runs the one with the lower seconds per token (an exponentially weighted mean), and one batch
in `reexplore_every` runs the other, so that a change in traffic is noticed. Exploring costs time,
never output. Each `DecodeSession` owns one chooser, shared by its `generate` and its engine: it
learns for its own checkpoint and device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

Lossless = Literal["ar", "hybrid"]
LOSSLESS: tuple[Lossless, ...] = ("ar", "hybrid")
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class _Estimate:
    seconds_per_token: float = 0.0
    batches: int = 0


class ModeChooser:
    """Picks `ar` or `hybrid` for a batch size; `observe` feeds it what a batch cost."""

    def __init__(self, *, warmup: int = 2, reexplore_every: int = 50, decay: float = 0.3) -> None:
        if warmup < 1 or reexplore_every < 2 or not 0.0 < decay <= 1.0:
            raise ValueError("warmup must be >= 1, reexplore_every >= 2 and decay in (0, 1]")
        self.warmup, self.reexplore_every, self.decay = warmup, reexplore_every, decay
        self._estimates: dict[tuple[int, str], _Estimate] = {}
        self._picks: dict[int, int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def bucket(batch_size: int) -> int:
        return next((b for b in BUCKETS if batch_size <= b), BUCKETS[-1])

    def choose(self, batch_size: int) -> Lossless:
        """The mode to run a batch of `batch_size` rows in."""
        b = self.bucket(batch_size)
        with self._lock:
            n = self._picks[b] = self._picks.get(b, 0) + 1
            seen = {m: self._estimates.get((b, m), _Estimate()) for m in LOSSLESS}
            learning = [m for m in LOSSLESS if seen[m].batches < self.warmup]
            if learning:
                return min(learning, key=lambda m: seen[m].batches)
            fast, slow = sorted(LOSSLESS, key=lambda m: seen[m].seconds_per_token)
            return slow if n % self.reexplore_every == 0 else fast

    def observe(self, mode: str, batch_size: int, *, tokens: int, seconds: float) -> None:
        """A batch of `batch_size` rows in `mode` committed `tokens` tokens in `seconds`."""
        if mode not in LOSSLESS or tokens <= 0 or seconds <= 0:
            return
        key = (self.bucket(batch_size), mode)
        with self._lock:
            est = self._estimates.setdefault(key, _Estimate())
            cost = seconds / tokens
            est.seconds_per_token = cost if est.batches == 0 else (
                (1 - self.decay) * est.seconds_per_token + self.decay * cost)
            est.batches += 1

    def table(self) -> dict[int, dict[str, float | str]]:
        """Per bucket: tokens/s of each measured mode and the current pick (logs, metrics)."""
        with self._lock:
            out: dict[int, dict[str, float | str]] = {}
            for (b, mode), est in sorted(self._estimates.items()):
                if est.seconds_per_token > 0:
                    out.setdefault(b, {})[f"{mode}_tok_s"] = round(1 / est.seconds_per_token, 1)
            for row in out.values():
                if all(f"{m}_tok_s" in row for m in LOSSLESS):
                    row["faster"] = max(LOSSLESS, key=lambda m: float(row[f"{m}_tok_s"]))
            return out
