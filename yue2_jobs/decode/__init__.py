"""Serving YuE2: a `DecodeSession` owns a loaded model and everything a decode needs besides
(device, dtype, step layout, CUDA graphs or the compiled CPU step, the `auto` chooser,
continuous-batching engines).

    params.py       DecodingParams, the modes and every decoding default (no torch)
    session.py      DecodeSession: generate, summarize, engine, capture_graphs, compile_steps
    generate.py     one batch to the end (prefill, then loop.py's decode loop, or nar.py)
    continuous.py   the continuous-batching engine (working_set.py holds its rows)
    engine.py       the one engine step every mode but `nar` runs; rows.py its per-row state
    steps.py        how a step runs: layout.py's weight layout, graphs.py's CUDA graphs,
                    compiled.py's CPU step compiled ahead of time
    sampling.py     how a token is chosen; auto_mode.py how `auto` picks; stats.py what it cost

Importing this package is light: `yue2_jobs.decode.params` needs no torch, so the API and the CLI
parse parameters without loading the model; the names below load their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "DecodeSession": "session",
    "DecodingParams": "params", "MODES": "params", "Mode": "params",
    "DecodeRequest": "requests", "DecodeResult": "requests",
    "ContinuousBatcher": "continuous",
    "Yue2GenerateOutput": "generate",
    "SequenceStats": "stats",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
