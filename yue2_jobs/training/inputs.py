"""Unlabelled inputs for drafter training: the texts a checkpoint will be asked to summarise.

A file of JSON Lines (gzip-compressed when its name ends in `.gz`), one input per line, in any of
the shapes a user already has: `{"text": ...}` (the corpora's rows; other fields are ignored),
`{"input": ...}` (a job body), or a batch file's line as the API takes it (`{"custom_id": ...,
"body": {"input": ...}}`, or `body.prompt` for `/v1/generate`). A line that is none of these is
an error naming the line: a drafter trained on half a file because the other half was silently
skipped would be worse than none. (A finished batch's inputs come through `yue2 train-drafter
--batch`, which reads them from storage with the pipeline's own parser.)
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from yue2_jobs.errors import DataError

SHAPES = "'text', 'input', or a batch line's body.input / body.prompt"


def text_of(row: Any) -> str | None:
    """The input text of one parsed line, or None when it has none of the accepted shapes."""
    if not isinstance(row, dict):
        return None
    for key in ("text", "input"):
        if isinstance(row.get(key), str):
            return str(row[key])
    body = row.get("body")
    if isinstance(body, dict):
        for key in ("input", "prompt"):
            if isinstance(body.get(key), str):
                return str(body[key])
    return None


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def iter_input_file(path: str | Path) -> Iterator[str]:
    """Each line's input text, in file order; blank lines are skipped, anything else unusable raises
    `DataError` naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"inputs file {str(path)!r} does not exist")
    with _open(path) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{path.name} line {n} is not JSON ({exc.__class__.__name__}: {exc}); "
                                "an inputs file is JSON Lines, one object per line") from None
            text = text_of(row)
            if text is None:
                raise DataError(f"{path.name} line {n} has no input text: expected {SHAPES}")
            if not text.strip():
                raise DataError(f"{path.name} line {n}: the input text is empty")
            yield text


def read_input_file(path: str | Path) -> list[str]:
    texts = list(iter_input_file(path))
    if not texts:
        raise DataError(f"inputs file {str(path)!r} holds no inputs")
    return texts
