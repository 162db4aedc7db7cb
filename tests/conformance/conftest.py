"""The pipeline tests' service fixtures (tests/pipeline/conftest.py), for a test that needs the real
Postgres, Redis and moto but no worker and no state another test shares: a database, a moto
server and a Redis server of its own, so it runs beside the other tests rather than in the
serial server phase."""

from tests.pipeline.conftest import (  # noqa: F401 - fixtures
    pg_url,
    pipeline_env,
    quiet_redis,
    redis_server,
    redis_url,
    s3,
    s3_server,
)
