"""Alembic migrations on SQLite, down and up again; models and migrations agree (`check_round_trip`,
which tests/pipeline/test_migrations_postgres.py runs on an empty Postgres too); `yue2 migrate`."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from yue2_jobs.db import models_api  # noqa: F401  (its tables are part of Base.metadata)
from yue2_jobs.db.migrate import alembic_config, upgrade_head
from yue2_jobs.db.models import Base

TABLES = {"alembic_version", "api_keys", "batches", "checkpoint_versions", "checkpoint_activations", "experiments",
          "files", "jobs",
          "worker_processes", "worker_placements", "idempotency_keys", "webhook_endpoints", "webhook_deliveries"}


def check_round_trip(url: str) -> None:
    upgrade_head(url)
    engine = create_engine(url)
    assert set(inspect(engine).get_table_names()) == TABLES
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"
    command.downgrade(alembic_config(url), "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade_head(url)  # and up again
    assert set(inspect(engine).get_table_names()) == TABLES
    engine.dispose()


def test_migrations_on_sqlite(tmp_path: Path) -> None:
    check_round_trip(f"sqlite:///{tmp_path / 'yue2.db'}")


def test_yue2_migrate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from yue2_jobs.cli import main

    monkeypatch.setenv("YUE2_HOME", str(tmp_path))
    assert main(["migrate"]) == 0
    assert "database at head" in capsys.readouterr().out
    assert (tmp_path / "yue2.db").exists()
