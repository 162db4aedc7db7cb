"""Typed dependencies of the routes: settings, a database session, storage, the publisher, the tenant."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from celery import Celery
from fastapi import Depends, Header, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.api.job_reader import JobReader
from yue2_jobs.auth import cached_tenant, tenant_for_key
from yue2_jobs.core.config import Settings
from yue2_jobs.errors import AuthError
from yue2_jobs.storage import Storage


@dataclass
class AppState:
    settings: Settings
    sessions: sessionmaker[Session]
    storage: Storage
    celery: Celery
    job_reader: JobReader


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
                     authorization: Annotated[str | None, Header()] = None) -> str:
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
TenantDep = Annotated[str, Depends(get_tenant)]
