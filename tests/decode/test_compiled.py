"""The compiled CPU step (`yue2_jobs/decode/compiled.py`): the same tokens and step counts as the
eager step on the golden outputs, packages cached per weights, the off switch, the log line where
it cannot be built, and packages dropped when the weights change under them."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch

from tests.decode.test_engine import GOLDEN, MODES, _run
from tests.tiny_models import ROOT, random_inputs, session_of
from yue2_jobs.decode import compiled
from yue2_jobs.decode.compiled import CompiledSteps
from yue2_jobs.decode.engine import StepShape
from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.sampling import SamplingParams
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.training.data import read_split


def _shapes(model, **params) -> list[StepShape]:
    """The greedy `ar` and `hybrid` shapes of requests decoded with `params`."""
    p = SamplingParams.of(DecodingParams(**params), model.generation_config)
    return [StepShape.of(k=model.config.nar_block_size, drafts=d, params=p) for d in ("none", "nar")]


class _Counting:
    """A loaded package that counts its calls (`compiled._call` runs `runner.loader.boxed_run`)."""

    def __init__(self, runner, count) -> None:
        self.loader, self._run, self._count = self, runner.loader.boxed_run, count

    def boxed_run(self, flat):
        self._count()
        return self._run(flat)


def _counted(built: CompiledSteps) -> dict[StepShape, int]:
    """Count the calls of each package (so a test knows the compiled step ran, not the eager one)."""
    calls = dict.fromkeys(built.steps, 0)
    for shape, runner in list(built.steps.items()):
        built.steps[shape] = _Counting(runner, lambda shape=shape: calls.__setitem__(shape, calls[shape] + 1))
    return calls


@pytest.mark.slow  # builds two C++ packages (about 30 s on 2 cores) and decodes the golden set twice
@pytest.mark.parametrize("mode", ["ar", "hybrid"])
def test_the_compiled_step_decodes_the_golden_outputs(tmp_path_factory, mode):
    """Token for token and step for step what the eager step (and the pre-engine loops) decoded,
    at batch 1, 3 and 16 with no row limit, so every step of every set runs compiled."""
    model, tok = load_checkpoint(ROOT / "checkpoints" / "base")
    model.set_draft_vocab(None)  # as test_engine compares: the goldens were drafted over the whole vocabulary
    texts = [r["text"] for r in read_split(ROOT / "data", "general", "eval")[:160]]
    texts += [r["text"] for r in read_split(ROOT / "data", "legal", "eval")[:48]]
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="pt")
    # The goldens' settings: no repetition controls (the old loops had none).
    built = CompiledSteps.build(model, shapes=_shapes(model, repetition_penalty=1.0, no_repeat_ngram_size=0),
                                directory=tmp_path_factory.getbasetemp() / "compiled-base", calibrate=False)
    calls = _counted(built)
    session_of(model).steps.compiled = built
    for batch_size in (1, 3, 16):
        got = _run(model, enc["input_ids"], enc["attention_mask"], batch_size, 48, **MODES[mode])
        assert got == GOLDEN[f"base/{mode}/b{batch_size}/n48"]
    assert sum(calls.values()) > 2000  # the compiled step ran every step


@pytest.mark.slow  # builds C++ packages for a tiny model
def test_packages_are_cached_per_weights_and_run_up_to_their_measured_rows(tiny_yue2, tmp_path):
    model = copy.deepcopy(tiny_yue2)  # its weights change below
    shapes = _shapes(model)
    first = CompiledSteps.build(model, shapes=shapes, directory=tmp_path)
    assert len(first.built) == 2 and first.build_s > 0
    assert set(first.max_rows) == set(shapes) and all(0 <= n <= 64 for n in first.max_rows.values())
    again = CompiledSteps.build(model, shapes=shapes, directory=tmp_path)
    assert again.built == [] and again.max_rows == first.max_rows  # loaded, limits read back
    # Compiled and eager decode the same tokens in the same steps, in both modes, rows ending apart.
    ids, mask = random_inputs(24, model.config.vocab_size, seed=3)
    session = DecodeSession(model)
    eager = {m: session.generate(ids, mask, mode=m, max_new_tokens=20) for m in ("ar", "hybrid")}
    session.steps.compiled = CompiledSteps.build(model, shapes=shapes, directory=tmp_path, calibrate=False)
    calls = _counted(session.steps.compiled)
    for m, out in eager.items():
        got = session.generate(ids, mask, mode=m, max_new_tokens=20)
        assert torch.equal(got.sequences, out.sequences)
        assert [s.decoder_steps for s in got.stats] == [s.decoder_steps for s in out.stats]
    assert all(n > 0 for n in calls.values())
    # A working set over a package's row limit steps eagerly.
    session.steps.compiled.max_rows = dict.fromkeys(shapes, 0)
    before = dict(calls)
    session.generate(ids, mask, mode="ar", max_new_tokens=20)
    assert calls == before
    # Other weights are other packages.
    with torch.no_grad():
        model.decoder_layers[0].ffn.fc1.weight.mul_(1.01)
    assert len(CompiledSteps.build(model, shapes=shapes[:1], directory=tmp_path, calibrate=False).built) == 1


def test_the_off_switch_and_a_missing_compiler_say_why_and_decode_eagerly(tiny_yue2, monkeypatch, caplog):
    session = DecodeSession(tiny_yue2)
    monkeypatch.setenv("YUE2_COMPILE", "0")
    with caplog.at_level(logging.WARNING, logger="yue2_jobs.decode.steps"):
        assert session.compile_steps() is None
    assert "compiled CPU step not available (YUE2_COMPILE=0)" in caplog.text
    monkeypatch.setenv("YUE2_COMPILE", "1")
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="yue2_jobs.decode.steps"):
        assert session.compile_steps() is None
    assert "no C++ compiler (no-such-compiler not found): install g++" in caplog.text
    assert session.steps.compiled is None
    ids, mask = random_inputs(2, tiny_yue2.config.vocab_size, seed=1)
    assert session.generate(ids, mask, mode="ar", max_new_tokens=4).sequences.shape[0] == 2


def test_a_failed_build_says_so_once_and_decodes_eagerly(tiny_yue2, monkeypatch, caplog):
    monkeypatch.setenv("YUE2_COMPILE", "1")
    session = DecodeSession(tiny_yue2)

    def broken(*args, **kwargs):
        raise RuntimeError("C++ compile failed\nsecond line")

    monkeypatch.setattr(CompiledSteps, "build", broken)
    with caplog.at_level(logging.WARNING, logger="yue2_jobs.decode.steps"):
        assert session.compile_steps() is None
    assert caplog.text.count("compiled CPU step not available") == 1
    assert "building it failed: RuntimeError: C++ compile failed" in caplog.text and "second line" not in caplog.text
    ids, mask = random_inputs(2, tiny_yue2.config.vocab_size, seed=1)
    assert session.generate(ids, mask, mode="hybrid", max_new_tokens=4).sequences.shape[0] == 2


def test_int8_and_other_dtypes_are_not_compiled(tiny_yue2, monkeypatch):
    monkeypatch.setenv("YUE2_COMPILE", "1")  # the tests' default is off (tests/conftest.py)
    assert "int8" in (compiled.unavailable_reason(tiny_yue2, weights="int8") or "")
    half = copy.deepcopy(tiny_yue2).to(torch.bfloat16)
    assert "bfloat16" in (compiled.unavailable_reason(half, weights="float") or "")


def test_a_weight_change_drops_the_packages(tiny_yue2, caplog):
    model = copy.deepcopy(tiny_yue2)
    session = DecodeSession(model)
    session.steps.layout()
    session.steps.compiled = CompiledSteps()  # stands for packages built on the weights as they were
    session.steps.layout()
    assert session.steps.compiled is not None  # unchanged weights keep them
    with torch.no_grad():
        model.final_logits_bias.add_(0.0)  # an in-place write: the weights are not the ones packed
    with caplog.at_level(logging.WARNING, logger="yue2_jobs.decode.steps"):
        session.steps.layout()
    assert session.steps.compiled is None and "compiled CPU step is dropped" in caplog.text


def test_the_cache_lives_where_the_setting_says(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("YUE2_COMPILE_CACHE", str(tmp_path / "c"))
    assert compiled.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("YUE2_COMPILE_CACHE")
    assert compiled.cache_dir() == Path.home() / ".cache" / "yue2" / "compiled"
