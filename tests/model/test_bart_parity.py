"""Correctness anchor: converted BART == Hugging Face BART, logits and greedy tokens."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models
from transformers import AutoModelForSeq2SeqLM, BartForConditionalGeneration, PreTrainedTokenizerFast

from tests.tiny_models import MAX_NEW, generate
from yue2_jobs.cli import main as cli_main
from yue2_jobs.model import Yue2ForConditionalGeneration
from yue2_jobs.model.convert import bart_from_yue2, yue2_from_bart


def _hf_greedy(bart: BartForConditionalGeneration, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return bart.generate(input_ids=ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW)


def _word_tokenizer(vocab_size: int, eos_id: int) -> PreTrainedTokenizerFast:
    """A tokenizer of exactly `vocab_size` words whose special ids are the BART's own (its EOS is the token
    `varied_bart` declares, not 2): convert-bart refuses a BART saved without one."""
    names = ["<s>", "<pad>", "<x2>", "<unk>"] + [f"t{i}" for i in range(4, vocab_size)]
    names[eos_id] = "</s>"
    backend = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def test_fixture_batch_ends_rows_at_different_steps(varied_bart, bart_batch):
    seqs = _hf_greedy(varied_bart, *bart_batch)
    eos, pad = varied_bart.config.eos_token_id, varied_bart.config.pad_token_id
    ended_early = [(row[1:-1] == eos).any().item() for row in seqs]
    assert any(ended_early) and not all(ended_early)
    assert (seqs == pad).any()  # finished rows are padded


def test_logits_allclose(varied_bart, bart_batch):
    ids, mask = bart_batch
    ours = yue2_from_bart(varied_bart)
    dec = torch.randint(4, 512, (ids.shape[0], 11), generator=torch.Generator().manual_seed(2))
    dec[:, 0] = varied_bart.config.decoder_start_token_id
    with torch.no_grad():
        expected = varied_bart(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        got = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_greedy_tokens_identical(varied_bart, bart_batch):
    ids, mask = bart_batch
    expected = _hf_greedy(varied_bart, ids, mask)
    got = generate(yue2_from_bart(varied_bart), input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW)
    assert torch.equal(got, expected)


def test_each_row_alone_matches_the_batch(varied_bart, bart_batch):
    ids, mask = bart_batch
    ours = yue2_from_bart(varied_bart)
    batched = generate(ours, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW)
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        alone = generate(ours, input_ids=ids[i : i + 1, :n], max_new_tokens=MAX_NEW)[0]
        assert torch.equal(alone, batched[i, : alone.shape[0]])
        assert (batched[i, alone.shape[0] :] == ours.config.pad_token_id).all()


def test_convert_bart_command_round_trips_through_auto_classes(varied_bart, bart_batch, tmp_path):
    src, dst = tmp_path / "bart", tmp_path / "yue2"
    varied_bart.save_pretrained(src)
    _word_tokenizer(varied_bart.config.vocab_size, varied_bart.config.eos_token_id).save_pretrained(src)
    assert cli_main(["convert-bart", str(src), str(dst)]) == 0
    loaded = AutoModelForSeq2SeqLM.from_pretrained(dst)
    assert isinstance(loaded, Yue2ForConditionalGeneration)
    ids, mask = bart_batch
    assert torch.equal(generate(loaded, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW),
                       _hf_greedy(varied_bart, ids, mask))


def test_export_to_bart_is_the_inverse(varied_bart):
    back = bart_from_yue2(yue2_from_bart(varied_bart)).state_dict()
    for name, tensor in varied_bart.state_dict().items():
        assert torch.equal(back[name], tensor), name


def test_scaled_embeddings_and_forced_bos_match_hf(bart_batch):
    """bart-large-cnn style: sqrt(d_model) embedding scale and BOS forced as the first token."""
    from transformers import BartConfig

    from tests.tiny_models import BART_SHAPE

    torch.manual_seed(4)
    bart = BartForConditionalGeneration(BartConfig(**{**BART_SHAPE, "init_std": 0.05}, scale_embedding=True)).eval()
    with torch.no_grad():
        bart.final_logits_bias.normal_(0, 1.0)
    bart.generation_config.forced_bos_token_id = 0
    ids, mask = bart_batch
    ours = yue2_from_bart(bart)
    dec = torch.full((ids.shape[0], 5), 7)
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits,
                                   bart(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits,
                                   atol=1e-4, rtol=0)
    expected = _hf_greedy(bart, ids, mask)
    assert (expected[:, 1] == 0).all()
    assert torch.equal(generate(ours, input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW), expected)


def test_convert_bart_command_names_a_missing_source(tmp_path, capsys):
    assert cli_main(["convert-bart", str(tmp_path / "absent"), str(tmp_path / "out")]) == 2
    assert "absent" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
