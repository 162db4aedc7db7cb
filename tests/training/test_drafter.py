"""`yue2 train-drafter`: a drafter for any checkpoint from unlabelled inputs, the AR weights untouched
(checked on the written file and said in the manifest), resumable after a kill at any point."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.tiny_models import ROOT
from yue2_jobs.errors import DataError
from yue2_jobs.model.checkpoint import load_checkpoint, load_verified, read_manifest_notes, save_checkpoint
from yue2_jobs.model.convert import bart_from_yue2, yue2_from_bart
from yue2_jobs.model.modeling_yue2 import is_drafter_key
from yue2_jobs.training.data import read_split
from yue2_jobs.training.drafter import DrafterArgs, ar_fingerprint, train_drafter
from yue2_jobs.training.inputs import read_input_file

N_TEXTS = 40


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shipped base's AR path exported to BART and imported again, as `yue2 convert-bart` imports a
    user's BART: a real summariser whose drafter starts from its AR branch, untrained."""
    base, tokenizer = load_checkpoint(ROOT / "checkpoints" / "base")
    model = yue2_from_bart(bart_from_yue2(base))
    model.generation_config.no_repeat_ngram_size = 3  # base's repetition controls, which BART's config drops
    model.generation_config.repetition_penalty = 1.3
    return save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("conv") / "converted")


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "texts.jsonl"
    rows = read_split(ROOT / "data", "general", "eval")[:N_TEXTS]
    path.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in rows))
    return path


def _args(checkpoint: Path, out: Path, inputs: Path, **kw: object) -> DrafterArgs:
    fields: dict[str, object] = dict(steps=6, confidence_steps=2, batch_size=8, warmup=2, eval_rows=8, threads=1,
                                     max_source_tokens=96, max_new_tokens=24, save_every=100)
    return DrafterArgs(checkpoint=str(checkpoint), out=str(out), inputs=str(inputs), **{**fields, **kw})


def _drafter(path: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(path / "model.safetensors").items() if is_drafter_key(k)}


def test_the_ar_weights_stay_byte_identical_and_the_manifest_says_so(converted, texts_file, tmp_path, capsys):
    out = train_drafter(_args(converted, tmp_path / "drafted", texts_file))
    printed = capsys.readouterr().out
    assert out == tmp_path / "drafted"
    assert "the drafter before:" in printed and "the drafter after:" in printed and "live tau" in printed
    loaded = load_verified(out)  # a checkpoint like any other: publish and the watchdog take it
    before, after = load_file(converted / "model.safetensors"), load_file(out / "model.safetensors")
    assert {k for k in before if not is_drafter_key(k)} == {k for k in after if not is_drafter_key(k)}
    for name in before:
        if not is_drafter_key(name):
            assert torch.equal(before[name], after[name]), name
    changed = [k for k in after if is_drafter_key(k) and (k not in before or not torch.equal(before[k], after[k]))]
    assert any(k.startswith("nar_layers.") for k in changed) and any(k.startswith("confidence_head.") for k in changed)
    notes = read_manifest_notes(out)["drafter"]
    assert isinstance(notes, dict)
    assert notes["ar_weights_identical"] is True and notes["ar_weights_sha256"] == ar_fingerprint(before)
    assert notes["inputs"]["count"] == N_TEXTS and notes["inputs"]["held_out"] == 8
    assert set(notes["before"]) >= {"teacher_forced_tau", "live_tau"} and notes["after"]["live_tau"] >= 1.0
    assert loaded.model.config.draft_vocab_size == int(after["draft_vocab"].numel()) > 0
    # The new drafter changes speed, never output: hybrid equals ar on inputs it never saw.
    from yue2_jobs.decode.session import DecodeSession

    session = DecodeSession(loaded.model, tokenizer=loaded.tokenizer)
    texts = [r["text"] for r in read_split(ROOT / "data", "general", "eval")[N_TEXTS : N_TEXTS + 12]]
    assert session.summarize(texts, session_params("hybrid")) == session.summarize(texts, session_params("ar"))


def session_params(mode: str):
    from yue2_jobs.decode.params import DecodingParams

    return DecodingParams(mode=mode, max_new_tokens=24)  # type: ignore[arg-type]


