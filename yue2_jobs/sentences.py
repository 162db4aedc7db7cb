"""Sentence boundaries and degenerate-output checks, shared by evaluation and long-input chunking.

No torch here: the API and the report code import it.
"""

from __future__ import annotations

import re

# A boundary: terminal punctuation (Latin or CJK), optional closing quotes or brackets, then
# whitespace before a capital, digit or opening quote, or the end. CJK full stops need no space.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])|(?<=[。！？])[」』）]*\s*")
# Words that end in a full stop without ending a sentence ("e.g. Foo", "A.D. 500", "Dr. Who").
_ABBREVIATION = re.compile(r"(?:\b(?:e\.g|i\.e|etc|vs|cf|approx|incl|no|nos|fig|eq|dr|mr|mrs|ms|st|jr|sr|"
                           r"inc|ltd|co|corp|resp|al|ca|viz)|\b[A-Za-z](?:\.[A-Za-z])*)\.[\"')\]]*$", re.IGNORECASE)
_REPEATED_WORD = re.compile(r"\b(\w+)(?:\W+\1\b){2,}", re.IGNORECASE)
_CHAR_RUN = re.compile(r"(\S)\1{2,}")


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, whitespace-trimmed; a text with no boundary is one sentence."""
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        piece = text[start : match.start()].rstrip()
        if _ABBREVIATION.search(piece):
            continue  # not a boundary: keep extending this sentence
        sentence = text[start : match.end()].strip()
        if sentence:
            sentences.append(sentence)
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def lead(text: str, n: int = 1) -> str:
    """The first `n` sentences of `text`: the lead-n baseline summariser."""
    return " ".join(split_sentences(text)[:n])


def is_degenerate(output: str, reference: str) -> bool:
    """True when `output` repeats a word three or more times in a row, or has a run of three or
    more identical characters that `reference` does not have (so "Leeeevel" counts, "..." in a
    reference that has "..." does not)."""
    if _REPEATED_WORD.search(output):
        return True
    runs = {m.group(0)[:3] for m in _CHAR_RUN.finditer(output)}
    return any(run not in reference for run in runs)
