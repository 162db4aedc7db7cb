"""`auto`: the faster lossless mode per batch size, learned from what batches cost."""

from __future__ import annotations

import pytest
import torch

from tests.model.conftest import random_inputs
from yue2_jobs.model.auto_mode import ModeChooser, chooser_for
from yue2_jobs.model.continuous import ContinuousBatcher, DecodeRequest
from yue2_jobs.model.generation import generate


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
    tiny_yue2._yue2_mode_chooser = ModeChooser()  # the shared model's engines may have taught its own one
    ran = set()
    for _ in range(6):
        out = generate(tiny_yue2, input_ids=ids, attention_mask=mask, mode="auto", max_new_tokens=12,
                       return_dict_in_generate=True)
        assert torch.equal(out.sequences, ar)
        ran.add(out.mode)
    assert ran == {"ar", "hybrid"}  # both were measured
    assert set(chooser_for(tiny_yue2).table()[16]) >= {"ar_tok_s", "hybrid_tok_s"}


def test_the_engine_resolves_auto_at_admission_and_learns_from_its_steps(tiny_yue2, tiny_config):
    ids, mask = random_inputs(16, tiny_config.vocab_size, seed=5)
    inputs = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    chooser = ModeChooser(warmup=1)
    engine = ContinuousBatcher(tiny_yue2, max_rows=4, chooser=chooser, policy="static")
    results = engine.run([DecodeRequest(id=i, input_ids=x, max_new_tokens=10, mode="auto")
                          for i, x in enumerate(inputs)])
    ar = generate(tiny_yue2, input_ids=ids, attention_mask=mask, mode="ar", max_new_tokens=10)
    for res, row in zip(results, ar.tolist(), strict=True):
        assert res.error is None and res.request.ran in ("ar", "hybrid")
        assert res.tokens == [t for t in row[1:] if t != tiny_config.pad_token_id]
    assert {r.request.ran for r in results} == {"ar", "hybrid"}
    assert set(chooser.table()[4]) == {"ar_tok_s", "hybrid_tok_s", "faster"}
