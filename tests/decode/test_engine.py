"""The engine step against the pre-engine decoder: every step-wise mode, token for token.

`golden/decode_v1.json.gz` holds the outputs and step counts of the per-mode loops the engine
replaced (`_generate_ar` and `speculative_generate` at commit d66e891), recorded on 208 eval
texts with the shipped base checkpoint (batch sizes 1, 3 and 16; 48 new tokens, and 1) and on 200
random inputs with a random model whose rows end at different steps (20 new tokens). The base
entries were re-recorded with those loops for issue 16's checkpoint and again for issue 27's
drafter (`golden/record.py`); the old loops had no repetition controls, so they are off here, and
no draft vocabulary, so the base is compared without its own.
"""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from tests.tiny_models import ROOT, batches_of, generate, random_inputs
from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.training.data import read_split

GOLDEN = json.loads(gzip.open(ROOT / "tests" / "decode" / "golden" / "decode_v1.json.gz", "rt").read())
MODES = {"ar": {"mode": "ar"}, "hybrid": {"mode": "hybrid"},
         "hybrid_fast@0.6": {"mode": "hybrid_fast", "nar_threshold": 0.6},
         "hybrid_fast@0.9": {"mode": "hybrid_fast", "nar_threshold": 0.9}, "prompt_lookup": {"mode": "prompt_lookup"}}


def _run(model, ids, mask, batch_size: int, max_new: int, **kw) -> list:
    rows = []
    for b_ids, b_mask in batches_of(ids, mask, batch_size):
        # The old loops had no repetition controls; the shipped base turns them on by default.
        out = generate(model, input_ids=b_ids, attention_mask=b_mask, max_new_tokens=max_new,
                       return_dict_in_generate=True, repetition_penalty=1.0, no_repeat_ngram_size=0, **kw)
        for seq, st in zip(out.sequences.tolist(), out.stats, strict=True):
            rows.append([seq[1 : 1 + st.tokens], st.decoder_steps])
            assert all(t == model.config.pad_token_id for t in seq[1 + st.tokens :])  # nothing past EOS
    return rows


@pytest.fixture(scope="module")
def base_inputs():
    # A copy of its own: the old loops drafted over the whole vocabulary, so the engine is compared
    # with them on the same weights without the checkpoint's draft vocabulary.
    model, tok = load_checkpoint(ROOT / "checkpoints" / "base")
    model.set_draft_vocab(None)
    texts = [r["text"] for r in read_split(ROOT / "data", "general", "eval")[:160]]
    texts += [r["text"] for r in read_split(ROOT / "data", "legal", "eval")[:48]]
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="pt")
    return model, enc["input_ids"], enc["attention_mask"]


@pytest.mark.slow  # long model work (make test runs it; make test-fast leaves it out)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(("batch_size", "max_new"), [(1, 48), (3, 48), (16, 48), (16, 1)])
def test_engine_equals_the_old_loops_on_the_shipped_base(base_inputs, mode, batch_size, max_new):
    model, ids, mask = base_inputs
    got = _run(model, ids, mask, batch_size, max_new, **MODES[mode])
    assert got == GOLDEN[f"base/{mode}/b{batch_size}/n{max_new}"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_engine_equals_the_old_loops_on_a_random_model(tiny_yue2, tiny_config, mode, batch_size):
    ids, mask = random_inputs(200, tiny_config.vocab_size, seed=7)
    got = _run(tiny_yue2, ids, mask, batch_size, 20, **MODES[mode])
    assert got == GOLDEN[f"tiny/{mode}/b{batch_size}/n20"]


@pytest.mark.slow  # long model work (make test runs it; make test-fast leaves it out)
@pytest.mark.parametrize("sync_every", [1, 3, 64])
def test_sync_every_changes_nothing_but_when_the_host_looks(base_inputs, sync_every):
    model, ids, mask = base_inputs
    for mode in ("ar", "hybrid", "hybrid_fast@0.6"):
        got = _run(model, ids[:48], mask[:48], 16, 48, sync_every=sync_every, **MODES[mode])
        assert got == GOLDEN[f"base/{mode}/b16/n48"][:48]
    with pytest.raises(ValueError, match="sync_every"):
        generate(model, input_ids=ids[:1], sync_every=0)
    assert torch.is_inference_mode_enabled() is False
