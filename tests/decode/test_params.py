"""One `DecodingParams`, one set of defaults: the API (`Settings`), the CLI, the session's `generate`
and the engine's requests all start from `DecodingParams()`, and the type checks every value once."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tests.tiny_models import ROOT, session_of, varied_inputs
from yue2_jobs.cli.common import add_decoding, decoding
from yue2_jobs.core.config import Settings
from yue2_jobs.decode.params import DEFAULT_MAX_NEW_TOKENS, DEFAULT_MODE, MODES, DecodingParams
from yue2_jobs.decode.requests import DecodeRequest
from yue2_jobs.decode.sampling import SamplingParams


def test_every_entry_point_defaults_alike() -> None:
    default = DecodingParams()
    assert (default.mode, default.max_new_tokens) == (DEFAULT_MODE, DEFAULT_MAX_NEW_TOKENS) == ("auto", 48)
    s = Settings()
    assert (s.default_mode, s.default_max_new_tokens) == (default.mode, default.max_new_tokens)
    p = argparse.ArgumentParser()
    add_decoding(p)
    assert decoding(p.parse_args([])) == default
    assert DecodeRequest(key=0, input_ids=[0, 2]).params == default


def test_generate_without_params_decodes_the_defaults(tiny_yue2, tiny_config) -> None:
    ids, mask = varied_inputs(vocab=tiny_config.vocab_size, lengths=[6, 3])
    out = session_of(tiny_yue2).generate(ids, mask)
    assert out.mode in ("ar", "hybrid")  # `auto` resolved
    assert out.sequences.shape[1] <= 1 + DEFAULT_MAX_NEW_TOKENS


@pytest.mark.parametrize(("field", "value"), [("mode", "beam"), ("max_new_tokens", 0), ("temperature", 0.0),
                                              ("top_k", -1), ("top_p", 1.5), ("nar_threshold", 2.0),
                                              ("repetition_penalty", 0.0), ("no_repeat_ngram_size", -1)])
def test_each_bad_value_names_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        DecodingParams(**{field: value})
    p = argparse.ArgumentParser()
    add_decoding(p)
    if field in ("max_new_tokens", "repetition_penalty", "no_repeat_ngram_size"):
        with pytest.raises(SystemExit, match=field):
            decoding(p.parse_args([f"--{field.replace('_', '-')}", str(value)]))


def test_sampling_params_derive_from_the_request_and_the_checkpoint(tiny_yue2) -> None:
    gen = tiny_yue2.generation_config
    gen_penalty, gen_ngram = gen.repetition_penalty, gen.no_repeat_ngram_size
    try:
        gen.repetition_penalty, gen.no_repeat_ngram_size = 1.2, 3
        greedy = SamplingParams.greedy(gen)
        assert greedy == SamplingParams.of(DecodingParams(mode="ar", max_new_tokens=9, repetition_penalty=1.2,
                                                          no_repeat_ngram_size=3))  # mode and length do not matter
        assert (greedy.do_sample, greedy.repetition_penalty, greedy.no_repeat_ngram_size) == (False, 1.2, 3)
        own = SamplingParams.of(DecodingParams(do_sample=True, top_k=5, no_repeat_ngram_size=0), gen)
        assert (own.do_sample, own.top_k, own.repetition_penalty, own.no_repeat_ngram_size) == (True, 5, 1.2, 0)
        gen.repetition_penalty = 0.0  # a broken generation config is refused, naming the field
        with pytest.raises(ValueError, match="repetition_penalty"):
            SamplingParams.greedy(gen)
    finally:
        gen.repetition_penalty, gen.no_repeat_ngram_size = gen_penalty, gen_ngram


def test_the_parameters_module_needs_no_torch() -> None:
    code = "import sys, yue2_jobs.decode.params, yue2_jobs.jobs.params; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False" and set(MODES) >= {"auto", "ar", "hybrid"}
