"""`yue2 convert-bart` imports a complete BART or refuses it in one line, writing nothing.

Each refusal starts from one tiny BART directory that converts (weights and tokenizer as
save_pretrained writes them) and breaks exactly one thing about a copy of it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken
from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration, BartModel, BartTokenizer

from tests.tiny_models import BART_SHAPE, ROOT
from yue2_jobs.cli import main as cli_main
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.errors import CheckpointError, PickleWeightsRefusedError
from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.model.convert import convert_bart_checkpoint
from yue2_jobs.model.tokenizer import train_tokenizer

TEXTS = ["the court held that the contract was void", "a storm closed the harbour for two days",
         "the council approved the new budget on tuesday", "shares fell after the company cut its forecast"]


@pytest.fixture(scope="module")
def bart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny tied BART (BART's special ids: <s>=0, <pad>=1, </s>=2) and a 300-token tokenizer beside it."""
    path = tmp_path_factory.mktemp("bart") / "bart"
    torch.manual_seed(3)
    bart = BartForConditionalGeneration(BartConfig(**BART_SHAPE)).eval()
    with torch.no_grad():
        bart.final_logits_bias.normal_(0, 1.0)  # a non-zero buffer, so the logits check covers it
    bart.save_pretrained(path)
    train_tokenizer(TEXTS * 10, vocab_size=300, model_max_length=128).save_pretrained(path)
    return path


def _cnn_like(path: Path, bart_dir: Path, moved: dict[str, int] | None = None) -> Path:
    """A tiny BART laid out like facebook/bart-large-cnn: an embedding row for each of `bart_dir`'s 300
    tokens, and BART's own tokenizer class (config.json's model_type picks it: no tokenizer_config.json)
    whose vocabulary also holds `<mask>`, at id 300 == vocab_size. `moved`: tokens given other ids."""
    model = json.loads((bart_dir / "tokenizer.json").read_text())["model"]
    vocab = {**model["vocab"], "<mask>": len(model["vocab"]), **(moved or {})}
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    torch.manual_seed(5)
    BartForConditionalGeneration(BartConfig(**{**BART_SHAPE, "vocab_size": len(vocab) - 1})).save_pretrained(path)
    mask = AddedToken("<mask>", lstrip=True, special=True)  # as bart-large-cnn's tokenizer.json has it
    BartTokenizer(vocab=vocab, merges=merges, mask_token=mask).save_pretrained(path)
    (path / "tokenizer_config.json").unlink()
    return path


@pytest.fixture(scope="module")
def cnn_like_dir(bart_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _cnn_like(tmp_path_factory.mktemp("cnn") / "bart", bart_dir)


@pytest.fixture
def src(bart_dir: Path, tmp_path: Path) -> Path:
    """A copy of `bart_dir` for one test to break."""
    return Path(shutil.copytree(bart_dir, tmp_path / "src"))


def _refused(src: Path, tmp_path: Path, error: type[CheckpointError] = CheckpointError) -> str:
    """The one-line message `convert_bart_checkpoint` refuses `src` with; nothing is written."""
    dst = tmp_path / "out"
    with pytest.raises(error) as caught:
        convert_bart_checkpoint(src, dst)
    message = str(caught.value)
    assert "\n" not in message
    assert not dst.exists()
    return message


def _rewrite_weights(src: Path, change) -> None:
    tensors = load_file(src / "model.safetensors")
    change(tensors)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})


def test_a_complete_bart_converts_with_its_tokenizer_and_its_logits(bart_dir, bart_batch, tmp_path, capfd):
    dst = tmp_path / "yue2"
    assert cli_main(["convert-bart", str(bart_dir), str(dst)]) == 0
    out, err = capfd.readouterr()
    saved = len(load_file(bart_dir / "model.safetensors"))  # tied: every tensor the directory holds is used
    assert out == (f"wrote {dst}: encoder and AR decoder from {bart_dir} ({saved} weights); the draft branch is "
                   f"untrained (NAR layers copied from the AR top layers, slot embeddings and confidence head "
                   f"fresh): train it with `yue2 train-drafter`\n")
    assert err == ""  # transformers' progress bars and warnings stay quiet
    model, tokenizer = load_checkpoint(dst)
    assert len(tokenizer) < 512 and tokenizer.eos_token_id == model.config.eos_token_id == 2
    bart = BartForConditionalGeneration.from_pretrained(bart_dir).eval()
    ids, mask = bart_batch
    dec = torch.randint(4, 512, (ids.shape[0], 7), generator=torch.Generator().manual_seed(5))
    dec[:, 0] = bart.config.decoder_start_token_id
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits,
                                   bart(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits,
                                   atol=1e-4, rtol=0)


