"""What any string or JSON a caller sends must satisfy before it reaches Postgres or storage.

Postgres refuses NUL in text (psycopg's DataError), and a lone UTF-16 surrogate (which JSON's
`\\ud800` escape produces) cannot be encoded as UTF-8 at all: either one, stored or echoed back,
turns a request into a 500. They are refused at the boundary instead, naming the field. Ids are
checked against the shape every id we issue has, so an id that cannot exist is a 404 without a
query.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from yue2_jobs.errors import InvalidRequestError, LimitExceededError, NotFoundError

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
ID_SHAPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # job_<hex>, file-<hex>-output, batch_<hex>, exp_<hex>
MAX_JSON_DEPTH = 32  # nesting of a request body or batch line; ours are 3 deep


def unstorable(value: str) -> str | None:
    """Why `value` cannot be stored (NUL, a lone surrogate), or None when it can."""
    bad = UNSTORABLE.search(value)
    if bad is None:
        return None
    char = bad.group()
    what = "a NUL character" if char == "\x00" else f"a lone surrogate U+{ord(char):04X}"
    return f"contains {what} at position {bad.start()}"


def check_text(value: str, *, field: str, max_chars: int | None = None, status: int = 422) -> str:
    """`value` unchanged, or an InvalidRequestError naming `field` (and the limit, when over it)."""
    problem = unstorable(value)
    if problem:
        raise InvalidRequestError(f"{field} {problem}; text fields must be valid Unicode without NUL",
                                  field=field, status=status)
    if max_chars is not None and len(value) > max_chars:
        raise LimitExceededError(field=field, limit=max_chars, actual=len(value), unit="characters", status=status)
    return value


def _storable(value: str) -> str:
    problem = unstorable(value)
    if problem:
        raise ValueError(f"{problem}; text fields must be valid Unicode without NUL")
    return value


# A pydantic string that refuses NUL and lone surrogates (the validation error names the field). Its
# JSON schema says "no NUL" as a pattern (lone surrogates cannot be written in UTF-8 JSON text);
# the pattern documents, `_storable` validates, so the message stays ours.
STORABLE_PATTERN = r"^[^\x00]*$"
SafeStr = Annotated[str, AfterValidator(_storable), Field(json_schema_extra={"pattern": STORABLE_PATTERN})]


def require_id(value: str, *, what: str) -> str:
    """`value` when it has the shape of an id we issue; otherwise a 404 without touching the database."""
    if ID_SHAPE.fullmatch(value) is None:
        raise NotFoundError(f"no {what} {value!r}")
    return value


def json_depth(value: Any, *, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of a parsed JSON value, counting up to `limit + 1` (it stops looking there)."""
    depth, level = 0, [value]
    while level:
        depth += 1
        if depth > limit:
            return depth
        nxt: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                nxt.extend(v for v in item.values() if isinstance(v, dict | list))
            elif isinstance(item, list):
                nxt.extend(v for v in item if isinstance(v, dict | list))
        level = nxt
    return depth


def check_depth(value: Any, *, field: str, limit: int = MAX_JSON_DEPTH) -> Any:
    if json_depth(value, limit=limit) > limit:
        raise InvalidRequestError(f"{field} is nested more than {limit} levels deep", field=field, status=400,
                                  code="limit_exceeded")
    return value
