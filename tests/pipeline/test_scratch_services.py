"""The pipeline tests run on databases this run created: a Postgres database made for it (not the
server's own, nor one another run made) and its own Redis server (tests/scratch_redis.py), unless
YUE2_TEST_REDIS names a Redis database for them."""

from __future__ import annotations

import os

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.pipeline.conftest import PG_ADMIN_URL
from tests.scratch_redis import NAMED_ENV, ScratchRedis, is_scratch


def test_the_pipeline_runs_on_a_postgres_database_and_a_redis_server_of_the_runs_own(
        pipeline_env: dict[str, str], pg_url: str, redis_server: ScratchRedis) -> None:
    database = make_url(pipeline_env["YUE2_DATABASE_URL"]).database
    assert pipeline_env["YUE2_DATABASE_URL"] == pg_url and database != make_url(PG_ADMIN_URL).database
    assert database is not None and database.startswith("yue2_test_")  # temporary_pg_database's name
    admin = create_engine(PG_ADMIN_URL)
    with admin.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pg_database WHERE datname = :n"), {"n": database}).scalar() == 1
    admin.dispose()
    broker = pipeline_env["YUE2_BROKER_URL"]
    if os.environ.get(NAMED_ENV):
        assert broker == os.environ[NAMED_ENV]
    else:
        assert broker == redis_server.url(0) and is_scratch(broker)
        assert redis_server.proc.poll() is None  # started by this process, running
