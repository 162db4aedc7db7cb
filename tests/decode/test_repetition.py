"""Repetition controls: Hugging Face `generate`'s semantics, in every mode, lossless modes == `ar`."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import BartForConditionalGeneration
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

from tests.tiny_models import MAX_NEW, generate, varied_inputs
from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.sampling import SamplingParams, repetition_controls
from yue2_jobs.model import Yue2ForConditionalGeneration
from yue2_jobs.model.convert import yue2_from_bart

CONTROLS = [dict(repetition_penalty=1.5), dict(repetition_penalty=0.7), dict(no_repeat_ngram_size=1),
            dict(no_repeat_ngram_size=2), dict(no_repeat_ngram_size=3),
            dict(repetition_penalty=1.3, no_repeat_ngram_size=2)]


def _hf(bart: BartForConditionalGeneration, ids: torch.Tensor, mask: torch.Tensor, **controls) -> torch.Tensor:
    return bart.generate(input_ids=ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW,
                         **controls)


@pytest.fixture(scope="module")
def converted(varied_bart: BartForConditionalGeneration) -> Yue2ForConditionalGeneration:
    return yue2_from_bart(varied_bart)


@pytest.mark.parametrize("controls", CONTROLS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_ar_equals_hf_generate_on_converted_bart(varied_bart, converted, bart_batch, controls):
    ids, mask = bart_batch
    expected = _hf(varied_bart, ids, mask, **controls)
    assert not torch.equal(expected, _hf(varied_bart, ids, mask)), "the controls must change this batch's output"
    got = generate(converted, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, mode="ar", **controls)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("controls", CONTROLS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("mode", ["hybrid", "prompt_lookup", "nar"])
def test_lossless_modes_equal_ar_with_controls(converted, tiny_yue2, bart_batch, controls, mode):
    extra = {"nar_iterations": MAX_NEW + 1} if mode == "nar" else {}
    for model, (ids, mask) in ((converted, bart_batch), (tiny_yue2, varied_inputs(vocab=300))):
        ar = generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, mode="ar", **controls)
        got = generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, mode=mode, **controls,
                       **extra)
        assert torch.equal(got, ar), (mode, controls)


def test_hybrid_verifies_drafts_against_the_controls(tiny_yue2):
    """The NAR branch drafts without the controls; verification must still reject the drafts the
    controls forbid, so hybrid's drafts are accepted less often with them on than off."""
    ids, mask = varied_inputs(vocab=300)
    plain = generate(tiny_yue2, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, mode="hybrid",
                     return_dict_in_generate=True)
    banned = generate(tiny_yue2, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, mode="hybrid",
                      no_repeat_ngram_size=1, return_dict_in_generate=True)
    assert not torch.equal(plain.sequences, banned.sequences)
    for row in banned.sequences[:, 1:].tolist():  # no token twice (pads after EOS aside)
        body = [t for t in row if t != tiny_yue2.config.pad_token_id]
        assert len(body) == len(set(body))


@pytest.mark.parametrize("mode", ["ar", "hybrid"])
def test_sampling_never_repeats_a_banned_ngram(tiny_yue2, mode):
    ids, mask = varied_inputs(vocab=300)
    for seed in range(3):
        seqs = generate(tiny_yue2, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, mode=mode,
                        do_sample=True, seed=seed, no_repeat_ngram_size=2)
        for row in seqs.tolist():
            body = [t for t in row if t != tiny_yue2.config.pad_token_id]
            grams = list(itertools.pairwise(body))
            assert len(grams) == len(set(grams))


def test_processor_matches_hf_for_every_prefix():
    """Each slot's context is a prefix of one sequence: the result equals HF's processors run on
    that prefix."""
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(0, 6, (4, 12), generator=g)  # a small vocabulary: many repeats
    length = torch.tensor([[1, 2, 3], [5, 6, 7], [9, 10, 11], [12, 12, 12]])
    logits = torch.randn(4, 3, 6, generator=g)
    for penalty, n in ((1.4, 0), (1.0, 2), (1.0, 3), (1.2, 1), (0.6, 2)):
        got = repetition_controls(logits.clone(), seq, length,
                                  SamplingParams.of(DecodingParams(repetition_penalty=penalty, no_repeat_ngram_size=n)))
        for a in range(4):
            for w in range(3):
                ctx = seq[a : a + 1, : length[a, w]]
                want = logits[a, w][None].clone()
                if penalty != 1.0:
                    want = RepetitionPenaltyLogitsProcessor(penalty)(ctx, want)
                if n:
                    want = NoRepeatNGramLogitsProcessor(n)(ctx, want)
                torch.testing.assert_close(got[a, w], want[0], rtol=0, atol=0)


@pytest.mark.parametrize(("field", "value"), [("repetition_penalty", 0.0), ("no_repeat_ngram_size", -1)])
def test_bad_values_are_clear_errors(field, value):
    with pytest.raises(ValueError, match=field):
        DecodingParams(**{field: value})  # the one place parameters are checked (SamplingParams derives)
