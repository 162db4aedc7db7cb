"""Typed dependencies of the routes: settings, a database session, storage, the publisher, the tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Annotated

from celery import Celery
from fastapi import Depends, Header, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.api.idempotency import Owner
from yue2_jobs.api.job_reader import JobReader
from yue2_jobs.auth import cached_tenant, tenant_for_key
from yue2_jobs.core.config import Settings
from yue2_jobs.errors import AuthError, TooManyRequestsError
from yue2_jobs.storage import Storage


class InFlight:
    """Requests in flight per tenant in this API process. Counted on the event loop only (the
    tenant dependency is async, its exit too), so it needs no lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: dict[str, int] = {}

    def enter(self, tenant: str) -> None:
        n = self.counts.get(tenant, 0)
        if n >= self.limit:
            raise TooManyRequestsError(f"this tenant has {n} requests in flight, the limit of "
                                       f"YUE2_TENANT_MAX_IN_FLIGHT ({self.limit}); retry after Retry-After seconds",
                                       retry_after_s=1)
        self.counts[tenant] = n + 1

    def leave(self, tenant: str) -> None:
        n = self.counts.pop(tenant) - 1
        if n:
            self.counts[tenant] = n


@dataclass
class AppState:
    settings: Settings
    sessions: sessionmaker[Session]
    storage: Storage
    celery: Celery
    job_reader: JobReader
    in_flight: InFlight
    owner: Owner  # this process, as the owner of the Idempotency-Keys it runs


async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.yue2
    return state


def get_session(state: Annotated[AppState, Depends(get_state)]) -> Iterator[Session]:
    with state.sessions() as session:
        yield session


def _lookup_tenant(sessions: sessionmaker[Session], secret: str | None) -> str:
    with sessions() as session:
        return tenant_for_key(session, secret)


async def get_tenant(state: Annotated[AppState, Depends(get_state)],
                     authorization: Annotated[str | None, Header()] = None) -> AsyncIterator[str]:
    """The caller's tenant, holding one of its in-flight slots while the route runs (429 when none
    is free): a tenant's pile of retries waits at its own door, not in the thread pool and the
    database pool every tenant shares."""
    tenant = await _authenticated(state, authorization)
    state.in_flight.enter(tenant)
    try:
        yield tenant
    finally:
        state.in_flight.leave(tenant)


async def _authenticated(state: AppState, authorization: str | None) -> str:
    # async, so that a cached key costs no trip through the thread pool
    if authorization is None:
        raise AuthError("no API key: send `Authorization: Bearer <key>`")
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise AuthError("the Authorization header must be `Bearer <key>`")
    secret = secret.strip()
    cached = cached_tenant(secret)
    if cached is not None:
        return cached
    return await run_in_threadpool(_lookup_tenant, state.sessions, secret)


StateDep = Annotated[AppState, Depends(get_state)]
SessionDep = Annotated[Session, Depends(get_session)]
# scope="function": the slot is given back when the route returns, not once its response is sent, so
# a slow client reading a streamed output file does not hold one of its tenant's slots meanwhile.
TenantDep = Annotated[str, Depends(get_tenant, scope="function")]
