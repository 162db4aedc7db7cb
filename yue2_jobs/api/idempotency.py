"""`Idempotency-Key` on the POSTs that create things (jobs, batches, files).

The first request with a key runs; its response is stored with a fingerprint of the request
(method, path, body). A retry with the same key and body gets that response back, also while the
first is still running (it waits for it); the same key with another body is a 409. Keys are per
tenant and kept 24 h; a failed first request (an error of any kind) leaves no key behind, so its
retry runs afresh.

**A waiting retry holds no thread and no connection**: it sleeps on the event loop and looks at
the key in a short transaction on a pool thread, every 50 ms at first, backing off to 1 s.

**A key whose owner died is taken over in about a second, safely.** Each API process holds a
Postgres advisory lock of its own for its whole life (`Owner`) and stamps its number on the keys
it runs; a waiting retry tries that lock once a second, and getting it means the process is gone
(a SIGKILLed process's connection closes and the server frees its locks at once; a host cut off,
after TCP keepalive, about 11 s). The retry then takes the key over, and what it does next
depends on what the dead request committed:

- The key row names the resource the request created (`resource`, "batch:<id>"), written *in the
  transaction that creates it* (`Fence`): so either the resource and its name are committed
  together, or neither is. A named resource is answered as it stands now (and its unpublished
  jobs are published); no name means nothing was committed, and the retry runs the request.
- Each run carries a claim token, and the resource's transaction names it only `WHERE claim =
  <its token>`: a request taken for dead while it was only slow (its lock's connection lost)
  cannot commit after a takeover; it finds the key taken, rolls back, and answers what the new
  owner answers. One resource either way.

Without Postgres (SQLite, one process) nobody vouches for an owner: a `running` key is taken
over once `LOCK` (10 min) has passed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Annotated, Any

from fastapi import Header
from fastapi.responses import JSONResponse
from sqlalchemy import delete, event, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction, sessionmaker
from starlette.concurrency import run_in_threadpool

from yue2_jobs.db.leader import LeaderLock
from yue2_jobs.db.models_api import IdempotencyKey
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import ConflictError, InvalidRequestError

log = logging.getLogger(__name__)
KEEP = timedelta(hours=24)
LOCK = timedelta(minutes=10)  # a `running` key that no live owner vouches for is taken over after this
WAIT_S = 120.0  # how long a retry waits for the first request before a 409 tells it to come back
POLL_S, POLL_MAX_S = 0.05, 1.0  # a waiting retry's looks at the key: every 50 ms, backing off to 1 s
OWNER_CHECK_S = 1.0  # and at the owner's lock: at its first look, then once a second
MAX_KEY_CHARS = 255
IdempotencyKeyHeader = Annotated[str | None, Header(alias="Idempotency-Key")]
# The tables whose new rows are what a keyed POST creates (each route names the kind it creates).
RESOURCES = {"batches": "batch", "files": "file", "jobs": "job"}


def fingerprint(method: str, path: str, body: Any) -> str:
    """sha256 of the request; `body` is parsed JSON (hashed canonically) or bytes."""
    raw = body if isinstance(body, bytes) else json.dumps(body, sort_keys=True).encode()  # ASCII: lone surrogates too
    return hashlib.sha256(f"{method} {path}\n".encode() + raw).hexdigest()


def check_key(key: str) -> str:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not all("!" <= ch <= "~" for ch in key):
        raise InvalidRequestError(f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} printable ASCII characters "
                                  f"without spaces", field="Idempotency-Key", status=400)
    return key


class Owner:
    """This API process as the owner of the keys it runs: a Postgres advisory lock on a connection
    of its own, taken at the first keyed request and held for the process's life. `number()` is
    the lock's key, or None where it cannot be vouched for (not Postgres; the lock's connection is
    lost: then its keys fall back to `LOCK`). The connection is checked at most once a second."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._lock: LeaderLock | None = None
        self._pid = 0
        self._checked_at = -1.0
        self._mutex = threading.Lock()  # one connection, many request threads

    def number(self) -> int | None:
        with self._mutex:
            if self._lock is None or self._pid != os.getpid():  # made in a parent before a fork: each child its own
                self._pid = os.getpid()
                self._lock = LeaderLock(self.database_url, key=secrets.randbits(62) + 1, role="api",
                                        node=f"{socket.gethostname()}:{self._pid}")
            if self._lock.engine.dialect.name != "postgresql":
                return None
            if self._lock.holding and time.monotonic() - self._checked_at < OWNER_CHECK_S:
                return self._lock.key
            self._checked_at = time.monotonic()
            return self._lock.key if self._lock.held() else None


