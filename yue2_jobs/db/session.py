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


def as_utc(t: datetime) -> datetime:
    """A stored timestamp, zone-aware: SQLite hands back naive UTC datetimes, Postgres aware ones."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


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
    return create_engine(url, pool_size=10, max_overflow=20, pool_recycle=1800, connect_args=peer_timeouts(url))


# TCP keepalives on both ends of every Postgres connection. Across hosts a peer can vanish without a
# FIN (a cut link, a host that lost power): without them the client waits out TCP's retransmissions
# (about 15 minutes) and the server keeps the dead session, its open transaction, its row locks and
# its advisory locks (the reconciler's) for the kernel's 2 hours. With these both ends drop a dead
# peer after about `tcp_user_timeout` (11 s): on Linux it bounds unacknowledged data and, once set,
# also ends keepalive probing (tcp(7)); probes start after `keepalives_idle` of silence. Any of them
# in the URL's query (`?keepalives_idle=2`) wins.
PEER_TIMEOUTS = {"keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "2", "keepalives_count": "3",
                 "tcp_user_timeout": "11000"}  # ms


def peer_timeouts(url: str) -> dict[str, str]:
    """libpq connection parameters for `PEER_TIMEOUTS`, and the same timeouts for the server's end
    (`options`; a URL that sets `options` itself, e.g. for PgBouncer, keeps its own)."""
    from sqlalchemy.engine import make_url

    query = make_url(url).query
    args = {k: v for k, v in PEER_TIMEOUTS.items() if k not in query}
    if "options" not in query:
        eff = {**PEER_TIMEOUTS, **{k: str(query[k]) for k in PEER_TIMEOUTS if k in query}}
        args["options"] = " ".join([*(f"-c tcp_keepalives_{n}={eff[f'keepalives_{n}']}"
                                      for n in ("idle", "interval", "count")),
                                    f"-c tcp_user_timeout={eff['tcp_user_timeout']}"])
    return args


@lru_cache
def engine_for(url: str) -> Engine:
    return make_engine(url)


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(engine_for(url), expire_on_commit=False)
