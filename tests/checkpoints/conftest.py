"""The checkpoint tests' registry: a migrated SQLite database and a local store that records its writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from yue2_jobs.db.migrate import upgrade_head
from yue2_jobs.db.session import session_factory
from yue2_jobs.storage import LocalStorage


class RecordingStore(LocalStorage):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.order: list[str] = []

    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> None:
        self.order.append(key)
        super().put(key, data, content_type=content_type)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Any]:
    """(session, store, store URL, tmp_path)."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_head(url)
    session = session_factory(url)()
    store = RecordingStore(tmp_path / "store")
    yield session, store, (tmp_path / "store").resolve().as_uri(), tmp_path
    session.close()