def test_a_tied_bart_model_without_its_head_converts(bart_dir, tmp_path):
    """`BartModel`'s weights lack `lm_head`, which a tied config derives from the shared embedding."""
    src = tmp_path / "src"
    BartModel(BartConfig(**BART_SHAPE)).save_pretrained(src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(bart_dir / name, src / name)
    assert convert_bart_checkpoint(src, tmp_path / "out").out == tmp_path / "out"


def test_an_untied_bart_model_is_refused_for_its_missing_head(bart_dir, tmp_path):
    src = tmp_path / "src"
    BartModel(BartConfig(**BART_SHAPE, tie_word_embeddings=False)).save_pretrained(src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(bart_dir / name, src / name)
    assert _refused(src, tmp_path) == (
        f"the weights in {src} do not match its config.json: 1 missing (lm_head.weight); convert-bart imports complete "
        f"BART weights only, nothing left to random initialisation")


def test_a_yue2_checkpoint_is_refused_naming_its_model_type(tmp_path):
    src = Path(shutil.copytree(ROOT / "checkpoints" / "base", tmp_path / "base"))
    assert _refused(src, tmp_path) == (
        f"{src / 'config.json'} says model_type 'yue2' (Yue2ForConditionalGeneration); convert-bart expects a BART "
        f"seq2seq model (model_type 'bart', BartForConditionalGeneration)")


def test_a_bart_for_another_task_is_refused(src, tmp_path):
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "architectures": ["BartForSequenceClassification"]}))
    assert "says model_type 'bart' (BartForSequenceClassification); convert-bart expects" in _refused(src, tmp_path)


def test_a_directory_without_config_is_refused(src, tmp_path):
    (src / "config.json").unlink()
    assert _refused(src, tmp_path) == (
        f"{src} has no config.json; convert-bart expects a BART seq2seq model (model_type 'bart', "
        f"BartForConditionalGeneration) saved with save_pretrained")


def test_a_deleted_weight_is_refused_by_name(src, tmp_path):
    _rewrite_weights(src, lambda t: t.pop("model.encoder.layers.1.fc2.weight"))
    assert ": 1 missing (model.encoder.layers.1.fc2.weight); convert-bart imports complete BART weights only" in (
        _refused(src, tmp_path))


def test_extra_weights_are_refused_with_their_count(src, tmp_path):
    def add(tensors: dict[str, torch.Tensor]) -> None:
        for i in range(5):
            tensors[f"model.encoder.adapters.{i}.weight"] = torch.zeros(4)

    _rewrite_weights(src, add)
    message = _refused(src, tmp_path)
    assert message.startswith(f"the weights in {src} do not match its config.json: 5 unexpected (model.encoder."
                              f"adapters.0.weight, model.encoder.adapters.1.weight, model.encoder.adapters.2.weight "
                              f"and 2 more)")


def test_a_weight_of_the_wrong_shape_is_refused_with_both_shapes(src, tmp_path):
    _rewrite_weights(src, lambda t: t.update({"model.decoder.layers.0.fc1.weight": torch.zeros(100, 64)}))
    assert ("1 of the wrong shape (model.decoder.layers.0.fc1.weight is [100, 64], not [128, 64])"
            in _refused(src, tmp_path))


def test_pickle_weights_are_refused(src, tmp_path):
    torch.save(load_file(src / "model.safetensors"), src / "pytorch_model.bin")
    (src / "model.safetensors").unlink()
    assert _refused(src, tmp_path, PickleWeightsRefusedError) == (
        f"{src} holds its weights only as pickle (pytorch_model.bin), which can run code when loaded; convert-bart "
        f"reads model.safetensors (re-save the model with save_pretrained, which writes it)")


