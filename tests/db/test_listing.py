"""Cursor pagination (`db.listing.page`): newest first or oldest first, ties on created_at broken
by id, no gaps or repeats, another tenant's id is no cursor, and the limit is explicit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.orm import Session

from yue2_jobs.db.listing import MAX_LIMIT, check_limit, page
from yue2_jobs.db.models import File
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import InvalidRequestError


def _files(session: Session, tenant: str, n: int) -> list[str]:
    """n files of `tenant`, created in pairs sharing a timestamp (ties), oldest first."""
    t0 = utcnow()
    ids = [f"file-{tenant}-{i:03d}" for i in range(n)]
    session.add_all(File(id=fid, tenant=tenant, purpose="batch", filename="in.jsonl", bytes=1, storage_key="k",
                         created_at=t0 + timedelta(seconds=i // 2)) for i, fid in enumerate(ids))
    session.commit()
    return ids


def _walk(session: Session, tenant: str, *, limit: int, order: str) -> list[list[str]]:
    pages, after = [], None
    while True:
        got = page(session, File, tenant=tenant, limit=limit, after=after, order=order)
        pages.append([f.id for f in got.rows])
        if not got.has_more:
            return pages
        after = got.rows[-1].id


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 100])
def test_pages_cover_every_row_once_in_order(session: Session, limit: int) -> None:
    tenant = f"t{limit}"
    ids = _files(session, tenant, 7)
    _files(session, f"other{limit}", 3)  # another tenant's rows never show
    newest = _walk(session, tenant, limit=limit, order="desc")
    assert [i for p in newest for i in p] == ids[::-1]
    assert all(len(p) == limit for p in newest[:-1]) and 0 < len(newest[-1]) <= limit
    assert [i for p in _walk(session, tenant, limit=limit, order="asc") for i in p] == ids


def test_a_cursor_must_be_one_of_the_tenants_ids(session: Session) -> None:
    mine, theirs = _files(session, "me", 2), _files(session, "them", 2)
    for bad in (theirs[0], "file-nothing", "not an id!"):
        with pytest.raises(InvalidRequestError) as caught:
            page(session, File, tenant="me", limit=5, after=bad)
        assert (caught.value.field, caught.value.status, caught.value.code) == ("after", 404, "unknown_cursor")
    assert page(session, File, tenant="me", limit=5, after=mine[1]).rows[0].id == mine[0]
    assert [f.id for f in page(session, File, tenant="me", limit=5, after="").rows] == mine[::-1]  # no cursor


@pytest.mark.parametrize("limit", [0, -1, MAX_LIMIT + 1])
def test_the_limit_is_explicit(limit: int) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_limit(limit)
    assert caught.value.field == "limit" and f"1 to {MAX_LIMIT}" in str(caught.value)
