"""Reading a batch input file: one request per JSONL line, each checked on its own.

Structural errors (a line that is not a JSON object, a missing, duplicate or unstorable
custom_id, another endpoint, too many lines) reject the whole batch at create time, since the
line cannot be matched to a result. Anything else wrong with a line (its body, its reference,
nesting past the limit) becomes that line's error, in the batch's error file: one bad item never
fails its batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from yue2_jobs.core.config import Settings
from yue2_jobs.core.safe import MAX_JSON_DEPTH, check_text, unstorable
from yue2_jobs.errors import InvalidRequestError, LimitExceededError
from yue2_jobs.jobs.params import ENDPOINTS, ValidatedJob, validate_job
from yue2_jobs.storage import CHUNK, Reader

MAX_CUSTOM_ID_CHARS = 512  # jobs.custom_id
MAX_FILENAME_CHARS = 500  # files.filename
LINE = re.compile(rb"[^\r\n]+")  # what bytes.splitlines() separates, with byte offsets
# Where a line too deeply nested for json.loads still names its custom_id (first at the top level).
LINE_SHAPE = '{"custom_id": "doc-1", "method": "POST", "url": "/v1/summarize", "body": {"input": "text to summarise"}}'
CUSTOM_ID = re.compile(rb'^\s*\{\s*(?:"[^"\\]*"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*)*"custom_id"\s*:\s*("(?:[^"\\]|\\.)*")')


@dataclass
class ParsedLine:
    custom_id: str
    job: ValidatedJob | None
    error: InvalidRequestError | None
    reference: str | None = None
    span: tuple[int, int] = (0, 0)  # the line's byte offsets in the file


def split_lines(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    for m in LINE.finditer(data):
        if m.group().strip():
            yield m.start(), m.end(), m.group()


def max_line_bytes(settings: Settings) -> int:
    """How much of one line a batch read keeps: an input and a reference at the character limit,
    every character escaped (`\\ud83d\\ude00`, 12 bytes for one outside the BMP), and room for the
    other fields. A longer line fails alone, as an input over the limit does."""
    return 24 * settings.max_input_chars + 64 * 1024


SEPARATORS = re.compile(rb"[\r\n]+")


def stream_lines(reader: Reader, *, max_bytes: int) -> Iterator[tuple[int, int, bytes]]:
    """The non-blank lines of a stream, as `split_lines` gives them (start and end offsets in the
    file), read a piece at a time. Only the piece and the current line's first `max_bytes` are
    held: of a longer line the first `max_bytes` come back, with its whole span (so `end - start`
    exceeds the bytes: the caller tells it was cut)."""
    line = _Line(max_bytes)
    offset = 0  # the file offset of the piece
    while chunk := reader.read(CHUNK):
        prev = 0
        for m in SEPARATORS.finditer(chunk):
            line.add(chunk[prev:m.start()])
            if line.content:
                yield line.start, offset + m.start(), b"".join(line.pieces)
            line = _Line(max_bytes, start=offset + m.end())
            prev = m.end()
        line.add(chunk[prev:])
        offset += len(chunk)
    if line.content:
        yield line.start, offset, b"".join(line.pieces)


class _Line:
    """The line being read: its start, its first `max_bytes`, whether it has a non-blank byte."""

    def __init__(self, max_bytes: int, start: int = 0) -> None:
        self.room, self.start, self.pieces, self.content = max_bytes, start, list[bytes](), False

    def add(self, piece: bytes) -> None:
        self.content = self.content or bool(piece.strip())
        if self.room > 0 and piece:
            self.pieces.append(piece[:self.room])
            self.room -= len(self.pieces[-1])


def _line_reference(line: dict[str, Any], *, n: int, settings: Settings, in_experiment: bool) -> str | None:
    """A line's optional `reference` (the expected output, for ROUGE in experiment reports)."""
    if in_experiment and isinstance(line.get("body"), dict) and line["body"].get("variant") is not None:
        raise InvalidRequestError(f"line {n}: body.variant is not allowed in a batch under an experiment; "
                                  "the experiment assigns the variants", field="body.variant")
    ref = line.get("reference")
    if ref is None:
        return None
    if not isinstance(ref, str):
        raise InvalidRequestError(f"line {n}: reference must be a string", field="reference")
    return check_text(ref, field="reference", max_chars=settings.max_input_chars)


