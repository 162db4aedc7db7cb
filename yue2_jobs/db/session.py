"""Engines and sessions. The API translates SQLAlchemy's OperationalError (database unreachable) into a 503."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, Result, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def utcnow() -> datetime:
    return datetime.now(UTC)


def affected(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE matched. `Session.execute` returns a `CursorResult` for those,
    though it is typed as any `Result`."""
    return cast(CursorResult[Any], result).rowcount


NO_SCHEMA = "the database has no yue2-jobs tables: run `yue2 migrate` first"


def is_missing_schema(exc: BaseException) -> bool:
    """Whether a SQLAlchemy error says a table does not exist (a database never migrated)."""
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code == "42P01" or "no such table" in str(orig)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # WAL lets the API read while a worker writes; the demo runs both on one file.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # No pre-ping: it costs a round trip per checkout on the API's hot path. A connection the
    # server dropped fails its statement once (DatabaseUnavailableError, retryable) and is replaced.
    return create_engine(url, pool_size=10, max_overflow=20, pool_recycle=1800)


@lru_cache
def engine_for(url: str) -> Engine:
    return make_engine(url)


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(engine_for(url), expire_on_commit=False)
