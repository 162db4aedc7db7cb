"""Which requests the continuous-batching engine decodes: one rule (`DecodingParams.engine_refusal`,
`engine_ok` its yes/no). The engine's admission refuses exactly those, with that reason, and the
worker routes exactly the others to `generate`. No model: the checks run on their own."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from yue2_jobs.decode.continuous import ContinuousBatcher
from yue2_jobs.decode.params import MODES, DecodingParams, Mode
from yue2_jobs.decode.requests import DecodeRequest

ENGINE = {"auto": True, "ar": True, "hybrid": True, "hybrid_fast": False, "nar": False, "prompt_lookup": False}


def test_every_mode_has_an_answer() -> None:
    assert set(ENGINE) == set(MODES)


def _admission(params: DecodingParams) -> str | None:
    """The engine's own check of a request (a stand-in engine: only the model's positions are read)."""
    engine: Any = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=320)),
                                  limit=319)
    return ContinuousBatcher._check(engine, DecodeRequest(key=0, input_ids=[0, 5, 2], params=params))


@pytest.mark.parametrize("mode", MODES)
def test_greedy_with_the_checkpoints_controls_runs_on_the_engine_only_in_auto_ar_hybrid(mode: Mode) -> None:
    p = DecodingParams(mode=mode, max_new_tokens=8)
    assert p.engine_ok is ENGINE[mode] and (p.engine_refusal is None) is ENGINE[mode]
    assert _admission(p) == p.engine_refusal
    if not ENGINE[mode]:
        assert p.engine_refusal == (f"mode must be one of ('ar', 'hybrid', 'auto') for continuous batching, "
                                    f"got {mode!r}")


@pytest.mark.parametrize("mode", [m for m in MODES if ENGINE[m]])
@pytest.mark.parametrize("change", [{"do_sample": True}, {"repetition_penalty": 1.2}, {"no_repeat_ngram_size": 3},
                                    {"repetition_penalty": 1.0}])
def test_sampling_or_own_repetition_controls_go_to_generate(mode: Mode, change: dict[str, Any]) -> None:
    p = DecodingParams(mode=mode, max_new_tokens=8, **change)
    assert not p.engine_ok
    assert p.engine_refusal is not None and p.engine_refusal.startswith(
        "the continuous-batching engine decodes greedily with the checkpoint's repetition controls; got ")
    assert _admission(p) == p.engine_refusal