def test_a_bart_without_a_tokenizer_is_refused(src, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (src / name).unlink()
    assert _refused(src, tmp_path) == (
        f"{src} has no tokenizer: convert-bart needs tokenizer.json, or vocab.json and merges.txt, saved beside the "
        f"model by the tokenizer's save_pretrained")


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(src, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):  # shipped base's: 4,096 tokens
        shutil.copy(ROOT / "checkpoints" / "base" / name, src / name)
    message = _refused(src, tmp_path)
    assert message.startswith(f"the tokenizer in {src} has 4096 tokens but config.json's vocab_size is 512: ids 512 "
                              f"and up (")
    assert message.endswith(" and 3581 more) have no embedding row")


def test_an_unused_special_token_past_the_vocabulary_is_dropped_from_the_written_tokenizer(cnn_like_dir, tmp_path,
                                                                                           capfd):
    """bart-large-cnn's tokenizer has 50265 tokens for 50264 embedding rows: `<mask>`, which summarisation
    never uses, converts out of the tokenizer; its literal text then encodes as ordinary text."""
    source, dst = AutoTokenizer.from_pretrained(cnn_like_dir), tmp_path / "yue2"
    assert (len(source), source.convert_tokens_to_ids("<mask>")) == (301, 300)
    assert cli_main(["convert-bart", str(cnn_like_dir), str(dst)]) == 0
    out = capfd.readouterr().out
    assert out.startswith(f"wrote {dst}: encoder and AR decoder from {cnn_like_dir} (")
    assert (" weights); dropped the tokenizer's <mask> (id 300): the model has no embedding row for it; the draft "
            "branch is untrained (") in out
    _, tokenizer = load_checkpoint(dst)  # the manifest, written after the edit, verifies
    assert len(tokenizer) == 300 and "<mask>" not in tokenizer.get_vocab() and tokenizer.mask_token is None
    ids = tokenizer("a <mask> b").input_ids
    assert max(ids) < 300 and len(ids) > len(tokenizer("a b").input_ids) + 1  # "<mask>" as several plain tokens
    assert tokenizer(TEXTS).input_ids == source(TEXTS).input_ids  # nothing else changed
    session = DecodeSession.load(dst, device="cpu", dtype="float32")
    assert len(session.summarize(["a <mask> b"])) == 1


def test_a_plain_token_past_the_vocabulary_is_still_refused(cnn_like_dir, tmp_path):
    src = Path(shutil.copytree(cnn_like_dir, tmp_path / "src"))
    tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.add_tokens(["zebra"])  # not special: text holding it would encode to id 301
    tokenizer.save_pretrained(src)
    assert _refused(src, tmp_path) == (f"the tokenizer in {src} has 302 tokens but config.json's vocab_size is 300: "
                                       f"ids 300 and up ('<mask>', 'zebra') have no embedding row")


def test_unk_past_the_vocabulary_is_still_refused(bart_dir, tmp_path):
    """A special token that summarisation does use (here unk, swapped with <mask>) is never dropped."""
    src = _cnn_like(tmp_path / "src", bart_dir, moved={"<mask>": 3, "<unk>": 300})
    assert _refused(src, tmp_path) == (f"the tokenizer in {src} has 301 tokens but config.json's vocab_size is 300: "
                                       f"ids 300 and up ('<unk>') have no embedding row")


def test_a_tokenizer_that_does_not_load_is_refused_in_one_line(src, tmp_path):
    (src / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    assert _refused(src, tmp_path).startswith(f"cannot load the tokenizer in {src} (tokenizer.json): ")


def test_a_tokenizer_whose_eos_disagrees_with_the_config_is_refused(src, tmp_path):
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "eos_token_id": 7}))
    assert _refused(src, tmp_path) == (f"the tokenizer in {src} has eos id 2 ('</s>') but config.json's eos_token_id "
                                       f"is 7")


def test_a_non_empty_destination_is_refused(bart_dir, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists and is not an empty directory"):
        convert_bart_checkpoint(bart_dir, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]


def test_the_command_refuses_a_yue2_checkpoint_in_one_line(tmp_path):
    src = Path(shutil.copytree(ROOT / "checkpoints" / "base", tmp_path / "base"))
    done = subprocess.run([sys.executable, "-m", "yue2_jobs", "convert-bart", str(src), str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"yue2: error: {src / 'config.json'} says model_type 'yue2' (Yue2ForConditionalGeneration); convert-bart "
        f"expects a BART seq2seq model (model_type 'bart', BartForConditionalGeneration)"]
    assert not (tmp_path / "out").exists()
