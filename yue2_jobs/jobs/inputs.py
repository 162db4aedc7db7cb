"""Where a job's input text lives: inline in its row, in its own object, or as a line of its batch's file.

A batch input too large for its row is not copied anywhere: the job keeps a reference to its
line of the uploaded JSONL file (`<file key>#<start>-<end>`, byte offsets), and the worker reads
that range back. Creating a batch therefore writes no object at all, however large its inputs,
so it is fast and an aborted creation leaves nothing behind. A single job's large input is its
own object, written after its row is inserted and before that row commits.
"""

from __future__ import annotations

import json
from typing import Any

from yue2_jobs.jobs.keys import parse_line_ref
from yue2_jobs.jobs.params import TEXT_FIELD
from yue2_jobs.storage import Storage


def read_input(storage: Storage, *, input_text: str | None, input_key: str | None, kind: str) -> str:
    """A job's input text, wherever it lives."""
    if input_key is None:
        return input_text or ""
    key, span = parse_line_ref(input_key)
    if span is None:
        return storage.get(input_key).decode()
    line: dict[str, Any] = json.loads(storage.get_range(key, *span))
    return str(line["body"][TEXT_FIELD[kind]])