def _owner_alive(session: Session, row: IdempotencyKey, *, lock_passed: bool) -> bool:
    """Whether the process running `row` lives: its lock is held (Postgres), else `LOCK` not passed."""
    bind = session.get_bind()
    if row.owner is None or bind.dialect.name != "postgresql":
        return not lock_passed
    # Got it: nobody holds it, so its process is gone (the lock goes with this transaction).
    free = session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": row.owner}).scalar()
    return not free


class KeyTakenOver(Exception):
    """The running request's key was taken over (its process was taken for dead): its resource's
    transaction is refused, and the request answers what the new owner does."""


class Fence:
    """Names the created resource on the key row in the transaction that creates it, `WHERE claim`
    is still this request's: see the module's docstring. Listens on the route's session while the
    request's action runs; a POST creates its rows by ORM objects or ORM bulk INSERTs, both seen."""

    def __init__(self, *, tenant: str, key: str, claim: str, kind: str) -> None:
        self.tenant, self.key, self.claim, self.kind = tenant, key, claim, kind
        self.found: str | None = None  # the id of the first row of `kind` created
        self.named = False

    def _saw(self, table: str, row_id: Any) -> None:
        # Only the route's own kind: `retry_failed` commits a new input file before its batch.
        if RESOURCES.get(table) == self.kind and isinstance(row_id, str) and self.found is None:
            self.found = row_id

    def after_flush(self, session: Session, flush_context: UOWTransaction) -> None:
        for obj in session.new:
            self._saw(getattr(obj, "__tablename__", ""), getattr(obj, "id", None))

    def do_orm_execute(self, state: ORMExecuteState) -> None:
        if state.is_insert and state.bind_mapper is not None:
            params = state.parameters
            first = params[0] if isinstance(params, list) and params else params
            if isinstance(first, dict):
                self._saw(state.bind_mapper.local_table.name, first.get("id"))  # type: ignore[attr-defined]

    def before_commit(self, session: Session) -> None:
        session.flush()  # pending objects are flushed after this hook: see them now
        if self.named or self.found is None:
            return
        named = session.execute(update(IdempotencyKey).where(
            IdempotencyKey.tenant == self.tenant, IdempotencyKey.key == self.key, IdempotencyKey.claim == self.claim,
            IdempotencyKey.state == "running").values(resource=f"{self.kind}:{self.found}"))
        if getattr(named, "rowcount", 0) != 1:
            self.found = None  # this transaction is refused; a clean-up commit after it is not
            raise KeyTakenOver(self.key)
        self.named = True

    def after_rollback(self, session: Session) -> None:
        if not self.named:
            self.found = None  # rolled back: that row was never created

    @contextmanager
    def watching(self, session: Session) -> Iterator[None]:
        hooks = (("after_flush", self.after_flush), ("do_orm_execute", self.do_orm_execute),
                 ("before_commit", self.before_commit), ("after_rollback", self.after_rollback))
        for name, fn in hooks:
            event.listen(session, name, fn)
        try:
            yield
        finally:
            for name, fn in hooks:
                event.remove(session, name, fn)


def _row(session: Session, *, tenant: str, key: str) -> tuple[IdempotencyKey, bool, bool] | None:
    """The key's row, whether it is past its 24 h, and whether its `locked_until` has passed (compared
    in SQL: SQLite hands back naive datetimes)."""
    session.expire_all()
    now = utcnow()
    found = session.execute(select(IdempotencyKey, IdempotencyKey.expires_at < now, IdempotencyKey.locked_until < now)
                            .where(IdempotencyKey.tenant == tenant, IdempotencyKey.key == key)).one_or_none()
    return None if found is None else (found[0], bool(found[1]), bool(found[2]))


