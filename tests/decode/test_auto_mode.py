"""`auto`: the faster lossless mode per batch size, learned from what batches cost."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import generate, random_inputs, session_of
from yue2_jobs.decode.auto_mode import ModeChooser
from yue2_jobs.decode.continuous import ContinuousBatcher
from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.requests import DecodeRequest
from yue2_jobs.decode.session import DecodeSession


def test_explores_both_then_runs_the_faster_and_reexplores():
    chooser = ModeChooser(warmup=2, reexplore_every=10)
    cost = {"ar": 2.0, "hybrid": 1.0}  # hybrid twice as fast at batch 8
    picks = []
    for _ in range(40):
        mode = chooser.choose(8)
        picks.append(mode)
        chooser.observe(mode, 8, tokens=100, seconds=cost[mode])
    assert sorted(picks[:4]) == ["ar", "ar", "hybrid", "hybrid"]  # two batches of each first
    later = picks[4:]
    assert later.count("ar") == sum(1 for i in range(5, 41) if i % 10 == 0)  # only the re-explorations
    assert chooser.table()[8] == {"ar_tok_s": 50.0, "hybrid_tok_s": 100.0, "faster": "hybrid"}
    # Buckets learn apart: batch 1 knows nothing yet, so it explores.
    assert chooser.choose(1) in ("ar", "hybrid") and 1 not in chooser.table()


def test_a_change_in_cost_flips_the_choice():
    chooser = ModeChooser(warmup=1, reexplore_every=3, decay=0.5)
    cost = {"ar": 1.0, "hybrid": 2.0}
    for step in range(60):
        if step == 20:
            cost = {"ar": 2.0, "hybrid": 0.5}  # the traffic changed: drafts now hit
        mode = chooser.choose(4)
        chooser.observe(mode, 4, tokens=10, seconds=cost[mode])
    assert chooser.table()[4]["faster"] == "hybrid"


@pytest.mark.parametrize("bad", [{"warmup": 0}, {"reexplore_every": 1}, {"decay": 0.0}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        ModeChooser(**bad)


def test_generate_auto_gives_the_same_tokens_and_says_which_mode_ran(tiny_yue2, tiny_config):
    ids, mask = random_inputs(12, tiny_config.vocab_size, seed=3)
    ar = generate(tiny_yue2, input_ids=ids, attention_mask=mask, mode="ar", max_new_tokens=12)
    session = DecodeSession(tiny_yue2)  # a fresh chooser: the shared session's engines may have taught theirs
    ran = set()
    for _ in range(6):
        out = session.generate(ids, mask, mode="auto", max_new_tokens=12)
        assert torch.equal(out.sequences, ar)
        ran.add(out.mode)
    assert ran == {"ar", "hybrid"}  # both were measured
    assert set(session.chooser.table()[16]) >= {"ar_tok_s", "hybrid_tok_s"}


def test_a_session_shares_its_chooser_with_its_engines_and_keeps_none_on_the_model(tiny_yue2, tiny_config):
    ids, mask = random_inputs(4, tiny_config.vocab_size, seed=4)
    session = DecodeSession(tiny_yue2)
    before = set(vars(tiny_yue2))
    session.generate(ids, mask, mode="auto", max_new_tokens=6)
    engine = session.engine(max_rows=4)
    assert engine.chooser is session.chooser and engine.steps is session.steps
    engine.run([DecodeRequest(key=0, input_ids=ids[0][mask[0].bool()].tolist(),
                              params=DecodingParams(mode="auto", max_new_tokens=6))])
    assert set(vars(tiny_yue2)) == before  # nothing of the session's was stored on the module
    assert DecodeSession(tiny_yue2).chooser is not session.chooser


def test_the_engine_resolves_auto_at_admission_and_learns_from_its_steps(tiny_yue2, tiny_config):
    ids, mask = random_inputs(16, tiny_config.vocab_size, seed=5)
    inputs = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    chooser = ModeChooser(warmup=1)
    engine = ContinuousBatcher(session_of(tiny_yue2).steps, chooser, max_rows=4, policy="static")
    results = engine.run([DecodeRequest(key=i, input_ids=x, params=DecodingParams(mode="auto", max_new_tokens=10))
                          for i, x in enumerate(inputs)])
    ar = generate(tiny_yue2, input_ids=ids, attention_mask=mask, mode="ar", max_new_tokens=10)
    for res, row in zip(results, ar.tolist(), strict=True):
        assert res.error is None and res.mode in ("ar", "hybrid")
        assert res.tokens == [t for t in row[1:] if t != tiny_config.pad_token_id]
    assert {r.mode for r in results} == {"ar", "hybrid"}
    assert set(chooser.table()[4]) == {"ar_tok_s", "hybrid_tok_s", "faster"}
