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

from yue2_jobs.jobs.params import TEXT_FIELD
from yue2_jobs.storage import Storage


def own_input_key(*, tenant: str, job_id: str) -> str:
    return f"{tenant}/jobs/{job_id}.input.txt"


def line_ref(file_key: str, start: int, end: int) -> str:
    """A reference to bytes [start, end) of `file_key`: one line of a batch input file."""
    return f"{file_key}#{start}-{end}"


def read_input(storage: Storage, *, input_text: str | None, input_key: str | None, kind: str) -> str:
    """A job's input text, wherever it lives."""
    if input_key is None:
        return input_text or ""
    key, sep, span = input_key.rpartition("#")
    if not sep:
        return storage.get(input_key).decode()
    start, end = (int(x) for x in span.split("-"))
    line: dict[str, Any] = json.loads(storage.get_range(key, start, end))
    return str(line["body"][TEXT_FIELD[kind]])
