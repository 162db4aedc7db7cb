"""Reads every producer service shares."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from yue2_jobs.core.safe import require_id
from yue2_jobs.errors import NotFoundError

T = TypeVar("T")


def get_owned(session: Session, model: type[T], *, tenant: str, row_id: str, what: str) -> T:
    """The `model` row `row_id` of `tenant`; another tenant's id is a plain 404, as a missing one is."""
    require_id(row_id, what=what)
    table: Any = model
    row = session.execute(select(model).where(table.id == row_id, table.tenant == tenant)).scalar_one_or_none()
    if row is None:
        raise NotFoundError(f"no {what} {row_id!r}")
    return row
