"""Checkpoint directories: Auto-class round trip, manifest verification (in `load_checkpoint`; the
model file knows nothing of manifests), pickle refusal."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

from tests.tiny_models import generate, varied_inputs
from yue2_jobs.errors import CheckpointCorruptError, CheckpointFileMissingError, PickleWeightsRefusedError
from yue2_jobs.model import Yue2Config, Yue2ForConditionalGeneration
from yue2_jobs.model.checkpoint import MANIFEST, load_checkpoint, save_checkpoint
from yue2_jobs.model.tokenizer import train_tokenizer


@pytest.fixture()
def checkpoint(tiny_yue2, tmp_path):
    tokenizer = train_tokenizer(["a small corpus", "摘要 and 🎉 text"] * 20, vocab_size=300, model_max_length=64)
    return save_checkpoint(tiny_yue2, tokenizer, tmp_path / "ckpt")


def test_round_trip_through_auto_classes(tiny_yue2, checkpoint):
    assert isinstance(AutoConfig.from_pretrained(checkpoint), Yue2Config)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    assert isinstance(loaded, Yue2ForConditionalGeneration)
    for name, tensor in tiny_yue2.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    ids, mask = varied_inputs(vocab=300, lengths=[7, 3])
    assert torch.equal(generate(loaded, input_ids=ids, attention_mask=mask, max_new_tokens=8),
                       generate(tiny_yue2, input_ids=ids, attention_mask=mask, max_new_tokens=8))
    assert AutoTokenizer.from_pretrained(checkpoint).decode([5, 6]) is not None


def test_manifest_lists_every_file_and_is_written_last(checkpoint):
    files = json.loads((checkpoint / MANIFEST).read_text())["files"]
    on_disk = {p.name for p in checkpoint.iterdir() if p.name != MANIFEST}
    assert set(files) == on_disk
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= on_disk
    newest = max(checkpoint.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert newest.name == MANIFEST


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_tampered_file_is_rejected_by_name(checkpoint, name):
    path = checkpoint / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match=name.replace(".", r"\.")):
        load_checkpoint(checkpoint)


def test_edited_config_is_rejected(checkpoint):
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    config["dropout"] = 0.5  # still valid JSON, so only the manifest can tell
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointCorruptError, match=r"config\.json"):
        load_checkpoint(checkpoint)


def test_unparseable_config_names_the_file(checkpoint):
    (checkpoint / "config.json").write_text("{ not json")
    with pytest.raises(OSError, match=r"config\.json"):
        AutoModelForSeq2SeqLM.from_pretrained(checkpoint)  # past the manifest check, transformers names it too


def test_truncated_weights_are_rejected(checkpoint):
    path = checkpoint / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointCorruptError, match=r"model\.safetensors"):
        load_checkpoint(checkpoint)


@pytest.mark.parametrize("name", ["tokenizer.json", "model.safetensors", MANIFEST])
def test_missing_file_is_named(checkpoint, name):
    (checkpoint / name).unlink()
    with pytest.raises(CheckpointFileMissingError, match=name.replace(".", r"\.")):
        load_checkpoint(checkpoint)


def test_unlisted_weights_are_rejected(checkpoint):
    (checkpoint / "model-extra.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointCorruptError, match=r"model-extra\.safetensors"):
        load_checkpoint(checkpoint)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "weights.pt"])
def test_pickle_weights_are_refused(checkpoint, tiny_yue2, name, monkeypatch):
    torch.save(tiny_yue2.state_dict(), checkpoint / name)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("pickle file was unpickled"))
    with pytest.raises(PickleWeightsRefusedError, match=name.replace(".", r"\.")):
        load_checkpoint(checkpoint)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointFileMissingError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")


def test_a_load_hashes_each_file_once(checkpoint, monkeypatch):
    from yue2_jobs.model import checkpoint as ckpt_module

    hashed: list[str] = []
    real = ckpt_module._sha256
    monkeypatch.setattr(ckpt_module, "_sha256", lambda path: hashed.append(path.name) or real(path))
    loaded = ckpt_module.load_verified(checkpoint)
    assert sorted(hashed) == sorted(p.name for p in checkpoint.iterdir() if p.name != MANIFEST)
    assert loaded.weights_sha256 == json.loads((checkpoint / MANIFEST).read_text())["files"]["model.safetensors"][
        "sha256"]
