"""Draft-and-verify decoding: `hybrid` == `ar` greedy, speculative sampling, `hybrid_fast`, `nar`, stats."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tests.shipped import shipped_base as load_shipped_base
from tests.tiny_models import MAX_NEW, ROOT, batches_of, generate, random_inputs, session_of
from yue2_jobs.decode.generate import trim_to_lengths
from yue2_jobs.decode.loop import DraftPolicy, PromptLookupDrafter, decode_batch
from yue2_jobs.decode.sampling import SamplingParams
from yue2_jobs.decode.stats import StatsRecorder
from yue2_jobs.model import Yue2Config, Yue2ForConditionalGeneration
from yue2_jobs.model.convert import yue2_from_bart
from yue2_jobs.training.data import read_split


def _assert_same_as_ar(model, ids, mask, *, batch_size: int, max_new_tokens: int, **kw) -> list:
    stats = []
    for b_ids, b_mask in batches_of(ids, mask, batch_size):
        ar = generate(model, mode="ar", input_ids=b_ids, attention_mask=b_mask, max_new_tokens=max_new_tokens)
        out = generate(model, input_ids=b_ids, attention_mask=b_mask, max_new_tokens=max_new_tokens,
                       return_dict_in_generate=True, **kw)
        assert torch.equal(out.sequences, ar), (b_ids, out.sequences, ar)
        stats += out.stats
    return stats


@pytest.fixture(scope="module")
def shipped_base():
    return load_shipped_base()


@pytest.fixture(scope="module")
def shipped_inputs(shipped_base):
    _, tok = shipped_base
    texts = [r["text"] for r in read_split(ROOT / "data", "general", "eval")[:160]]
    texts += [r["text"] for r in read_split(ROOT / "data", "legal", "eval")[:48]]
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


@pytest.mark.slow  # long model work (make test runs it; make test-fast leaves it out)
@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_hybrid_greedy_equals_ar_on_the_shipped_base(shipped_base, shipped_inputs, batch_size):
    model, _ = shipped_base
    ids, mask = shipped_inputs
    assert ids.shape[0] >= 200
    stats = _assert_same_as_ar(model, ids, mask, batch_size=batch_size, max_new_tokens=48, mode="hybrid")
    tokens, steps = sum(s.tokens for s in stats), sum(s.decoder_steps for s in stats)
    assert steps < tokens  # drafts were accepted, not merely computed
    assert sum(s.nar_tokens for s in stats) == tokens - sum(s.ar_tokens for s in stats) > 0


@pytest.mark.parametrize("batch_size", [1, 3, 16])
@pytest.mark.parametrize("min_accept_prob", [0.0, 0.05, 0.5])
def test_hybrid_greedy_equals_ar_on_a_random_model(tiny_yue2, tiny_config, batch_size, min_accept_prob):
    ids, mask = random_inputs(200, tiny_config.vocab_size, seed=batch_size)
    _assert_same_as_ar(tiny_yue2, ids, mask, batch_size=batch_size, max_new_tokens=20, mode="hybrid",
                       min_accept_prob=min_accept_prob)


@pytest.mark.parametrize("batch_size", [1, 3, 6])
def test_rows_finishing_at_different_steps(varied_bart, bart_batch, batch_size):
    model = yue2_from_bart(varied_bart).eval()
    ids, mask = bart_batch
    ar = generate(model, mode="ar", input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW)
    lengths = (ar != model.config.pad_token_id).sum(1)
    assert len(set(lengths.tolist())) > 2  # early stops and the length limit in one batch
    for mode in ("hybrid", "prompt_lookup"):
        _assert_same_as_ar(model, ids, mask, batch_size=batch_size, max_new_tokens=MAX_NEW, mode=mode)


class OracleDrafter:
    """Drafts the true `ar` continuation, corrupted at random, running on past EOS and the length
    limit: exercises multi-token acceptance, EOS inside a draft and drafts past max_new_tokens."""

    def __init__(self, reference: torch.Tensor, *, k: int, vocab: int, corrupt: float, seed: int, eos: int = 2) -> None:
        self.reference, self.k, self.vocab, self.corrupt, self.eos = reference.tolist(), k, vocab, corrupt, eos
        self.rng = random.Random(seed)
        self.eos_inside = 0

    def draft(self, row: int, output: list[int]) -> list[int]:
        future = self.reference[row][1 + len(output) :]
        out = [t if self.rng.random() > self.corrupt else self.rng.randrange(4, self.vocab) for t in future[: self.k]]
        out += [self.rng.randrange(4, self.vocab) for _ in range(self.k - len(out))]
        self.eos_inside += self.eos in out[:-1]
        return out


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 20])
@pytest.mark.parametrize("corrupt", [0.0, 0.3])
def test_verification_with_an_oracle_drafter(tiny_yue2, tiny_config, max_new_tokens, corrupt):
    ids, mask = random_inputs(24, tiny_config.vocab_size, seed=7)
    ar = generate(tiny_yue2, mode="ar", input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens)
    for size in (1, 5, 24):
        for start in range(0, 24, size):
            sl = slice(start, start + size)
            drafter = OracleDrafter(ar[sl], k=tiny_config.nar_block_size, vocab=tiny_config.vocab_size,
                                    corrupt=corrupt, seed=start)
            stats = StatsRecorder(ids[sl].shape[0], max_nar_per_step=tiny_config.nar_block_size, device=ids.device)
            enc = tiny_yue2.encode(ids[sl], mask[sl])
            buf, lengths = decode_batch(
                session_of(tiny_yue2).steps, enc=enc, batch_size=ids[sl].shape[0], max_new_tokens=max_new_tokens,
                params=SamplingParams(), generator=None, policy=DraftPolicy(source="host", host_drafter=drafter),
                stats=stats)
            got = trim_to_lengths(buf, lengths, tiny_config.pad_token_id)
            expected = ar[sl][:, : got.shape[1]]
            assert torch.equal(got, expected) and not (ar[sl][:, got.shape[1] :] != 1).any()
            if corrupt == 0.0 and max_new_tokens > tiny_config.nar_block_size:
                done = stats.finish()
                assert all(s.decoder_steps < s.tokens for s in done)


def test_a_draft_with_eos_inside_is_cut_at_the_eos(varied_bart, bart_batch):
    model = yue2_from_bart(varied_bart).eval()
    ids, mask = bart_batch
    ar = generate(model, mode="ar", input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW)
    drafter = OracleDrafter(ar, k=model.config.nar_block_size, vocab=model.config.vocab_size, corrupt=0.0, seed=0,
                            eos=model.config.eos_token_id)
    stats = StatsRecorder(ids.shape[0], max_nar_per_step=model.config.nar_block_size, device=ids.device)
    buf, lengths = decode_batch(session_of(model).steps, enc=model.encode(ids, mask), batch_size=ids.shape[0],
                                max_new_tokens=MAX_NEW, params=SamplingParams(), generator=None,
                                policy=DraftPolicy(source="host", host_drafter=drafter), stats=stats)
    assert drafter.eos_inside > 0
    assert torch.equal(trim_to_lengths(buf, lengths, model.config.pad_token_id), ar)


def test_empty_inputs_and_max_new_tokens_1(shipped_base):
    model, tok = shipped_base
    enc = tok(["", "Return the sum of two arrays.", ""], padding=True, return_tensors="pt")
    for n in (1, 2, 48):
        ar = generate(model, mode="ar", **enc, max_new_tokens=n)
        for mode in ("hybrid", "prompt_lookup", "hybrid_fast"):
            out = generate(model, **enc, mode=mode, max_new_tokens=n, nar_threshold=1.0)
            assert torch.equal(out, ar)
        assert ar.shape[1] <= n + 1
    with pytest.raises(ValueError, match="input_ids must be"):
        generate(model, input_ids=torch.zeros(2, 0, dtype=torch.long), mode="hybrid")
    with pytest.raises(ValueError, match=r"attention_mask: rows \[1\]"):
        generate(model, input_ids=enc["input_ids"],
                 attention_mask=enc["attention_mask"] * torch.tensor([[1], [0], [1]]), mode="hybrid")


def test_stats_count_every_generated_token(shipped_base, shipped_inputs):
    model, _ = shipped_base
    ids, mask = shipped_inputs[0][:16], shipped_inputs[1][:16]
    k = model.config.nar_block_size
    for mode in ("ar", "hybrid", "hybrid_fast", "prompt_lookup", "nar"):
        out = generate(model, input_ids=ids, attention_mask=mask, mode=mode, max_new_tokens=48,
                       return_dict_in_generate=True)
        generated = (out.sequences[:, 1:] != model.config.pad_token_id).sum(1).tolist()
        assert [s.tokens for s in out.stats] == generated, mode
        for s in out.stats:
            if mode == "nar":
                assert s.decoder_steps == 4
                continue
            assert sum(s.accepted_histogram) == s.decoder_steps
            assert sum(n * c for n, c in enumerate(s.accepted_histogram)) == s.nar_tokens
            assert len(s.accepted_histogram) <= (2 * k if mode == "hybrid_fast" else k) + 1
            if mode == "ar":
                assert s.decoder_steps == s.tokens and s.nar_tokens == 0 == s.drafted_tokens
            if mode in ("hybrid", "prompt_lookup"):  # every accepted draft was verified first
                assert s.nar_tokens <= s.drafted_tokens <= k * s.decoder_steps
        if mode == "hybrid":
            assert sum(s.drafted_tokens for s in out.stats) > sum(s.nar_tokens for s in out.stats) > 0


def test_hybrid_fast_trades_verification_for_steps(shipped_base, shipped_inputs):
    model, _ = shipped_base
    ids, mask = shipped_inputs[0][:32], shipped_inputs[1][:32]
    kw = dict(max_new_tokens=48, return_dict_in_generate=True)
    exact = generate(model, input_ids=ids, attention_mask=mask, mode="hybrid", **kw)
    untrusting = generate(model, input_ids=ids, attention_mask=mask, mode="hybrid_fast", nar_threshold=1.0, **kw)
    assert torch.equal(untrusting.sequences, exact.sequences)
    steps = {}
    for threshold in (0.9, 0.5, 0.0):
        out = generate(model, input_ids=ids, attention_mask=mask, mode="hybrid_fast", nar_threshold=threshold, **kw)
        steps[threshold] = sum(s.decoder_steps for s in out.stats) / sum(s.tokens for s in out.stats)
    assert steps[0.0] < steps[0.5] <= steps[0.9]
    assert steps[0.0] < 1 / model.config.nar_block_size + 0.05  # everything trusted: ~k+1 tokens a step


@pytest.mark.parametrize("model_name", ["tiny_yue2", "shipped"])
def test_nar_with_enough_iterations_is_ar_greedy(request, model_name, shipped_base, shipped_inputs):
    if model_name == "shipped":
        model = shipped_base[0]
        ids, mask = shipped_inputs[0][:24], shipped_inputs[1][:24]
    else:
        model = request.getfixturevalue("tiny_yue2")
        ids, mask = random_inputs(24, model.config.vocab_size, seed=3)
    n = 16
    ar = generate(model, mode="ar", input_ids=ids, attention_mask=mask, max_new_tokens=n)
    assert torch.equal(generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=n, mode="nar",
                                nar_iterations=n), ar)
    few = generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=n, mode="nar", nar_iterations=2)
    assert few.shape[0] == ids.shape[0] and few.shape[1] <= n + 1
    assert (few[:, 0] == model.config.decoder_start_token_id).all()


def test_nar_refuses_sampling(tiny_yue2):
    with pytest.raises(ValueError, match="greedily"):
        generate(tiny_yue2, input_ids=torch.full((1, 4), 5), mode="nar", do_sample=True)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(nar_threshold=1.5), "nar_threshold"), (dict(min_accept_prob=-0.1), "min_accept_prob"),
    (dict(nar_iterations=0), "nar_iterations")])
def test_bad_hybrid_arguments_name_the_field(tiny_yue2, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(tiny_yue2, input_ids=torch.full((1, 4), 5), mode="hybrid_fast", **kwargs)


def test_prompt_lookup_drafts_copy_after_the_latest_match():
    ids = torch.tensor([[0, 10, 11, 12, 13, 10, 11, 14, 2]])
    drafter = PromptLookupDrafter(ids, None, pad_token_id=1, k=3)
    assert drafter.draft(0, [10, 11]) == [14, 2, 10]  # the latest earlier "10 11" is followed by 14
    assert drafter.draft(0, [13]) == [10, 11, 14]
    assert drafter.draft(0, [99]) == []
    assert drafter.draft(0, []) == []


# ---- sampling: the speculative rule keeps `ar`'s distribution ----------------------------------

@pytest.fixture(scope="module")
def small_vocab_model():
    cfg = Yue2Config(vocab_size=10, d_model=32, encoder_layers=1, decoder_layers=1, nar_layers=1,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                     max_position_embeddings=16, nar_block_size=3)
    torch.manual_seed(5)
    model = Yue2ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        model.shared.weight.mul_(10.0)  # peaked, context-dependent next-token distributions
        for special in (0, 1, 2, 3):  # never end or pad: every row samples all its positions
            model.final_logits_bias[0, special] = -30.0
        model.nar_slot_embed.weight.normal_(0, 3.0)  # a drafter whose q differs from p
    return model


def _exact_marginals(model, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """P(token at position t) for t = 1..steps under `ar` sampling, by enumerating every prefix."""
    v = model.config.vocab_size
    prefixes = torch.full((1, 1), model.config.decoder_start_token_id)
    weights = torch.ones(1)
    marginals = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=ids.expand(len(prefixes), -1), decoder_input_ids=prefixes).logits[:, -1]
            p = logits.float().softmax(-1) * weights[:, None]  # (N, V)
            marginals.append(p.sum(0))
            prefixes = torch.cat([prefixes.repeat_interleave(v, 0), torch.arange(v).repeat(len(prefixes))[:, None]], 1)
            weights = p.reshape(-1)
    return marginals


@pytest.mark.parametrize("draft_vocab", [None, [0, 4, 5, 6, 8]])
def test_speculative_sampling_keeps_the_ar_distribution(small_vocab_model, draft_vocab):
    """With a draft vocabulary the drafter's q is zero outside it (9 and 7 are never drafted): the
    acceptance rule must still give `ar`'s distribution."""
    model = copy.deepcopy(small_vocab_model)
    model.set_draft_vocab(draft_vocab)
    ids = torch.tensor([[0, 5, 6, 7, 8, 2]])
    n, steps = 6000, 3
    exact = _exact_marginals(model, ids, steps)
    kw = dict(input_ids=ids.expand(n, -1), max_new_tokens=steps + 1, do_sample=True, seed=11,
              return_dict_in_generate=True)

    def tv(out) -> float:
        emp = [torch.bincount(out.sequences[:, t + 1], minlength=10).float() / n for t in range(steps)]
        return max(0.5 * float((e - x).abs().sum()) for e, x in zip(emp, exact, strict=True))

    ar, hybrid = generate(model, mode="ar", **kw), generate(model, mode="hybrid", min_accept_prob=0.0, **kw)
    trusted = generate(model, mode="hybrid_fast", nar_threshold=0.0, **kw)  # drafts unverified: biased
    assert sum(s.nar_tokens for s in hybrid.stats) > n // 4  # the rule accepted many drafts
    assert tv(ar) < 0.04  # sampling noise at n = 6000 is about 0.02
    assert tv(hybrid) < 0.04
    assert tv(trusted) > 0.1  # the check can fail: skipping the acceptance rule is caught
