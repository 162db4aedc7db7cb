"""Sentence splitting (lead-1, chunking) and the degenerate-output rule of `yue2 eval`."""

from __future__ import annotations

import pytest

from yue2_jobs.rouge import rouge
from yue2_jobs.sentences import is_degenerate, lead, split_sentences


def test_split_keeps_abbreviations_and_initials_inside_sentences():
    text = ('0 A.D. (pronounced "zero ey-dee") is a game, e.g. of war. It runs on Linux, Mac OS X etc. '
            "and Windows! Does it? Yes: version 2.5 is out.")
    assert split_sentences(text) == ['0 A.D. (pronounced "zero ey-dee") is a game, e.g. of war.',
                                     "It runs on Linux, Mac OS X etc. and Windows!", "Does it?",
                                     "Yes: version 2.5 is out."]


def test_split_handles_cjk_and_text_without_boundaries():
    assert split_sentences("今天天气很好。我们去公园！好吗？") == ["今天天气很好。", "我们去公园！", "好吗？"]
    assert split_sentences("no full stop here") == ["no full stop here"]
    assert split_sentences("   ") == []


def test_lead_is_the_first_sentence():
    assert lead("First one. Second one.") == "First one."
    assert lead("First one. Second one. Third.", 2) == "First one. Second one."


@pytest.mark.parametrize(("output", "reference", "degenerate"), [
    ("Close the file file file to the file.", "Close the file and release its lock.", True),
    ("Return the Leeeevel Zero Swwwdetensors.", "Identify a file's codec.", True),
    ("Close the file and release its lock.", "Close the file and release its lock.", False),
    ("Read the file. The file is closed.", "x", False),  # repeated, not three times in a row
    ("Wait for www.example.com to answer", "Poll www.example.com until it answers", False),  # the reference has it
    ("Print ... then exit", "Print ... then exit", False),
])
def test_degenerate_rule(output, reference, degenerate):
    assert is_degenerate(output, reference) is degenerate


def test_rouge_reports_the_degenerate_share():
    result = rouge(["a a a", "fine output"], ["ref", "fine output"])
    assert result.degenerate == 0.5
