"""`Idempotency-Key` on the POSTs that create things (jobs, batches, files).

The first request with a key runs; its response is stored with a fingerprint of the request
(method, path, body). A retry with the same key and body gets that response back, also while the
first is still running (it waits for it); the same key with another body is a 409. Keys are per
tenant and kept 24 h; a failed first request (an error of any kind) leaves no key behind, so its
retry runs afresh.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

from fastapi import Header
from fastapi.responses import JSONResponse
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.db.models_api import IdempotencyKey
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import ConflictError, InvalidRequestError

KEEP = timedelta(hours=24)
LOCK = timedelta(minutes=10)  # longer than any create takes; a `running` key older than this was orphaned
WAIT_S = 120.0  # how long a retry waits for the first request before a 409 tells it to come back
POLL_S = 0.05
MAX_KEY_CHARS = 255
IdempotencyKeyHeader = Annotated[str | None, Header(alias="Idempotency-Key")]


def fingerprint(method: str, path: str, body: Any) -> str:
    """sha256 of the request; `body` is parsed JSON (hashed canonically) or bytes."""
    raw = body if isinstance(body, bytes) else json.dumps(body, sort_keys=True).encode()  # ASCII: lone surrogates too
    return hashlib.sha256(f"{method} {path}\n".encode() + raw).hexdigest()


def check_key(key: str) -> str:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not all("!" <= ch <= "~" for ch in key):
        raise InvalidRequestError(f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} printable ASCII characters "
                                  f"without spaces", field="Idempotency-Key", status=400)
    return key


def _free(now: Any) -> Any:
    """SQL: the key may be taken again (past its 24 h, or left `running` by a crashed request)."""
    return (IdempotencyKey.expires_at < now) | ((IdempotencyKey.state == "running")
                                               & (IdempotencyKey.locked_until < now))


def _claim(session: Session, *, tenant: str, key: str, fp: str) -> bool:
    now = utcnow()
    session.execute(delete(IdempotencyKey).where(IdempotencyKey.tenant == tenant, IdempotencyKey.key == key,
                                                 _free(now)))
    session.add(IdempotencyKey(tenant=tenant, key=key, fingerprint=fp, state="running", created_at=now,
                               locked_until=now + LOCK, expires_at=now + KEEP))
    try:
        session.commit()
        return True
    except IntegrityError:
        session.rollback()
        return False


def _stored(session: Session, *, tenant: str, key: str) -> tuple[IdempotencyKey, bool] | None:
    """The key's row and whether it is free again (expired, or orphaned while running)."""
    session.expire_all()
    found = session.execute(select(IdempotencyKey, _free(utcnow())).where(IdempotencyKey.tenant == tenant,
                                                                IdempotencyKey.key == key)).one_or_none()
    return None if found is None else (found[0], bool(found[1]))


def _replay_or_wait(sessions: sessionmaker[Session], *, tenant: str, key: str, fp: str) -> JSONResponse | None:
    """The stored response; None once the key is free (the first request failed or expired).

    Each look at the row is a session of its own, closed before the pause: a waiting twin holds no
    pooled connection between looks (35 retries of one stuck key once held the whole pool), and
    the tenant's in-flight limit (`deps.InFlight`) bounds how many threads its twins can hold."""
    deadline = time.monotonic() + WAIT_S
    pause = threading.Event()  # never set: waits POLL_S between looks at the row
    while True:
        with sessions() as session:
            found = _stored(session, tenant=tenant, key=key)
            if found is None or found[1]:
                return None
            row = found[0]
            if row.fingerprint != fp:
                raise ConflictError(f"Idempotency-Key {key!r} was already used with a different request; "
                                    f"use a new key for a new request")
            if row.state == "done":
                return JSONResponse(row.response_body, status_code=row.response_status or 200,
                                    headers={"Idempotent-Replayed": "true"})
        if time.monotonic() > deadline:
            raise ConflictError(f"a request with Idempotency-Key {key!r} is still running after "
                                f"{WAIT_S:.0f} s; retry later with the same key")
        pause.wait(POLL_S)


def run_once(sessions: sessionmaker[Session], *, tenant: str, key: str | None, fingerprint_of: Callable[[], str],
             status: int, action: Callable[[], dict[str, Any]]) -> JSONResponse:
    """`action()`'s JSON as the response, run at most once per (tenant, key). The request's
    fingerprint is only computed when there is a key."""
    if key is None:
        return JSONResponse(action(), status_code=status)
    check_key(key)
    fp = fingerprint_of()
    while True:
        with sessions() as session:
            claimed = _claim(session, tenant=tenant, key=key, fp=fp)
        if not claimed:
            replay = _replay_or_wait(sessions, tenant=tenant, key=key, fp=fp)
            if replay is not None:
                return replay
            continue  # the key came free: try to claim it
        try:
            body = action()
        except BaseException:
            with sessions() as session:
                session.execute(delete(IdempotencyKey).where(IdempotencyKey.tenant == tenant,
                                                             IdempotencyKey.key == key))
                session.commit()
            raise
        with sessions() as session:
            session.execute(update(IdempotencyKey).where(IdempotencyKey.tenant == tenant, IdempotencyKey.key == key)
                            .values(state="done", response_status=status, response_body=body))
            session.commit()
        return JSONResponse(body, status_code=status)

