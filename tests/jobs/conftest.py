"""The API on the embedded stack (SQLite, a local directory) for the console's reads: a client
with tenant `acme`'s key, the sessions behind it, and `submit` to create a batch from lines."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from yue2_jobs.api.app import create_app
from yue2_jobs.auth import create_api_key
from yue2_jobs.core.config import Settings
from yue2_jobs.db.migrate import upgrade_head
from yue2_jobs.db.session import session_factory

Submit = Callable[..., str]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, Any]]:
    settings = Settings(home=tmp_path)
    upgrade_head(settings.resolved_database_url)
    sessions = session_factory(settings.resolved_database_url)
    with sessions() as session:
        key = create_api_key(session, tenant="acme")
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
        yield client, sessions


@pytest.fixture
def submit(api: tuple[TestClient, Any]) -> Submit:
    """`submit(lines, metadata=None, client=None)`: a new batch of `lines`, its id."""
    def create(lines: list[dict[str, Any]], metadata: dict[str, str] | None = None,
               client: TestClient | None = None) -> str:
        client = client or api[0]
        data = "".join(json.dumps(ln) + "\n" for ln in lines).encode()
        f = client.post("/v1/files", data={"purpose": "batch"},
                        files={"file": ("in.jsonl", data, "application/jsonl")})
        r = client.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/summarize",
                                             "metadata": metadata})
        assert r.status_code == 200, r.text
        return str(r.json()["id"])

    return create
