"""Alembic migrations on an empty Postgres (the real server): down and up again, models and
migrations agree (the SQLite round trip and `yue2 migrate` are tests/db/test_migrations.py)."""

from __future__ import annotations

from tests.db.test_migrations import check_round_trip
from tests.pipeline.conftest import temporary_pg_database


def test_migrations_on_empty_postgres() -> None:
    with temporary_pg_database("yue2_mig") as url:
        check_round_trip(url)
