"""What a caller's strings and JSON must satisfy before they reach Postgres or storage
(`yue2_jobs.core.safe`): NUL and lone surrogates refused naming the field, ids shaped like ours
or a 404 without a query, nesting bounded without recursion."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from yue2_jobs.core.safe import (
    MAX_JSON_DEPTH,
    STORABLE_PATTERN,
    SafeStr,
    check_depth,
    check_text,
    json_depth,
    require_id,
    unstorable,
)
from yue2_jobs.errors import InvalidRequestError, LimitExceededError, NotFoundError


def test_unstorable_names_the_character_and_its_position() -> None:
    assert unstorable("plain text, accents é and an emoji 🙂 are fine") is None
    assert unstorable("ab\x00c") == "contains a NUL character at position 2"
    assert unstorable("x\ud800") == "contains a lone surrogate U+D800 at position 1"
    assert unstorable("\udfff") == "contains a lone surrogate U+DFFF at position 0"


def test_check_text_returns_the_value_or_an_error_naming_the_field() -> None:
    assert check_text("fine", field="input", max_chars=4) == "fine"
    with pytest.raises(InvalidRequestError) as bad:
        check_text("a\x00b", field="metadata.name", status=400)
    assert (bad.value.field, bad.value.status) == ("metadata.name", 400)
    assert "metadata.name contains a NUL character at position 1" in str(bad.value)
    with pytest.raises(LimitExceededError) as long:
        check_text("abcde", field="input", max_chars=4)
    assert (long.value.field, long.value.limit, long.value.actual) == ("input", 4, 5)


class Body(BaseModel):
    name: SafeStr


def test_safe_str_refuses_what_cannot_be_stored_in_pydantic_models() -> None:
    assert Body(name="ok").name == "ok"
    with pytest.raises(ValidationError, match="lone surrogate U\\+D800"):
        Body(name="\ud800")
    with pytest.raises(ValidationError, match="NUL character"):
        Body(name="\x00")
    assert Body.model_json_schema()["properties"]["name"]["pattern"] == STORABLE_PATTERN


@pytest.mark.parametrize("value", ["job_0123abcd", "file-9f86d081-output", "batch_ab.c-d", "a" * 64])
def test_ids_of_our_shape_pass(value: str) -> None:
    assert require_id(value, what="job") == value


@pytest.mark.parametrize("value", ["", "a" * 65, "_job", "../etc/passwd", "job 1", "job\x00", "jöb", "job/1"])
def test_ids_that_cannot_exist_are_not_found(value: str) -> None:
    with pytest.raises(NotFoundError, match="no job"):
        require_id(value, what="job")


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_json_depth_counts_containers_and_stops_past_the_limit() -> None:
    assert json_depth({}) == 1 and json_depth({"a": 1, "b": "x"}) == 1
    assert json_depth({"a": [1, {"b": [2]}], "c": {}}) == 4
    assert json_depth(nested(MAX_JSON_DEPTH)) == MAX_JSON_DEPTH
    # Far deeper than Python's recursion limit: counted without recursing, and only to the limit + 1.
    assert json_depth(nested(5_000)) == MAX_JSON_DEPTH + 1


def test_check_depth_allows_the_limit_and_refuses_one_more() -> None:
    assert check_depth(nested(5), field="body", limit=5) == nested(5)
    with pytest.raises(InvalidRequestError) as deep:
        check_depth(nested(6), field="body", limit=5)
    assert (deep.value.field, deep.value.status, deep.value.code) == ("body", 400, "limit_exceeded")
    assert "nested more than 5 levels deep" in str(deep.value)