def _load(raw: bytes, n: int) -> tuple[dict[str, Any], InvalidRequestError | None]:
    """The line as a dict, and an error that fails the line alone (too deep to parse), if any."""
    try:
        line = json.loads(raw)
    except RecursionError:
        too_deep = InvalidRequestError(f"line {n} is nested more than {MAX_JSON_DEPTH} levels deep",
                                       field="body", status=400, code="limit_exceeded")
        return _named_by_its_start(raw, n, f"is nested more than {MAX_JSON_DEPTH} levels deep"), too_deep
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"line {n} is not valid JSON ({exc.msg} at column {exc.colno}); each line must "
                                  f"be one request object: {LINE_SHAPE}", field=f"line {n}", status=400) from None
    except ValueError:  # bytes that are not UTF-8
        raise InvalidRequestError(f"line {n} is not valid JSON (not UTF-8 text); each line must be one request "
                                  f"object: {LINE_SHAPE}", field=f"line {n}", status=400) from None
    if not isinstance(line, dict):
        raise InvalidRequestError(f"line {n} must be a JSON object, not a JSON {_json_type(line)}: {LINE_SHAPE}",
                                  field=f"line {n}", status=400)
    return line, None


def _named_by_its_start(head: bytes, n: int, problem: str) -> dict[str, Any]:
    """A line that cannot be read whole (too deep, too long), as the custom_id at its start (first at
    the top level), so that it fails alone; one that names none before its body refuses the batch."""
    m = CUSTOM_ID.match(head)
    if m is None:
        raise InvalidRequestError(f"line {n} {problem} and names no custom_id before its body, so its error "
                                  "cannot be matched to it", field=f"line {n}", status=400)
    return {"custom_id": json.loads(m.group(1))}


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _refuse_json_array(first_line: bytes) -> None:
    """A whole file holding one JSON array (a common first try) gets the format named, not "line 1"."""
    if first_line.lstrip()[:1] == b"[":
        raise InvalidRequestError(
            f"the input file is a JSON array; a batch input file is JSON Lines: one request object per line, "
            f"for example {LINE_SHAPE}", field="input_file_id", status=400)


def _custom_id(line: dict[str, Any], n: int, seen: set[str]) -> str:
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise InvalidRequestError(f"line {n}: custom_id must be a non-empty string of at most "
                                  f"{MAX_CUSTOM_ID_CHARS} characters", field=f"line {n}.custom_id", status=400)
    problem = unstorable(custom_id)
    if problem:
        raise InvalidRequestError(f"line {n}: custom_id {problem}", field=f"line {n}.custom_id", status=400)
    if custom_id in seen:
        raise InvalidRequestError(f"line {n}: custom_id {custom_id!r} is used twice; each must be unique",
                                  field=f"line {n}.custom_id", status=400)
    seen.add(custom_id)
    return custom_id


def parse_batch_file(data: bytes, *, endpoint: str, settings: Settings, in_experiment: bool = False
                     ) -> list[ParsedLine]:
    """Every line of a batch file held in memory (`iter_batch_lines` reads one from storage)."""
    return list(iter_batch_lines(split_lines(data), endpoint=endpoint, settings=settings, in_experiment=in_experiment))


def iter_batch_lines(lines: Iterable[tuple[int, int, bytes]], *, endpoint: str, settings: Settings,
                     in_experiment: bool = False) -> Iterator[ParsedLine]:
    """Each line of a batch file, parsed and checked, as it is read; raises on a structural error
    (the batch is refused), and when there is no line at all."""
    kind = ENDPOINTS[endpoint]
    seen: set[str] = set()
    n = 0
    for n, (start, end, raw) in enumerate(lines, start=1):
        if n == 1:
            _refuse_json_array(raw)
        if n > settings.max_batch_items:
            raise LimitExceededError(field="input_file_id", limit=settings.max_batch_items, actual=n,
                                     unit="requests", status=400, at_least=True)
        if end - start > len(raw):  # longer than a read keeps (`max_line_bytes`): it fails alone
            named = _named_by_its_start(raw, n, f"is longer than {len(raw):,} bytes")
            yield ParsedLine(_custom_id(named, n, seen), None, LimitExceededError(
                field=f"line {n}", limit=len(raw), actual=end - start, unit="bytes", status=400), span=(start, end))
            continue
        line, line_error = _load(raw, n)
        custom_id = _custom_id(line, n, seen)
        if line_error is not None:
            yield ParsedLine(custom_id, None, line_error, span=(start, end))
            continue
        if line.get("url", endpoint) != endpoint or line.get("method", "POST") != "POST":
            raise InvalidRequestError(f"line {n}: every request must be POST {endpoint}, the batch's endpoint",
                                      field=f"line {n}.url", status=400)
        try:
            reference = _line_reference(line, n=n, settings=settings, in_experiment=in_experiment)
            job = replace(validate_job(line.get("body"), kind=kind, settings=settings, field_prefix="body."),
                          custom_id=custom_id)
            yield ParsedLine(custom_id, job, None, reference, span=(start, end))
        except InvalidRequestError as exc:
            yield ParsedLine(custom_id, None, exc, span=(start, end))
    if n == 0:
        raise InvalidRequestError("input file has no requests", field="input_file_id", status=400)
