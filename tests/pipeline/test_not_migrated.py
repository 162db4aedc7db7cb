"""A Postgres database that was never migrated (the newcomer's first hour: `yue2 apikey create`
before `yue2 migrate`): the CLI says to run `yue2 migrate` in one line, and the API answers 503
saying the same, where Postgres reports `relation "api_keys" does not exist`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.pipeline.conftest import temporary_pg_database
from yue2_jobs.api.app import create_app
from yue2_jobs.cli import main
from yue2_jobs.core.config import Settings

MIGRATE = "the database has no yue2-jobs tables: run `yue2 migrate` first"


def test_an_unmigrated_postgres_says_run_migrate(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    with temporary_pg_database("yue2_fresh") as url:
        monkeypatch.setenv("YUE2_DATABASE_URL", url)
        assert main(["apikey", "create", "--tenant", "acme"]) == 2
        assert capsys.readouterr().err == f"yue2: error: {MIGRATE}\n"
        with TestClient(create_app(Settings(home=tmp_path, database_url=url))) as client:
            r = client.get("/v1/batches", headers={"Authorization": "Bearer yk-any"})
            assert r.status_code == 503 and r.json()["error"]["message"] == MIGRATE
            assert MIGRATE in client.get("/healthz").json()["database"]
