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
from yue2_jobs.jobs.lines import parse_batch_file, split_lines, stream_lines

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


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")), max_size=12),
       seps=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n", b" \n"]), min_size=1, max_size=4),
       sizes=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=5))
def test_streamed_lines_are_the_lines_of_the_whole_file(lines: list[bytes], seps: list[bytes],
                                                         sizes: list[int]) -> None:
    data = b"".join(ln + seps[i % len(seps)] for i, ln in enumerate(lines))
    assert list(stream_lines(Pieces(data, sizes), max_bytes=1000)) == list(split_lines(data))


def test_a_line_longer_than_the_limit_is_refused_while_it_is_read() -> None:
    data = b'{"custom_id": "a"}\n' + b"x" * 5000 + b"\n"
    with pytest.raises(LimitExceededError) as caught:
        list(stream_lines(Pieces(data, [1000]), max_bytes=2048))
    assert caught.value.field == "line 2" and caught.value.limit == 2048


def test_an_experiment_assigns_the_variant_and_a_reference_is_text() -> None:
    data = jsonl({**line("a", input="x"), "reference": "the summary"}, line("b", input="y", variant="legal"),
                 {**line("c", input="z"), "reference": 3})
    parsed = {p.custom_id: p for p in parse_batch_file(data, endpoint="/v1/summarize", settings=SETTINGS,
                                                       in_experiment=True)}
    assert parsed["a"].error is None and parsed["a"].reference == "the summary"
    assert parsed["b"].error is not None and parsed["b"].error.field == "body.variant"
    assert parsed["c"].error is not None and parsed["c"].error.field == "reference"


def test_input_shape_mistakes_are_named_with_the_shape_expected() -> None:
    # A whole JSON array (a common first try) is named as such, with an example line.
    data = json.dumps([line("a", input="x"), line("b", input="y")], indent=1).encode()
    with pytest.raises(InvalidRequestError, match="is a JSON array; a batch input file is JSON Lines") as exc:
        parse_batch_file(data, endpoint="/v1/summarize", settings=SETTINGS)
    assert exc.value.field == "input_file_id" and '"custom_id": "doc-1"' in str(exc.value)
    # A line that is not JSON says why and where.
    with pytest.raises(InvalidRequestError, match=r"line 2 is not valid JSON \(Expecting .* at column 2\)"):
        parse_batch_file(jsonl(line("a", input="x"), b"{not json"), endpoint="/v1/summarize", settings=SETTINGS)
    with pytest.raises(InvalidRequestError, match="line 1 must be a JSON object, not a JSON string"):
        parse_batch_file(jsonl("just text"), endpoint="/v1/summarize", settings=SETTINGS)
    # A chat-completions body fails its line alone, naming the field we need and what it sent.
    chat = line("c")
    chat["body"] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Summarise: ..."}]}
    parsed = parse_batch_file(jsonl(line("a", input="x"), chat), endpoint="/v1/summarize", settings=SETTINGS)
    error = parsed[1].error
    assert parsed[0].error is None and error is not None and error.field == "body.input"
    assert "chat-style fields (model, messages) are not accepted" in str(error)
    assert '{"input": "..."}' in str(error)
