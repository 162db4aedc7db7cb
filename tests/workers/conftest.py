"""A migrated SQLite database per test module (`tests.sqlite_db`), and worker contexts on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.sqlite_db import session, sessions  # noqa: F401 - fixtures
from tests.workers.fakes import make_ctx, stop
from workers.context import WorkerContext
from workers.protocol import Runner


@pytest.fixture
def worker_context(tmp_path: Path, sessions: sessionmaker[Session]  # noqa: F811
                   ) -> Iterator[Callable[..., WorkerContext]]:
    """`worker_context(runner, **settings)`: a worker's context on the module's database, with a
    directory of its own (`tests.workers.fakes.make_ctx`); each is stopped after the test."""
    made: list[WorkerContext] = []

    def make(runner: Runner, **settings: Any) -> WorkerContext:
        ctx = make_ctx(tmp_path / f"worker-{len(made)}", sessions, runner, **settings)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        stop(ctx)
