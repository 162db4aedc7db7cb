"""Growing a model wider (`yue2_jobs.model.grow`, what `benchmarks/grown.py` measures) keeps what it
computes: the same logits to float rounding, the same greedy tokens, `hybrid` still equal to `ar`,
and an untied output projection that survives a checkpoint round trip and a BART export."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import random_inputs, session_of
from yue2_jobs.model import Yue2Config, Yue2ForConditionalGeneration
from yue2_jobs.model.checkpoint import save_checkpoint
from yue2_jobs.model.convert import bart_from_yue2, yue2_from_bart
from yue2_jobs.model.grow import MASKED_BIAS, grow


@pytest.fixture(scope="module")
def small() -> Yue2ForConditionalGeneration:
    cfg = Yue2Config(vocab_size=300, d_model=32, encoder_layers=2, decoder_layers=2, nar_layers=1,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
                     max_position_embeddings=64, nar_block_size=3, draft_vocab_size=120)
    torch.manual_seed(0)
    model = Yue2ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 1.0)
        model.final_logits_bias[0, cfg.eos_token_id] = -5.0
        for p in model.parameters():  # LayerNorm parameters off their defaults, so copying them is tested
            p.add_(torch.randn_like(p) * 0.05)
    model.set_draft_vocab(torch.arange(0, 300, 2)[:120])
    return model


@pytest.mark.parametrize(("factor", "ffn"), [(4, 4 * 48), (3, 200)])  # an uneven copy count, a non-power of 2
def test_a_grown_model_computes_what_it_grew_from(small, factor, ffn):
    g = grow(small, d_model=factor * 32, ffn_dim=ffn, vocab_size=1000)
    assert (g.config.d_model, g.config.decoder_ffn_dim, g.config.vocab_size) == (factor * 32, ffn, 1000)
    assert g.config.decoder_attention_heads == 4 * factor and g.lm_head is not None
    ids, mask = random_inputs(6, vocab=300, seed=3)
    dec = ids[:, :12]
    with torch.no_grad():
        a = small(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        b = g(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert (a - b[..., :300]).abs().max() < 1e-4
    assert b[..., 300:].max() < MASKED_BIAS / 2  # the new ids are never chosen
    for mode in ("ar", "hybrid"):
        want = session_of(small).generate(ids, mask, mode="ar", max_new_tokens=16).sequences
        got = session_of(g).generate(ids, mask, mode=mode, max_new_tokens=16).sequences
        assert torch.equal(want, got), mode
    # The drafter grew with it: the same drafts, so the same tokens per step.
    s_small = session_of(small).generate(ids, mask, mode="hybrid", max_new_tokens=16).stats
    s_grown = session_of(g).generate(ids, mask, mode="hybrid", max_new_tokens=16).stats
    assert [s.nar_tokens for s in s_small] == [s.nar_tokens for s in s_grown]


def test_an_untied_model_round_trips_through_a_checkpoint_and_bart(small, tmp_path):
    g = grow(small, d_model=64, ffn_dim=96, vocab_size=400)
    loaded = Yue2ForConditionalGeneration.from_pretrained(save_checkpoint(g, None, tmp_path / "grown"))
    assert loaded.lm_head is not None and torch.equal(loaded.lm_head.weight, g.lm_head.weight)
    assert not torch.equal(loaded.lm_head.weight[:300], loaded.shared.weight[:300])
    bart = bart_from_yue2(g)
    assert not bart.config.tie_word_embeddings
    assert torch.equal(bart.lm_head.weight, g.lm_head.weight)
    back = yue2_from_bart(bart)
    assert back.lm_head is not None and torch.equal(back.lm_head.weight, g.lm_head.weight)
    ids, mask = random_inputs(4, vocab=300, seed=5)
    with torch.no_grad():
        ours = g(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :8]).logits
        theirs = bart(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :8]).logits
    assert (ours - theirs).abs().max() < 1e-4


def test_growing_refuses_a_narrower_shape(small):
    with pytest.raises(ValueError, match="multiple"):
        grow(small, d_model=48, ffn_dim=96, vocab_size=400)
    with pytest.raises(ValueError, match="shrink"):
        grow(small, d_model=64, ffn_dim=32, vocab_size=400)


def test_a_grown_model_grows_again_and_scaled_embeddings_stay_scaled(small):
    """An untied source (a grown model) keeps its own output rows; with `scale_embedding` the inputs
    are scaled by the old width's square root, not the new one's."""
    ids, mask = random_inputs(4, vocab=300, seed=7)
    twice = grow(grow(small, d_model=64, ffn_dim=96, vocab_size=400), d_model=128, ffn_dim=256, vocab_size=500)
    scaled = Yue2ForConditionalGeneration(small.config.replaced(scale_embedding=True)).eval()
    scaled.load_state_dict(small.state_dict())
    with torch.no_grad():
        for source, grown in ((small, twice), (scaled, grow(scaled, d_model=128, ffn_dim=192, vocab_size=300))):
            a = source(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :8]).logits
            b = grown(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :8]).logits
            assert (a - b[..., :300]).abs().max() < 1e-4