def _claim(sessions: sessionmaker[Session], *, tenant: str, key: str, fp: str, owner: int | None,
           claim: str) -> bool:
    now = utcnow()
    with sessions() as session:
        session.execute(delete(IdempotencyKey).where(IdempotencyKey.tenant == tenant, IdempotencyKey.key == key,
                                                     IdempotencyKey.expires_at < now))
        session.add(IdempotencyKey(tenant=tenant, key=key, fingerprint=fp, state="running", created_at=now,
                                   locked_until=now + LOCK, expires_at=now + KEEP, owner=owner, claim=claim))
        try:
            session.commit()
            return True
        except IntegrityError:
            session.rollback()
            return False


@dataclass
class _Dead:
    claim: str | None  # the dead request's token, which a takeover must still find


FREE, RUNNING = "free", "running"


def _look(sessions: sessionmaker[Session], *, tenant: str, key: str, fp: str,
          check_owner: bool) -> JSONResponse | _Dead | str:
    """One look at the key: its stored response, `_Dead` (running, its owner gone), FREE (gone,
    or past its 24 h) or RUNNING."""
    with sessions() as session:
        found = _row(session, tenant=tenant, key=key)
        if found is None or found[1]:
            return FREE
        row, _, lock_passed = found
        if row.fingerprint != fp:
            raise ConflictError(f"Idempotency-Key {key!r} was already used with a different request; "
                                f"use a new key for a new request")
        if row.state == "done":
            return JSONResponse(row.response_body, status_code=row.response_status or 200,
                                headers={"Idempotent-Replayed": "true"})
        dead = check_owner and not _owner_alive(session, row, lock_passed=lock_passed)
        session.commit()
        return _Dead(row.claim) if dead else RUNNING


def _take_over(sessions: sessionmaker[Session], *, tenant: str, key: str, dead: _Dead, owner: int | None,
               claim: str) -> tuple[bool, str | None]:
    """Make this request the key's owner if it is still the dead one's; returns (taken, the
    resource the dead request committed)."""
    now = utcnow()
    with sessions() as session:
        # Waits for the dead request's transaction if it is still open: a commit naming the resource
        # is seen here (READ COMMITTED re-reads the row).
        taken = session.execute(update(IdempotencyKey).where(
            IdempotencyKey.tenant == tenant, IdempotencyKey.key == key, IdempotencyKey.state == "running",
            IdempotencyKey.claim.is_(None) if dead.claim is None else IdempotencyKey.claim == dead.claim)
            .values(owner=owner, claim=claim, locked_until=now + LOCK).returning(IdempotencyKey.resource)).one_or_none()
        session.commit()
    return (False, None) if taken is None else (True, taken[0])


def _store(sessions: sessionmaker[Session], *, tenant: str, key: str, claim: str, status: int,
           body: dict[str, Any]) -> None:
    with sessions() as session:
        session.execute(update(IdempotencyKey).where(
            IdempotencyKey.tenant == tenant, IdempotencyKey.key == key, IdempotencyKey.claim == claim)
            .values(state="done", response_status=status, response_body=body))
        session.commit()


def _abandon(sessions: sessionmaker[Session], *, tenant: str, key: str, claim: str) -> None:
    """Best effort, after a failure once the resource exists: the key keeps naming it, and the next
    retry takes it over at once (no owner, lock passed) and answers it."""
    try:
        with sessions() as session:
            session.execute(update(IdempotencyKey).where(
                IdempotencyKey.tenant == tenant, IdempotencyKey.key == key, IdempotencyKey.claim == claim)
                .values(owner=None, locked_until=utcnow()))
            session.commit()
    except Exception:  # the database is down: the key waits for LOCK
        log.warning("Idempotency-Key %r: could not hand its key over after a failure", key, exc_info=True)


