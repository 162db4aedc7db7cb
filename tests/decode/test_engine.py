"""The engine step against the pre-engine decoder: every step-wise mode, token for token; and a
CPU step narrowed to the slots its drafts fill against the full-width step.

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

from tests.tiny_models import ROOT, batches_of, generate, random_inputs, session_of
from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.requests import DecodeRequest
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


def _widths(monkeypatch: pytest.MonkeyPatch, steps) -> list[int]:
    """Record the width of every step `steps` runs from now on."""
    seen: list[int] = []
    run = steps.run

    def spy(rows, enc, caches, *, shape, **kw):
        seen.append(shape.width)
        return run(rows, enc, caches, shape=shape, **kw)

    monkeypatch.setattr(steps, "run", spy)
    return seen


@pytest.mark.parametrize("checkpoint", ["base", "legal"])
def test_a_cpu_step_feeds_only_the_slots_its_drafts_fill(monkeypatch, checkpoint):
    """Read every step (sync_every 1) with no graph, a step is 1 + the most drafts any row holds
    wide; read every 3 steps it stays 1 + K wide. Both decode the same tokens in the same steps
    and verify the same drafts, so narrowing drops only slots that verify nothing."""
    model, tok = load_checkpoint(ROOT / "checkpoints" / checkpoint)
    corpus = "general" if checkpoint == "base" else "legal"
    texts = [r["text"] for r in read_split(ROOT / "data", corpus, "eval")[:12]]
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="pt")
    k = model.config.nar_block_size
    widths = _widths(monkeypatch, session_of(model).steps)
    outs = {}
    for every in (1, 3):
        widths.clear()
        outs[every] = [generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=48, sync_every=every,
                                return_dict_in_generate=True)
                       for ids, mask in batches_of(enc["input_ids"], enc["attention_mask"], 4)]
        if every == 1:
            assert widths[0] == 1 and min(widths) == 1 and set(widths) > {1}  # nothing drafted before step 1
            assert max(widths) <= 1 + k and sum(widths) < len(widths) * (1 + k)
        else:
            assert set(widths) == {1 + k}
    for narrow, static in zip(outs[1], outs[3], strict=True):
        assert torch.equal(narrow.sequences, static.sequences)
        assert narrow.stats == static.stats  # steps, accepted histogram and drafts verified


def test_the_continuous_engine_narrows_its_cpu_steps(monkeypatch):
    model, tok = load_checkpoint(ROOT / "checkpoints" / "legal")
    texts = [r["text"] for r in read_split(ROOT / "data", "legal", "eval")[:10]]
    ids = tok(texts, truncation=True, max_length=128)["input_ids"]
    reqs = [DecodeRequest(key=i, input_ids=x, params=DecodingParams(mode="hybrid", max_new_tokens=40))
            for i, x in enumerate(ids)]
    session = session_of(model)
    widths = _widths(monkeypatch, session.steps)
    results = session.engine(max_rows=4).run(reqs)
    k = model.config.nar_block_size
    assert widths[0] == 1 and 1 < max(widths) <= 1 + k and min(widths[1:]) < 1 + k
    for req, res in zip(reqs, results, strict=True):
        alone = generate(model, input_ids=torch.tensor([req.input_ids]), params=req.params, sync_every=3,
                         return_dict_in_generate=True)
        assert res.tokens == alone.sequences[0, 1 : 1 + alone.stats[0].tokens].tolist()
        assert res.stats.drafted_tokens == alone.stats[0].drafted_tokens


def test_only_greedy_verified_drafting_shapes_narrow():
    from yue2_jobs.decode.engine import StepShape
    from yue2_jobs.decode.sampling import SamplingParams

    hybrid = StepShape.of(k=4, drafts="nar")
    assert [hybrid.narrowed(n).width for n in (0, 1, 3, 4)] == [1, 2, 4, 5]
    assert StepShape.of(k=4, drafts="host").narrowed(2).width == 3  # prompt lookup's drafts, counted on the host
    sampled = StepShape.of(k=4, drafts="nar", params=SamplingParams.of(DecodingParams(do_sample=True)))
    for shape in (StepShape.of(k=4, drafts="none"), StepShape.of(k=4, drafts="nar", trust=True), sampled):
        assert shape.narrowed(0) == shape  # `ar`; trusted drafts feed uncached tokens first; q is K wide
