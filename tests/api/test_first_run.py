"""What a newcomer's first requests meet on the embedded stack (no server): a database never
migrated is a 503 that says to run `yue2 migrate`, /healthz checks the database, broker and storage
and names what is wrong, and a path without /v1 (an OpenAI client whose base_url lacks it) says so."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from yue2_jobs.api.app import create_app
from yue2_jobs.core.config import Settings
from yue2_jobs.db.migrate import upgrade_head


def test_a_database_never_migrated_is_a_503_saying_run_migrate(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(home=tmp_path))) as client:
        r = client.post("/v1/jobs", json={"input": "x"}, headers={"Authorization": "Bearer sk-unknown"})
        assert r.status_code == 503 and "run `yue2 migrate`" in r.json()["error"]["message"], r.text
        health = client.get("/healthz")
        assert health.status_code == 503 and "run `yue2 migrate`" in health.json()["database"]


def test_healthz_checks_storage_and_names_the_problem(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    upgrade_head(settings.resolved_database_url)
    with TestClient(create_app(settings)) as client:
        health = client.get("/healthz")
        assert health.status_code == 200 and health.json()["storage"] == "ok", health.text
        root = Path(client.app.state.yue2.storage.root)  # type: ignore[attr-defined]
        root.rmdir()  # empty: nothing was stored yet
        root.write_text("not a directory")
        health = client.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        # What is wrong, without the path: /healthz answers anyone (the log has the path).
        assert health.json()["storage"].startswith("error: the storage directory does not exist")
        assert str(root) not in health.text


def test_a_path_without_v1_says_so(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(home=tmp_path))) as client:
        r = client.get("/batches")
        assert r.status_code == 404
        message = r.json()["error"]["message"]
        assert "API paths start with /v1 (did you mean /v1/batches?)" in message and "base_url" in message
        assert "see /docs" in client.get("/v1/nothing-here").json()["error"]["message"]