def test_a_run_killed_anywhere_resumes_to_the_same_drafter(converted, texts_file, tmp_path):
    straight = train_drafter(_args(converted, tmp_path / "a", texts_file))
    out = tmp_path / "b"
    assert train_drafter(_args(converted, out, texts_file, stop_after=4)) is None  # mid NAR stage
    state = tmp_path / "b.train-state"
    # A kill while the targets were being decoded: half the cache left, its last line cut short.
    lines = (state / "targets.jsonl").read_text().splitlines()
    (state / "targets.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n" + lines[-1][:7])
    assert train_drafter(_args(converted, out, texts_file, stop_after=3)) is None  # past the NAR/confidence edge
    assert train_drafter(_args(converted, out, texts_file)) == out
    a, b = _drafter(straight), _drafter(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not state.exists()
    with pytest.raises(DataError, match="exists"):
        train_drafter(_args(converted, out, texts_file))


def test_a_resume_with_other_inputs_is_refused(converted, texts_file, tmp_path, monkeypatch):
    out = tmp_path / "c"
    assert train_drafter(_args(converted, out, texts_file, stop_after=1)) is None
    other = tmp_path / "other.jsonl"
    other.write_text(texts_file.read_text().replace("a", "e", 1))
    with pytest.raises(DataError, match="other arguments or inputs"):
        train_drafter(_args(converted, out, other))
    # Killed while its targets were still being decoded: the cache is never read by another run.
    from yue2_jobs.training import drafter

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(drafter, "distilled_pairs", killed)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(_args(converted, tmp_path / "d", texts_file))
    monkeypatch.undo()
    with pytest.raises(DataError, match="other arguments or inputs"):
        train_drafter(_args(converted, tmp_path / "d", other))


def test_before_is_the_checkpoints_own_drafter_even_when_restarted(converted, texts_file, tmp_path):
    kept = train_drafter(_args(converted, tmp_path / "kept", texts_file, steps=1, confidence_steps=0))
    fresh = train_drafter(_args(converted, tmp_path / "fresh", texts_file, steps=1, confidence_steps=0,
                                nar_layers=2))
    assert read_manifest_notes(kept)["drafter"]["before"] == read_manifest_notes(fresh)["drafter"]["before"]


def test_every_input_shape_a_user_has_is_read(tmp_path):
    lines = [{"text": "a corpus row", "summary": "ignored"}, {"input": "a job body"},
             {"custom_id": "x", "method": "POST", "url": "/v1/summarize", "body": {"input": "a batch line"}},
             {"custom_id": "y", "body": {"prompt": "a generate line"}}]
    plain = tmp_path / "in.jsonl"
    plain.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    packed = tmp_path / "in.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    expected = ["a corpus row", "a job body", "a batch line", "a generate line"]
    assert read_input_file(plain) == read_input_file(packed) == expected


@pytest.mark.parametrize(("content", "message"), [
    ('{"text": "fine"}\n{"text": "also fine"\n', "in.jsonl line 2 is not JSON"),
    ('{"text": "fine"}\n{"summary": "no input"}\n', "in.jsonl line 2 has no input text"),
    ('{"text": "fine"}\n{"text": "  "}\n', "in.jsonl line 2: the input text is empty"),
    ("\n\n", "holds no inputs"),
])
def test_an_unusable_line_is_named(tmp_path, content, message):
    path = tmp_path / "in.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        read_input_file(path)


def test_the_command_names_its_inputs_problems(converted, texts_file, tmp_path, capsys):
    from yue2_jobs.cli import main as cli_main

    out = str(tmp_path / "x")
    assert cli_main(["train-drafter", str(converted), "--out", out]) == 2
    assert "--inputs FILE or --batch BATCH_ID" in capsys.readouterr().err
    assert cli_main(["train-drafter", str(converted), "--out", out, "--inputs", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(DataError, match="exactly one of them"):
        train_drafter(_args(converted, tmp_path / "y", texts_file), texts=["a text", "another"])


def test_a_drafter_of_another_shape_starts_from_the_ar_branch(converted, texts_file, tmp_path):
    out = train_drafter(_args(converted, tmp_path / "wide", texts_file, nar_layers=2, block_size=2, steps=2))
    model, _ = load_checkpoint(out)
    assert (model.config.nar_layers, model.config.nar_block_size) == (2, 2)
    before, after = load_file(converted / "model.safetensors"), load_file(out / "model.safetensors")
    assert ar_fingerprint(before) == ar_fingerprint(after)
    notes = read_manifest_notes(out)["drafter"]
    assert isinstance(notes, dict) and notes["fresh"] is True and notes["nar_layers"] == 2


def test_the_command_trains_on_a_finished_batchs_inputs(converted, tmp_path, monkeypatch, capsys):
    """`--batch BATCH_ID`: the pipeline's own traffic, read back from its storage (the embedded
    settings here: SQLite and a local directory under YUE2_HOME)."""
    from sqlalchemy import update

    from yue2_jobs.cli import main as cli_main
    from yue2_jobs.core.config import Settings
    from yue2_jobs.db.migrate import upgrade_head
    from yue2_jobs.db.models import Batch, BatchStatus
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.jobs import files, service
    from yue2_jobs.storage import storage_from_url

    for name in [k for k in os.environ if k.startswith("YUE2_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("YUE2_HOME", str(tmp_path / "home"))
    settings = Settings()
    upgrade_head(settings.resolved_database_url)
    storage = storage_from_url(settings.resolved_storage_url)
    rows = read_split(ROOT / "data", "general", "eval")[:20]
    data = "".join(json.dumps({"custom_id": r["id"], "method": "POST", "url": "/v1/summarize",
                               "body": {"input": r["text"]}}) + "\n" for r in rows)
    with session_factory(settings.resolved_database_url)() as session:
        file = files.create_file(session, tenant="t", filename="in.jsonl", purpose="batch", data=data.encode(),
                                 storage=storage)
        batch, _ = service.create_batch(session, tenant="t", input_file_id=file.id, endpoint="/v1/summarize",
                                        completion_window="24h", metadata=None, settings=settings, storage=storage)
        session.execute(update(Batch).where(Batch.id == batch.id).values(status=BatchStatus.COMPLETED))
        session.commit()
    out = tmp_path / "from-batch"
    argv = ["train-drafter", str(converted), "--out", str(out), "--batch", batch.id, "--steps", "2",
            "--confidence-steps", "1", "--batch-size", "4", "--max-new-tokens", "12", "--threads", "1"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    notes = read_manifest_notes(out)["drafter"]
    assert isinstance(notes, dict) and notes["inputs"]["source"] == f"batch {batch.id}"
    assert notes["inputs"]["count"] == 20 and notes["inputs"]["held_out"] == 4
