"""The shipped `base` and `legal` checkpoints: size, loading, and the domain claim."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from tests.tiny_models import ROOT
from yue2_jobs.cli import main as cli_main
from yue2_jobs.model import Yue2ForConditionalGeneration
from yue2_jobs.model.checkpoint import load_checkpoint, verify_checkpoint_dir
from yue2_jobs.training.batches import encode_pairs
from yue2_jobs.training.data import read_split
from yue2_jobs.training.evaluate import evaluate_checkpoint, lead_baseline
from yue2_jobs.training.losses import input_dependence
from yue2_jobs.training.train import TrainArgs

pytestmark = pytest.mark.slow  # both shipped checkpoints on their eval sets: long model work

CHECKPOINTS = ("base", "legal")
EVAL_ROWS = 120


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_checkpoint_is_small_verified_and_loads(name):
    path = ROOT / "checkpoints" / name
    files = verify_checkpoint_dir(path)
    assert sum(int(f["size"]) for f in files.values()) <= 15 * 1024 * 1024
    model = AutoModelForSeq2SeqLM.from_pretrained(path)
    assert isinstance(model, Yue2ForConditionalGeneration)


@pytest.fixture(scope="module")
def scores():
    return {(ckpt, corpus): evaluate_checkpoint(ROOT / "checkpoints" / ckpt, data_dir=ROOT / "data", corpus=corpus,
                                                limit=EVAL_ROWS)
            for ckpt in CHECKPOINTS for corpus in ("general", "legal")}


def test_each_variant_wins_on_its_own_domain(scores):
    assert scores["legal", "legal"].rougeL > scores["base", "legal"].rougeL
    assert scores["base", "general"].rougeL > scores["legal", "general"].rougeL


def test_base_beats_copying_the_first_sentence_and_does_not_loop(scores):
    """Issue 16's bar, on the first EVAL_ROWS rows (`make eval` has the full sets)."""
    lead = lead_baseline(data_dir=ROOT / "data", corpus="general", limit=EVAL_ROWS)
    assert scores["base", "general"].rougeL >= lead.rougeL + 0.03
    assert scores["base", "general"].degenerate <= 0.03
    assert scores["legal", "legal"].rougeL >= 0.45


@pytest.mark.parametrize(("name", "corpus", "min_distinct"), [("base", "general", 0.8), ("legal", "legal", 0.15)])
def test_each_variant_reads_its_input(scores, name, corpus, min_distinct):
    """Guards against the collapse earlier checkpoints had: one memorised answer for every input."""
    model, tokenizer = load_checkpoint(ROOT / "checkpoints" / name)
    rows = read_split(ROOT / "data", corpus, "eval")[:EVAL_ROWS]
    limits = TrainArgs(data="", corpus=corpus, out="").token_limits  # the limits training uses
    true_loss, swapped_loss = input_dependence(model, encode_pairs(tokenizer, rows, **limits), torch.device("cpu"))
    assert swapped_loss > true_loss + 0.05
    assert scores[name, corpus].distinct >= min_distinct


def test_eval_command_prints_the_table(capsys):
    assert cli_main(["eval", str(ROOT / "checkpoints" / "base"), "--set", "legal", "--limit", "4"]) == 0
    out = capsys.readouterr().out
    assert "ROUGE-1" in out and "ROUGE-L" in out and "legal" in out and "degenerate" in out
    assert "lead-1" in out


def test_missing_checkpoint_is_a_clear_command_error(tmp_path, capsys):
    assert cli_main(["summarize", str(tmp_path / "absent"), "text"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_summarize_command(capsys):
    text = "The licensee may copy and distribute the software provided this notice is kept intact."
    assert cli_main(["summarize", str(ROOT / "checkpoints" / "legal"), text]) == 0
    assert '"summary":' in capsys.readouterr().out