def _run_as_owner(sessions: sessionmaker[Session], session: Session, *, tenant: str, key: str, claim: str,
                  kind: str, status: int, action: Callable[[], dict[str, Any]]) -> JSONResponse | None:
    """`action()` fenced by `claim`; None when the key was taken over meanwhile. A failure after the
    resource was committed keeps the key (a retry answers that resource); before it, frees it."""
    fence = Fence(tenant=tenant, key=key, claim=claim, kind=kind)
    try:
        with fence.watching(session):
            body = action()
    except KeyTakenOver:
        session.rollback()
        return None
    except BaseException:
        if fence.named:
            _abandon(sessions, tenant=tenant, key=key, claim=claim)
            raise
        with sessions() as other:
            other.execute(delete(IdempotencyKey).where(IdempotencyKey.tenant == tenant, IdempotencyKey.key == key,
                                                       IdempotencyKey.claim == claim))
            other.commit()
        raise
    try:
        _store(sessions, tenant=tenant, key=key, claim=claim, status=status, body=body)
    except BaseException:
        _abandon(sessions, tenant=tenant, key=key, claim=claim)
        raise
    return JSONResponse(body, status_code=status)


def _resume(sessions: sessionmaker[Session], *, tenant: str, key: str, claim: str, status: int, resource: str,
            resume: Callable[[str], dict[str, Any]]) -> JSONResponse:
    try:
        body = resume(resource.split(":", 1)[1])
        _store(sessions, tenant=tenant, key=key, claim=claim, status=status, body=body)
    except BaseException:
        _abandon(sessions, tenant=tenant, key=key, claim=claim)
        raise
    return JSONResponse(body, status_code=status, headers={"Idempotent-Replayed": "true"})


async def run_once(sessions: sessionmaker[Session], session: Session, *, owner: Owner, tenant: str,
                   key: str | None, fingerprint_of: Callable[[], str], status: int, kind: str,
                   action: Callable[[], dict[str, Any]], resume: Callable[[str], dict[str, Any]]) -> JSONResponse:
    """`action()`'s JSON as the response, run at most once per (tenant, key), on a pool thread with
    `session` (the route's: the one `action` creates its `kind` of resource on, a key of
    `RESOURCES`' values). `resume(id)`: the response for the resource a dead owner committed, as
    it stands now. The request's fingerprint is only computed when there is a key."""
    if key is None:
        return JSONResponse(await run_in_threadpool(action), status_code=status)
    check_key(key)
    fp = await run_in_threadpool(fingerprint_of)
    me = await run_in_threadpool(owner.number)
    run = partial(_run_as_owner, sessions, session, tenant=tenant, key=key, kind=kind, status=status, action=action)
    deadline = time.monotonic() + WAIT_S
    pause, owner_check_at, free = POLL_S, 0.0, True
    while True:
        if free:  # try to be the owner
            claim = secrets.token_hex(16)
            if await run_in_threadpool(partial(_claim, sessions, tenant=tenant, key=key, fp=fp, owner=me,
                                               claim=claim)):
                if (done := await run_in_threadpool(partial(run, claim=claim))) is not None:
                    return done
                # taken over while it ran: answer what the new owner answers
        check = time.monotonic() >= owner_check_at
        seen = await run_in_threadpool(partial(_look, sessions, tenant=tenant, key=key, fp=fp, check_owner=check))
        if check:
            owner_check_at = time.monotonic() + OWNER_CHECK_S
        if isinstance(seen, JSONResponse):
            return seen
        free = seen == FREE
        if isinstance(seen, _Dead):
            claim = secrets.token_hex(16)
            taken, resource = await run_in_threadpool(partial(_take_over, sessions, tenant=tenant, key=key,
                                                              dead=seen, owner=me, claim=claim))
            if taken and resource is not None:
                return await run_in_threadpool(partial(_resume, sessions, tenant=tenant, key=key, claim=claim,
                                                       status=status, resource=resource, resume=resume))
            if taken and (done := await run_in_threadpool(partial(run, claim=claim))) is not None:
                return done
            continue
        if free:
            continue
        if time.monotonic() > deadline:
            raise ConflictError(f"a request with Idempotency-Key {key!r} is still running after "
                                f"{WAIT_S:.0f} s; retry later with the same key")
        await asyncio.sleep(pause)
        pause = min(pause * 1.5, POLL_MAX_S)
