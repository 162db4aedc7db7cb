"""The decode-step weight layout: float kernels chosen by row count, int8 matrices, the draft
vocabulary; and that `hybrid` stays `ar` greedy with each of them."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.tiny_models import batches_of, random_inputs
from yue2_jobs.decode.layout import ONEDNN_MIN_NUMEL, DenseMatrix, Int8Matrix, StepLayout
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.model import Yue2ForConditionalGeneration
from yue2_jobs.model.checkpoint import load_checkpoint, save_checkpoint
from yue2_jobs.training.draft_vocab import shortlist


def _copy(model: Yue2ForConditionalGeneration) -> Yue2ForConditionalGeneration:
    """The fixture's weights in a model of its own (setting a draft vocabulary edits the config)."""
    out = Yue2ForConditionalGeneration(copy.deepcopy(model.config)).eval()
    out.load_state_dict(model.state_dict())
    return out


@pytest.fixture()
def linear():
    torch.manual_seed(3)
    return torch.randn(96, 64) / 8, torch.randn(96)  # (out, in), (out,)


@pytest.mark.parametrize("rows", [1, 2, 5, 17])
@pytest.mark.parametrize("io_copy", [False, True])
@pytest.mark.parametrize("size", ["small", "onednn"])
def test_dense_matrix_equals_linear_for_any_row_count(linear, rows, io_copy, size):
    w, b = linear
    if size == "onednn":  # large enough for the packed oneDNN kernel
        w, b = torch.randn(1024, 512) / 20, torch.randn(1024)
        assert w.numel() >= ONEDNN_MIN_NUMEL
    m = DenseMatrix(w, b, io_copy=io_copy)
    assert (m.packed is not None) == (size == "onednn" and torch.backends.mkldnn.is_available())
    x = torch.randn(rows, w.shape[1])
    torch.testing.assert_close(m(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    if m.packed is not None:  # one row's product does not depend on the others
        together = m(x)
        assert all(torch.equal(m(x[i : i + 1]), together[i : i + 1]) for i in range(rows))


@pytest.mark.parametrize("kernel", ["fbgemm", "int_mm"])
def test_int8_rows_do_not_depend_on_each_other(linear, kernel):
    """Integer sums are exact: a row's product is the same alone and among others, which is what
    keeps `hybrid` (1 + K rows per sequence) equal to `ar` (one) in int8."""
    w, b = linear
    m = Int8Matrix(w, b)
    if kernel == "int_mm":  # the fallback, forced
        m.q, m.packed = torch.round(w / m.scale[:, None]).clamp(-127, 127).to(torch.int8), None
    elif m.packed is None:
        pytest.skip("fbgemm is not this machine's quantized engine, or its sums are not exact here")
    x = torch.randn(9, 64) * torch.logspace(-2, 2, 9)[:, None]  # rows of very different sizes
    together = m(x)
    for i in range(9):
        assert torch.equal(m(x[i : i + 1]), together[i : i + 1])
    assert torch.equal(m(x[2:7]), together[2:7])
    ref = F.linear(x, w, b)
    err = (together - ref).abs().amax(1) / ref.abs().amax(1)
    assert float(err.max()) < 0.05  # 8-bit weights and activations: about 1 % here
    assert float(err.max()) > 0  # the check sees quantization at all


def test_int8_products_are_exact_integer_sums_at_this_cpus_activation_width():
    """fbgemm's kernel at the width its self-check chose (8-bit activations on AVX-512 VNNI, 7-bit on
    AVX2): every product equals the integer sums of the quantized operands, scaled."""
    from yue2_jobs.decode.layout import fbgemm_activation_levels

    levels = fbgemm_activation_levels()
    if not levels:
        pytest.skip("fbgemm is not this machine's quantized engine, or its sums are not exact here")
    torch.manual_seed(0)
    w = torch.randn(256, 320)
    m = Int8Matrix(w, torch.zeros(256))
    assert m.packed is not None and m.levels == levels
    x = torch.randn(6, 320) * torch.logspace(-3, 3, 6)[:, None]
    s = x.abs().amax(-1, keepdim=True) / levels
    xi = torch.round(x / s)
    q = torch.round(w / m.scale[:, None]).clamp(-127, 127)
    exact = (xi.double() @ q.double().t()) * m.scale.double() * s.double()
    torch.testing.assert_close(m(x).double(), exact, rtol=1e-6, atol=1e-6 * float(exact.abs().max()))


def test_draft_vocabulary_projects_onto_its_ids(tiny_yue2, tiny_config):
    model = _copy(tiny_yue2)
    ids = torch.tensor([2, 5, 9, 40, 41, 299])
    model.set_draft_vocab(ids.flip(0))  # sorted on the way in
    assert model.config.draft_vocab_size == 6 and torch.equal(model.draft_vocab, ids)
    h = torch.randn(4, tiny_config.d_model)
    torch.testing.assert_close(model.draft_logits(h), model.lm_logits(h)[:, ids])
    for weights in ("float", "int8"):
        layout = StepLayout(model, weights=weights)
        got = layout.draft_logits(h)
        assert got.shape == (4, 6)
        assert set(model.draft_tokens(got).tolist()) <= set(ids.tolist())
    with pytest.raises(ValueError, match="draft vocabulary"):
        model.set_draft_vocab([0, 300])


@pytest.mark.parametrize("weights", ["float", "int8"])
def test_the_prefill_through_the_layout_equals_the_encoder(tiny_yue2, weights):
    from tests.tiny_models import varied_inputs

    ids, mask = varied_inputs(vocab=tiny_yue2.config.vocab_size)
    with torch.inference_mode():
        ref = tiny_yue2.encode(ids, mask)
        got = tiny_yue2.encode(ids, mask, layout=StepLayout(tiny_yue2, weights=weights))
    tol = dict(rtol=1e-4, atol=1e-4) if weights == "float" else dict(rtol=0.05, atol=0.05)
    # At the real tokens: the layout's prefill skips the padding (zeros there; masked wherever read).
    keep = mask.bool()
    assert torch.equal(got.mask, ref.mask)
    torch.testing.assert_close(got.hidden[keep], ref.hidden[keep], **tol)
    assert not got.hidden[~keep].any()
    for (k, v), (rk, rv) in zip(got.cross_kv + got.nar_cross_kv, ref.cross_kv + ref.nar_cross_kv, strict=True):
        torch.testing.assert_close(k.transpose(1, 2)[keep], rk.transpose(1, 2)[keep], **tol)  # (N, H, D)
        torch.testing.assert_close(v.transpose(1, 2)[keep], rv.transpose(1, 2)[keep], **tol)


def test_a_checkpoint_keeps_its_draft_vocabulary(tiny_yue2, tiny_config, tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    model = _copy(tiny_yue2)
    model.set_draft_vocab(range(2, 120, 3))
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    save_checkpoint(model, tok, tmp_path / "ckpt")
    loaded, _ = load_checkpoint(tmp_path / "ckpt")
    assert loaded.config.draft_vocab_size == 40
    assert torch.equal(loaded.draft_vocab, torch.arange(2, 120, 3))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("draft_vocab", [False, True])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_hybrid_equals_ar_in_each_weight_format(tiny_yue2, tiny_config, dtype, draft_vocab, batch_size):
    model = _copy(tiny_yue2)
    ids, mask = random_inputs(24, tiny_config.vocab_size, seed=7)
    if draft_vocab:  # the ids that cover most of the model's own outputs, as training builds it
        outputs = DecodeSession(model).generate(ids, mask, mode="ar", max_new_tokens=16).sequences[:, 1:]
        model.set_draft_vocab(shortlist(outputs.tolist(), coverage=0.8, always=[tiny_config.eos_token_id]))
        assert model.config.draft_vocab_size < tiny_config.vocab_size // 2
    session = DecodeSession(model, dtype=dtype)
    drafted = {"hybrid": 0, "prompt_lookup": 0}
    for b_ids, b_mask in batches_of(ids, mask, batch_size):
        ar = session.generate(b_ids, b_mask, mode="ar", max_new_tokens=16).sequences
        for mode in drafted:
            out = session.generate(b_ids, b_mask, mode=mode, max_new_tokens=16, min_accept_prob=0.0)
            assert torch.equal(out.sequences, ar), mode
            drafted[mode] += sum(s.nar_tokens for s in out.stats)
    assert drafted["hybrid"] > 0  # drafts were accepted, so verification was exercised
    if dtype == "int8":  # the continuous engine decodes the same tokens
        from yue2_jobs.decode.params import DecodingParams
        from yue2_jobs.decode.requests import DecodeRequest

        reqs = [DecodeRequest(key=i, input_ids=row[row_mask.bool()].tolist(),
                              params=DecodingParams(mode="hybrid", max_new_tokens=16))
                for i, (row, row_mask) in enumerate(zip(ids[:8], mask[:8], strict=True))]
        results = session.engine(max_rows=3).run(reqs)
        for req, res in zip(reqs, results, strict=True):
            alone = session.generate(torch.tensor([req.input_ids]), mode="ar", max_new_tokens=16).sequences[0, 1:]
            assert res.tokens == [t for t in alone.tolist() if t != tiny_config.pad_token_id]


def test_int8_stays_close_to_float32(tiny_yue2, tiny_config):
    ids, mask = random_inputs(16, tiny_config.vocab_size, seed=9)
    outs = {}
    for dtype in ("float32", "int8"):
        model = _copy(tiny_yue2)
        outs[dtype] = DecodeSession(model, dtype=dtype).generate(ids, mask, mode="ar", max_new_tokens=16).sequences
    same = (outs["float32"] == outs["int8"]).float().mean()
    assert same > 0.6, same  # a random model's logits are flat: the share is far higher on trained ones


def test_int8_is_refused_off_the_cpu(tiny_yue2):
    with pytest.raises(ValueError, match="CPU only"):
        DecodeSession(tiny_yue2, device="meta", dtype="int8")


def test_steps_are_narrowed_only_where_rows_cost(tiny_yue2, tiny_config):
    """MKL's small matrices and int8's cost each row fed; oneDNN's packed ones do not."""
    assert StepLayout(tiny_yue2).narrow_pays  # every decoder matrix under ONEDNN_MIN_NUMEL
    wide = Yue2ForConditionalGeneration(tiny_config.replaced(d_model=512, decoder_ffn_dim=512, encoder_ffn_dim=512))
    assert 3 * 512 * 512 >= ONEDNN_MIN_NUMEL
    assert StepLayout(wide, weights="int8").narrow_pays
    if torch.backends.mkldnn.is_available():
        assert not StepLayout(wide).narrow_pays


def test_the_packed_prefill_gives_each_row_what_it_gives_the_row_alone(tiny_yue2):
    """Packed (padding skipped), a row's encoder states equal its own unpadded pass; a row of
    padding only is skipped, not an error."""
    from tests.tiny_models import varied_inputs

    ids, mask = varied_inputs(vocab=tiny_yue2.config.vocab_size)
    mask[2] = 0  # this row has no real token
    layout = StepLayout(tiny_yue2)
    with torch.inference_mode():
        got = tiny_yue2.encode(ids, mask, layout=layout)
        for row in (0, 1, 3):
            n = int(mask[row].sum())
            alone = tiny_yue2.encode(ids[row : row + 1, :n], layout=layout)
            torch.testing.assert_close(got.hidden[row, :n], alone.hidden[0], rtol=1e-5, atol=1e-5)
    assert not got.hidden[2].any()
