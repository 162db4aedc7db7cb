"""Cursor pagination in OpenAI's list shape: newest first, `limit` 1-100, `after` = the last id seen.

The order is (created_at, id), so rows created in the same microsecond still page without gaps
or repeats, and a page is one indexed range scan (`ix_<table>_tenant_created`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from yue2_jobs.core.safe import ID_SHAPE
from yue2_jobs.errors import InvalidRequestError

T = TypeVar("T")
MAX_LIMIT = 100
DEFAULT_LIMIT = 20
Order = Literal["asc", "desc"]


@dataclass
class Page(Generic[T]):
    rows: list[T]
    has_more: bool


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequestError(f"limit must be from 1 to {MAX_LIMIT}; got {limit}", field="limit", status=400,
                                  code="limit_out_of_range")
    return limit


def page(session: Session, model: type[T], *, tenant: str, limit: int, after: str | None, order: Order = "desc",
         where: tuple[Any, ...] = ()) -> Page[T]:
    """One page of `tenant`'s `model` rows matching `where`. An empty `after` is no cursor (the
    first page); one that names none of the tenant's objects is a 404 naming it (the object it
    points at is not found), not an empty page."""
    check_limit(limit)
    table: Any = model
    newest_first = order == "desc"
    stmt = select(model).where(table.tenant == tenant, *where)
    if after:
        cursor = None if ID_SHAPE.fullmatch(after) is None else session.execute(
            select(table.created_at, table.id).where(table.id == after, table.tenant == tenant)).one_or_none()
        if cursor is None:
            raise InvalidRequestError(f"after: no object {after!r} to page after", field="after", status=404,
                                      code="unknown_cursor")
        at, cid = cursor
        if newest_first:
            stmt = stmt.where(or_(table.created_at < at, and_(table.created_at == at, table.id < cid)))
        else:
            stmt = stmt.where(or_(table.created_at > at, and_(table.created_at == at, table.id > cid)))
    keys = (table.created_at.desc(), table.id.desc()) if newest_first else (table.created_at, table.id)
    rows = list(session.execute(stmt.order_by(*keys).limit(limit + 1)).scalars())
    return Page(rows=rows[:limit], has_more=len(rows) > limit)

