"""A batch input file, line by line (`parse_batch_file`): one bad line fails alone, a file-level
problem is a 400 naming the line, every limit is explicit — no server needed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yue2_jobs.core.config import Settings
from yue2_jobs.errors import InvalidRequestError, LimitExceededError
from yue2_jobs.jobs.keys import line_ref, parse_line_ref
from yue2_jobs.jobs.lines import iter_batch_lines, max_line_bytes, parse_batch_file, split_lines, stream_lines

SETTINGS = Settings(max_batch_items=5, max_input_chars=50)


def jsonl(*lines: object) -> bytes:
    return b"".join((ln if isinstance(ln, bytes) else json.dumps(ln).encode()) + b"\n" for ln in lines)


def line(custom_id: str, **body: object) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/summarize", "body": body}


def test_good_lines_parse_with_their_byte_spans() -> None:
    data = jsonl(line("a", input="first"), line("b", input="second", mode="ar", max_new_tokens=9))
    parsed = parse_batch_file(data, endpoint="/v1/summarize", settings=SETTINGS)
    assert [p.custom_id for p in parsed] == ["a", "b"] and all(p.error is None for p in parsed)
    assert parsed[1].job is not None and parsed[1].job.custom_id == "b"
    assert (parsed[1].job.decoding.mode, parsed[1].job.decoding.max_new_tokens) == ("ar", 9)
    for p in parsed:  # each span is the line itself, which a job's input reference points at
        start, end = p.span
        assert json.loads(data[start:end])["custom_id"] == p.custom_id
        assert parse_line_ref(line_ref("t/files/f.jsonl", start, end)) == ("t/files/f.jsonl", (start, end))


def test_a_bad_line_fails_alone() -> None:
    deep = b'{"custom_id": "deep", "body": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    data = jsonl(line("ok", input="fine"), line("empty", input=""), line("long", input="x" * 51),
                 line("knob", input="x", temperature=-1), deep)
    parsed = {p.custom_id: p for p in parse_batch_file(data, endpoint="/v1/summarize", settings=SETTINGS)}
    assert parsed["ok"].error is None
    assert parsed["empty"].error is not None and parsed["empty"].error.field == "body.input"
    long_error = parsed["long"].error
    assert isinstance(long_error, LimitExceededError) and long_error.limit == 50
    assert parsed["knob"].error is not None and parsed["knob"].error.field == "body.temperature"
    assert parsed["deep"].error is not None and "nested more than" in str(parsed["deep"].error)


def test_crlf_and_blank_lines_are_fine() -> None:
    data = json.dumps(line("a", input="x")).encode() + b"\r\n\r\n" + json.dumps(line("b", input="y")).encode()
    assert [p.custom_id for p in parse_batch_file(data, endpoint="/v1/summarize", settings=SETTINGS)] == ["a", "b"]


@pytest.mark.parametrize(("data", "field", "text"), [
    (jsonl(line("a", input="x"), line("a", input="y")), "line 2.custom_id", "used twice"),
    (jsonl(line("a", input="x"), b"{not json"), "line 2", "not valid JSON"),
    (jsonl(line("a", input="x"), [1, 2]), "line 2", "must be a JSON object"),
    (jsonl({**line("a", input="x"), "url": "/v1/generate"}), "line 1.url", "POST /v1/summarize"),
    (b"\n \n", "input_file_id", "no requests"),
])
def test_file_level_problems_name_the_line(data: bytes, field: str, text: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse_batch_file(data, endpoint="/v1/summarize", settings=SETTINGS)
    assert caught.value.field == field and caught.value.status == 400 and text in str(caught.value)


def test_too_many_lines_are_refused_at_the_first_line_past_the_limit() -> None:
    data = jsonl(*(line(str(i), input="x") for i in range(7)))
    with pytest.raises(LimitExceededError) as caught:
        parse_batch_file(data, endpoint="/v1/summarize", settings=SETTINGS)
    # The exact count comes from the upload (files.lines), before the file is read at all.
    assert (caught.value.field, caught.value.limit, caught.value.actual) == ("input_file_id", 5, 6)
    assert "at least" in str(caught.value)


class Pieces:
    """A stream that hands out its bytes in the given piece sizes (a network read returns what it has)."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data, self.sizes, self.pos = data, sizes or [1], 0

    def read(self, n: int) -> bytes:
        size = min(n, self.sizes[self.pos % len(self.sizes)] if self.pos < len(self.data) else n)
        out = self.data[self.pos:self.pos + size]
        self.pos += len(out)
        return out

    def close(self) -> None:
        pass


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")), max_size=12),
       seps=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n", b" \n"]), min_size=1, max_size=4),
       sizes=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=5),
       last_newline=st.booleans(), keep=st.integers(min_value=1, max_value=14))
def test_streamed_lines_are_the_lines_of_the_whole_file(lines: list[bytes], seps: list[bytes], sizes: list[int],
                                                         last_newline: bool, keep: int) -> None:
    data = b"".join(ln + seps[i % len(seps)] for i, ln in enumerate(lines))
    if not last_newline and lines:
        data = data[:len(data) - len(seps[(len(lines) - 1) % len(seps)])]
    whole = list(split_lines(data))
    assert list(stream_lines(Pieces(data, sizes), max_bytes=1000)) == whole
    # A line longer than `keep` bytes comes back cut, with its whole span.
    assert list(stream_lines(Pieces(data, sizes), max_bytes=keep)) == [(s, e, d[:keep]) for s, e, d in whole]


def test_a_line_too_long_to_read_whole_fails_alone() -> None:
    settings_ = Settings(max_batch_items=5, max_input_chars=10)  # lines are read up to 24 x 10 + 64 KiB
    huge = json.dumps(line("huge", input="x" * 70_000)).encode()
    data = jsonl(line("ok", input="fine"), huge, line("after", input="also fine"))
    cut = list(stream_lines(Pieces(data, [4096]), max_bytes=max_line_bytes(settings_)))
    parsed = {p.custom_id: p for p in iter_batch_lines(cut, endpoint="/v1/summarize", settings=settings_)}
    assert parsed["ok"].error is None and parsed["after"].error is None
    error = parsed["huge"].error
    assert isinstance(error, LimitExceededError) and error.field == "line 2" and error.actual == len(huge)
    assert parsed["huge"].span == (data.index(huge), data.index(huge) + len(huge))
    # One whose custom_id comes after its body cannot be matched to a result: the batch is refused.
    nameless = json.dumps({"body": {"input": "x" * 70_000}, "custom_id": "late"}).encode()
    cut = list(stream_lines(Pieces(jsonl(nameless), [4096]), max_bytes=max_line_bytes(settings_)))
    with pytest.raises(InvalidRequestError, match="names no custom_id before its body"):
        list(iter_batch_lines(cut, endpoint="/v1/summarize", settings=settings_))


def test_a_json_array_on_one_long_line_is_named_as_such() -> None:
    data = json.dumps([line(str(i), input="x" * 500) for i in range(200)]).encode()
    cut = list(stream_lines(Pieces(data, [4096]), max_bytes=1024))
    with pytest.raises(InvalidRequestError, match="is a JSON array"):
        list(iter_batch_lines(cut, endpoint="/v1/summarize", settings=SETTINGS))
