"""What the continuous-batching engine takes and gives back: requests, results and counters."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from yue2_jobs.decode.params import DecodingParams, Mode
from yue2_jobs.decode.stats import SequenceStats

K = TypeVar("K", bound=Hashable)


@dataclass
class DecodeRequest(Generic[K]):
    """One sequence to decode. `key`: the caller's name for it (a job id), handed back with the
    result. `input_ids`: the encoder input, no padding. `params`: how to decode it, as parsed once
    where the request came in. `min_new_tokens`: EOS is not chosen before this many tokens (the
    last allowed token is always EOS)."""

    key: K
    input_ids: list[int]
    params: DecodingParams = field(default_factory=DecodingParams)
    min_new_tokens: int = 0


@dataclass
class DecodeResult(Generic[K]):
    """`tokens`: generated ids (EOS included, start token not). `mode`: what it was decoded in
    (its own mode, or what `auto` resolved to at admission). `error` set: the request failed;
    `isolate`: it failed with its whole step, so the culprit is unknown (rerun it alone)."""

    request: DecodeRequest[K]
    tokens: list[int] = field(default_factory=list)
    stats: SequenceStats | None = None
    mode: Mode | None = None
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
