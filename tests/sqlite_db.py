"""A migrated SQLite database per test module (the embedded mode's engine), for the fast unit
tests of the data layer and the API; their conftests take these fixtures. Postgres-specific
behaviour is tested under tests/pipeline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.db.migrate import upgrade_head
from yue2_jobs.db.session import session_factory


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> sessionmaker[Session]:
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('db')) / 'yue2.db'}"
    upgrade_head(url)
    return session_factory(url)


@pytest.fixture
def session(sessions: sessionmaker[Session]) -> Iterator[Session]:
    with sessions() as s:
        yield s
