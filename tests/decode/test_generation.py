"""The decode loop: cached == uncached, the multi-token cache path, sampling, limits."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import generate, session_of, varied_inputs


@pytest.fixture(scope="module")
def batch(tiny_config):
    return varied_inputs(vocab=tiny_config.vocab_size, lengths=[12, 5, 9, 2])


def test_cached_greedy_equals_uncached_recompute(tiny_yue2, batch):
    ids, mask = batch
    cached = generate(tiny_yue2, input_ids=ids, attention_mask=mask, max_new_tokens=20)
    assert cached.shape[1] > 5  # the fixture keeps sequences going
    seq = cached[:, :1]
    with torch.no_grad():
        for pos in range(cached.shape[1] - 2):  # the last token is the forced EOS
            logits = tiny_yue2(input_ids=ids, attention_mask=mask, decoder_input_ids=seq).logits[:, -1]
            nxt = logits.argmax(-1)
            live = ~(seq[:, 1:] == tiny_yue2.config.eos_token_id).any(1)
            assert torch.equal(nxt[live], cached[live, pos + 1])
            seq = torch.cat([seq, cached[:, pos + 1 : pos + 2]], 1)


def test_cached_step_logits_match_uncached(tiny_yue2, batch):
    ids, mask = batch
    dec = torch.randint(4, tiny_yue2.config.vocab_size, (ids.shape[0], 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = tiny_yue2(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits  # (B, T, V)
        enc = tiny_yue2.encode(ids, mask)
        caches = tiny_yue2.new_caches(batch_size=ids.shape[0], max_len=10)
        # One token, then three at once (the path hybrid verification uses), then the rest singly.
        chunks = [(0, 1), (1, 4), (4, 5), (5, 10)]
        for start, end in chunks:
            hidden = tiny_yue2.decode(dec[:, start:end], enc, caches=caches, start=start)
            torch.testing.assert_close(tiny_yue2.lm_logits(hidden), full[:, start:end], atol=1e-5, rtol=1e-5)


def test_sampling_is_seeded_and_top_k_1_is_greedy(tiny_yue2, batch):
    ids, mask = batch
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12)
    a = generate(tiny_yue2, do_sample=True, temperature=1.5, top_p=0.9, seed=7, **kw)
    b = generate(tiny_yue2, do_sample=True, temperature=1.5, top_p=0.9, seed=7, **kw)
    c = generate(tiny_yue2, do_sample=True, temperature=1.5, top_p=0.9, seed=8, **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(generate(tiny_yue2, do_sample=True, top_k=1, seed=1, **kw), generate(tiny_yue2, **kw))


def test_top_p_keeps_only_the_nucleus():
    from yue2_jobs.decode.params import DecodingParams
    from yue2_jobs.decode.sampling import SamplingParams, select_next_token

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = SamplingParams.of(DecodingParams(do_sample=True, top_p=0.7))
    g = torch.Generator().manual_seed(0)
    drawn = {int(select_next_token(logits, params, g)) for _ in range(200)}
    assert drawn == {0, 1}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=0.0, do_sample=True), "temperature"),
        (dict(top_p=0.0, do_sample=True), "top_p"),
        (dict(top_k=-1, do_sample=True), "top_k"),
        (dict(mode="beam"), "mode"),
        (dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_arguments_name_the_field(tiny_yue2, batch, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(tiny_yue2, input_ids=batch[0], **kwargs)


def test_too_long_input_names_the_limit(tiny_yue2, tiny_config):
    ids = torch.full((1, tiny_config.max_position_embeddings + 1), 5)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate(tiny_yue2, input_ids=ids)


def test_output_length_limit_is_explicit(tiny_yue2, tiny_config):
    ids = torch.full((1, 4), 5)
    limit = tiny_config.max_position_embeddings - 1
    with pytest.raises(ValueError, match=f"between 1 and {limit}"):
        generate(tiny_yue2, input_ids=ids, max_new_tokens=limit + 1)
    assert generate(tiny_yue2, input_ids=ids, max_new_tokens=limit).shape[1] <= limit + 1


def test_nar_draft_shapes_and_confidence(tiny_yue2, batch, tiny_config):
    ids, mask = batch
    with torch.no_grad():
        enc = tiny_yue2.encode(ids, mask)
        hidden = tiny_yue2.decode(torch.full((4, 3), 2), enc)
        logits, conf = tiny_yue2.draft(hidden, torch.full((4, 3), 7), enc)
    k = tiny_config.nar_block_size
    assert logits.shape == (4, 3, k, tiny_config.vocab_size)
    assert conf.shape == (4, 3, k)
    assert torch.isfinite(conf).all()


def test_one_token_decode_block_equals_the_general_decoder(tiny_yue2, batch):
    ids, mask = batch
    dec = torch.randint(4, tiny_yue2.config.vocab_size, (ids.shape[0], 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        enc = tiny_yue2.encode(ids, mask)
        general, fast = (tiny_yue2.new_caches(batch_size=ids.shape[0], max_len=6) for _ in range(2))
        layout = session_of(tiny_yue2).steps.layout()
        for pos in range(6):
            expected = tiny_yue2.lm_logits(tiny_yue2.decode(dec[:, pos : pos + 1], enc, caches=general, start=pos))
            at = torch.full((ids.shape[0], 1), pos)
            got = layout.lm_logits(tiny_yue2.decode_block(dec[:, pos : pos + 1], enc, caches=fast, positions=at,
                                                          layout=layout)[:, 0])
            torch.testing.assert_close(got, expected[:, 0], atol=1e-5, rtol=1e-5)
        for a, b in zip(general, fast, strict=True):
            torch.testing.assert_close(a.k, b.k, atol=1e-6, rtol=0)


def test_step_layout_follows_weight_changes(tiny_config, batch):
    """A stale copy of the weights would decode with the old model after a load or an update."""
    from yue2_jobs.model import Yue2ForConditionalGeneration

    ids, mask = batch
    torch.manual_seed(1)
    first, second = (Yue2ForConditionalGeneration(tiny_config).eval() for _ in range(2))
    with torch.no_grad():
        for m in (first, second):
            m.final_logits_bias.normal_(0, 1.0)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=10)
    expected = generate(second, **kw)
    assert not torch.equal(generate(first, **kw), expected)  # also builds first's layout
    layout = session_of(first).steps.layout()
    assert session_of(first).steps.layout() is layout  # unchanged weights: reused
    first.load_state_dict(second.state_dict())
    assert session_of(first).steps.layout() is not layout
    assert torch.equal(generate(first, **kw), expected)
    with torch.no_grad():  # an in-place update, as an optimizer step makes
        first.decoder_layers[0].ffn.fc1.weight.mul_(3.0)
        second.decoder_layers[0].ffn.fc1.weight.mul_(3.0)
    assert torch.equal(generate(first, **kw), generate(second, **kw))


def test_models_built_in_inference_mode_decode_with_current_weights(tiny_config, batch):
    from yue2_jobs.model import Yue2ForConditionalGeneration

    ids, mask = batch
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=8)
    with torch.inference_mode():  # such weights keep no version counter
        torch.manual_seed(2)
        model = Yue2ForConditionalGeneration(tiny_config).eval()
        model.final_logits_bias.normal_(0, 1.0)
        first = generate(model, **kw)
        model.decoder_layers[0].ffn.fc1.weight.mul_(3.0)
        model.final_logits_bias.normal_(0, 1.0)
        seq = torch.full((ids.shape[0], 1), tiny_config.decoder_start_token_id)
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=seq).logits[:, -1].argmax(-1)
        second = generate(model, **kw)
    assert not torch.equal(first[:, 1], second[:, 1])
    assert torch.equal(second[:, 1], expected)


def test_decode_block_at_per_row_positions_equals_the_general_decoder(tiny_yue2, batch):
    """Rows at different lengths, several tokens each: what hybrid verification runs."""
    ids, mask = batch
    b = ids.shape[0]
    dec = torch.randint(4, tiny_yue2.config.vocab_size, (b, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        enc = tiny_yue2.encode(ids, mask)
        full = tiny_yue2.decode(dec, enc)  # (B, 9, C), causal, no cache
        caches = tiny_yue2.new_caches(batch_size=b, max_len=16)
        layout = session_of(tiny_yue2).steps.layout()
        start = torch.tensor([0, 2, 3, 1])[:b]  # then each row re-feeds 3 tokens from its own position
        first = torch.arange(4).expand(b, -1)  # every row writes positions 0..3 first
        tiny_yue2.decode_block(dec[:, :4], enc, caches=caches, positions=first, layout=layout)
        positions = start[:, None] + torch.arange(3)  # (B, 3): rows re-feed from their own position
        tokens = dec.gather(1, positions)
        got = tiny_yue2.decode_block(tokens, enc, caches=caches, positions=positions, layout=layout)
    expected = full.gather(1, positions[:, :, None].expand(-1, -1, full.shape[-1]))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_draft_step_equals_draft(tiny_yue2, batch):
    ids, mask = batch
    b = ids.shape[0]
    with torch.no_grad():
        enc = tiny_yue2.encode(ids, mask)
        hidden = tiny_yue2.decode(torch.full((b, 3), 2), enc)[:, -1]  # (B, C)
        nxt = torch.tensor([7, 8, 9, 10])[:b]
        logits, conf = tiny_yue2.draft(hidden[:, None], nxt[:, None], enc)
        fast_logits, fast_conf = tiny_yue2.draft_step(hidden, nxt, enc, layout=session_of(tiny_yue2).steps.layout())
    torch.testing.assert_close(fast_logits, logits[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast_conf, conf[:, 0], atol=1e-5, rtol=1e-5)
