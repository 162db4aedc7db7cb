"""Training: all three stages run, seeded runs are identical, and resuming changes nothing."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.tiny_models import ROOT
from yue2_jobs.model.checkpoint import read_manifest_notes
from yue2_jobs.training.data import read_split, write_jsonl_gz
from yue2_jobs.training.train import TrainArgs, train


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    for split, n in (("train", 48), ("eval", 8)):
        write_jsonl_gz(root / "general" / f"{split}.jsonl.gz", read_split(ROOT / "data", "general", split)[:n])
    return root


def _args(small_data, out, **kw) -> TrainArgs:
    fields = dict(batch_size=4, denoise_steps=2, ar_steps=4, nar_steps=3, confidence_steps=2, warmup=2,
                  max_source_tokens=48, max_target_tokens=12, save_every=100, threads=1)
    return TrainArgs(data=str(small_data), corpus="general", out=str(out), **{**fields, **kw})


def _weights(path):
    return load_file(path / "model.safetensors")


def test_seeded_runs_are_identical_and_resume_is_exact(small_data, tmp_path, capsys):
    first = train(_args(small_data, tmp_path / "a"))
    second = train(_args(small_data, tmp_path / "b"))
    report = capsys.readouterr().out
    assert "ECE" in report and "p(accept) bin" in report
    wa, wb = _weights(first), _weights(second)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()
    assert json.loads((first / "tokenizer.json").read_text())["truncation"] is None

    # Stop mid-AR-stage, then past the AR/NAR boundary, then finish: same weights as the straight run.
    resumed = tmp_path / "c"
    assert train(_args(small_data, resumed, stop_after=4)) is None
    assert train(_args(small_data, resumed, stop_after=3)) is None
    assert (resumed.with_name("c.train-state") / "meta.json").is_file()
    assert train(_args(small_data, resumed)) == resumed
    wc = _weights(resumed)
    assert all(torch.equal(wa[k], wc[k]) for k in wa)
    assert not resumed.with_name("c.train-state").exists()


def test_stages_train_only_their_parts(small_data, tmp_path):
    base = train(_args(small_data, tmp_path / "base"))
    tuned = train(_args(small_data, tmp_path / "tuned", init=str(base), denoise_steps=0, ar_steps=0, nar_steps=0))
    before, after = _weights(base), _weights(tuned)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("confidence_head.") for k in changed)


def test_resume_refuses_other_arguments(small_data, tmp_path):
    out = tmp_path / "d"
    assert train(_args(small_data, out, stop_after=2)) is None
    with pytest.raises(SystemExit, match="other arguments"):
        train(_args(small_data, out, seed=1))


def test_train_command_stops_and_resumes(small_data, tmp_path, capsys):
    from yue2_jobs.cli import main as cli_main

    out = tmp_path / "cli"
    argv = ["train", "--data", str(small_data), "--corpus", "general", "--out", str(out), "--batch-size", "4",
            "--denoise-steps", "2", "--ar-steps", "2", "--nar-steps", "1", "--confidence-steps", "1",
            "--max-source-tokens", "32", "--max-target-tokens", "8", "--threads", "1"]
    assert cli_main([*argv, "--stop-after", "3"]) == 0
    assert "stopped after 3 steps" in capsys.readouterr().out
    assert not out.exists()
    assert cli_main(argv) == 0
    assert "resuming from" in capsys.readouterr().out
    assert (out / "manifest.json").is_file()
    assert read_manifest_notes(out) == {"domain": "general"}  # its corpus, for A/B reports' domain warnings


def test_batches_cover_each_epoch_once_and_group_similar_lengths():
    from yue2_jobs.training.batches import batch_for_step

    lengths = torch.randint(5, 200, (640,), generator=torch.Generator().manual_seed(0)).tolist()
    epoch = [batch_for_step(lengths, step, 8, seed=3) for step in range(80)]
    assert sorted(i for b in epoch for i in b) == list(range(640))
    assert epoch == [batch_for_step(lengths, step, 8, seed=3) for step in range(80)]  # a function of the step
    assert batch_for_step(lengths, 80, 8, seed=3) != epoch[0]  # the next epoch is another order
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in epoch) / len(epoch)
    assert spread < 0.2 * (max(lengths) - min(lengths))


def test_ar_batches_mix_in_denoising_at_the_given_share():
    from yue2_jobs.training.batches import mixed_batch

    pairs = [([i], [i]) for i in range(1000)]
    noisy = [([i], [-i]) for i in range(1000)]
    batch = mixed_batch(pairs, noisy, list(range(1000)), share=0.5, seed=0, step=7)
    assert batch == mixed_batch(pairs, noisy, list(range(1000)), share=0.5, seed=0, step=7)
    assert 400 < sum(b is noisy[i] for i, b in enumerate(batch)) < 600
    assert mixed_batch(pairs, noisy, list(range(10)), share=0.0, seed=0, step=7) == pairs[:10]
