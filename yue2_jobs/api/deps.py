"""Typed dependencies of the routes: settings, a database session, storage, the publisher, the tenant."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from celery import Celery
from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.auth import tenant_for_key
from yue2_jobs.core.config import Settings
from yue2_jobs.storage import Storage


@dataclass
class AppState:
    settings: Settings
    sessions: sessionmaker[Session]
    storage: Storage
    celery: Celery


def get_state(request: Request) -> AppState:
    return request.app.state.yue2  # type: ignore[no-any-return]


def get_session(state: Annotated[AppState, Depends(get_state)]) -> Iterator[Session]:
    with state.sessions() as session:
        yield session


def get_tenant(session: Annotated[Session, Depends(get_session)],
               authorization: Annotated[str | None, Header()] = None) -> str:
    secret = authorization.removeprefix("Bearer ").strip() if authorization else None
    return tenant_for_key(session, secret)


StateDep = Annotated[AppState, Depends(get_state)]
SessionDep = Annotated[Session, Depends(get_session)]
TenantDep = Annotated[str, Depends(get_tenant)]
