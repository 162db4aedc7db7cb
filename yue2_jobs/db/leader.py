"""One process at a time across hosts: a Postgres session-level advisory lock held on a connection
of its own, for the roles a deployment runs once (the reconciler passes, the watchdog).

The holder's connection carries `application_name` "yue2-<role> <node>", so `lock_holder` (and an
operator, in `pg_stat_activity`) can tell who holds it. When the holder dies its session ends and
the lock is free at once; when its host is cut off, the server notices the dead connection by TCP
keepalive (`session.PEER_TIMEOUTS`) and ends the session. Session-level locks need a session of
their own: behind PgBouncer that is session pooling, not transaction pooling.
"""

from __future__ import annotations

import contextlib
import logging

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from yue2_jobs.db.session import engine_for

log = logging.getLogger(__name__)


def _app_name(role: str) -> str:
    return f"yue2-{role} "


class LeaderLock:
    """This process's claim to `role`. Call `held()` before each round of the role's work: it takes
    the lock if it is free, or checks that the connection holding it still lives (a connection lost
    is a lock lost). On SQLite (one host, one file) it is always held."""

    def __init__(self, database_url: str, *, key: int, role: str, node: str) -> None:
        self.key, self.role, self.node = key, role, node
        self.engine = engine_for(database_url)
        self.conn: Connection | None = None
        self.holding = False

    def held(self) -> bool:
        if self.engine.dialect.name != "postgresql":
            return True
        try:
            if self.conn is None:
                self.conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                self.conn.execute(text("SELECT set_config('application_name', :n, false)"),
                                  {"n": (_app_name(self.role) + self.node)[:63]})
            if self.holding:
                self.conn.execute(text("SELECT 1"))
            elif self.conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar():
                self.holding = True
                log.info("%s: %s holds the lock", self.role, self.node)
            return self.holding
        except Exception as exc:
            if self.holding:
                log.warning("%s: %s lost its lock's connection (%s)", self.role, self.node, type(exc).__name__)
            self.release()
            return False

    def release(self) -> None:
        """Let go of the lock (at once: the server frees it only when a closed session's backend has
        exited) and drop the connection."""
        conn, holding, self.conn, self.holding = self.conn, self.holding, None, False
        if conn is not None:
            if holding:
                with contextlib.suppress(Exception):  # a dead connection has lost it already
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
            with contextlib.suppress(Exception):
                conn.invalidate()  # never back into the pool: its session carries the holder's name
            with contextlib.suppress(Exception):
                conn.close()


def lock_holder(session: Session, *, key: int, role: str) -> str | None:
    """The node holding `role`'s lock `key` (None: nobody, or not Postgres)."""
    if session.bind is None or session.bind.dialect.name != "postgresql":
        return None
    name = session.execute(text(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = :k AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"),  # locks are per database
        {"k": key}).scalar()
    session.commit()
    prefix = _app_name(role)
    return name.removeprefix(prefix) if name and name.startswith(prefix) else name
