"""What a runner takes and gives for one job. Kept apart from the model runner so that a worker
without a model (render jobs) or a test runner starts without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobInput:
    id: str
    kind: str
    text: str
    params: dict[str, Any]


@dataclass(frozen=True)
class JobOutput:
    text: str
    input_tokens: int
    output_tokens: int
    decoder_steps: int
    nar_tokens: int
    files: tuple[tuple[str, bytes, str], ...] = ()  # (suffix, bytes, content type), stored beside the JSON
    extra: dict[str, Any] | None = None  # merged into the job's output JSON
    mode: str | None = None  # the decoding mode that ran (what `auto` resolved to)
    input_tokens_used: int | None = None  # None: all of input_tokens
    input_truncated: bool = False
    chunks: int | None = None  # long_input=chunk: windows summarised
