"""Real services for the pipeline tests: Postgres on 127.0.0.1, a Redis server of the run's own
(tests/scratch_redis.py), S3 from a moto server over HTTP, the API on uvicorn in a thread, workers
as subprocesses (so they can be SIGKILLed).

Every database a test writes is one the run created: Postgres databases made here and dropped
after (`temporary_pg_database`), the Redis server started here (every database of it, flushed at
will). Each test process has its own: pytest-xdist's workers each start theirs. A test that
restarts Postgres restarts one of its own (tests/private_postgres.py), never the machine's.
`YUE2_TEST_REDIS` names a Redis database to use (and empty) instead of the scratch server's database 0.
A missing Postgres or redis-server skips these tests locally and fails them under CI=true.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.scratch_redis import NAMED_ENV, ScratchRedis, ScratchRedisError
from yue2_jobs.core.net import free_port

ROOT = Path(__file__).resolve().parents[2]
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto logs every request
PG_ADMIN_URL = os.environ.get("YUE2_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def service_unavailable(what: str, exc: BaseException) -> NoReturn:
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: real-service tests must run)")
    pytest.skip(message)


def wait_for(condition: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `condition` until it returns something truthy; fail the test naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def temporary_pg_database(prefix: str) -> Iterator[str]:
    """A new, empty database on the real Postgres, dropped afterwards; yields its URL."""
    from sqlalchemy import create_engine, text

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        service_unavailable("Postgres at 127.0.0.1:5432", exc)
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        from yue2_jobs.db.session import engine_for

        engine_for(url).dispose()
        admin.dispose()  # a fresh connection for the DROP: the pooled one may have timed out
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    with temporary_pg_database("yue2_test") as url:
        yield url


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ScratchRedis]:
    try:
        server = ScratchRedis.start()
    except ScratchRedisError as exc:
        service_unavailable("a Redis server of the run's own", exc)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """The pipeline's broker: database 0 of the run's Redis server, or the one YUE2_TEST_REDIS names."""
    import redis

    named = os.environ.get(NAMED_ENV)
    if not named:
        return str(request.getfixturevalue("redis_server").url(0))
    try:
        redis.Redis.from_url(named, socket_connect_timeout=2).ping()
    except Exception as exc:
        service_unavailable(f"Redis at {named} ({NAMED_ENV})", exc)
    return named


@pytest.fixture(scope="session")
def quiet_redis(redis_server: ScratchRedis) -> Callable[[int], str]:
    """The URL of database `n` (1-15) of the run's Redis server: for an API whose messages no
    worker may read (workers read `redis_url`), emptied by its test with `flush`. Always the run's
    own server, YUE2_TEST_REDIS or not: that names one database, and these are others."""
    def url(n: int) -> str:
        assert 0 < n < 16, "database 0 is the pipeline's, and a server has 16"
        return redis_server.url(n)

    return url


class S3Server:
    """A moto S3 server on a fixed free port, reached over HTTP like any S3 endpoint. `stop` and
    `start` make an outage: moto keeps its objects in this process, so they survive it."""

    def __init__(self) -> None:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server: Any = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3(s3_server: S3Server) -> dict[str, str]:
    import boto3

    boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1").create_bucket(Bucket="yue2-test")
    return {"endpoint": s3_server.endpoint, "bucket": "yue2-test"}


@pytest.fixture(scope="session")
def pipeline_env(pg_url: str, redis_url: str, s3: dict[str, str], tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, str]:
    """YUE2_* settings every process of a pipeline test shares (short leases so recovery is quick)."""
    return stack_env(database_url=pg_url, broker_url=redis_url, s3=s3, home=tmp_path_factory.mktemp("yue2home"))


def stack_env(*, database_url: str, broker_url: str, s3: dict[str, str], home: Path) -> dict[str, str]:
    """The settings of a pipeline stack on these services, its database migrated: the session's
    (`pipeline_env`), or a test's own (the chaos test's, on a Postgres it restarts)."""
    from yue2_jobs.db.migrate import upgrade_head

    upgrade_head(database_url)
    return {
        "YUE2_HOME": str(home),
        "YUE2_DATABASE_URL": database_url,
        "YUE2_BROKER_URL": broker_url,
        "YUE2_STORAGE_URL": f"s3://{s3['bucket']}/out",
        "YUE2_S3_ENDPOINT_URL": s3["endpoint"],
        "YUE2_LEASE_S": "2",
        "YUE2_VISIBILITY_TIMEOUT_S": "3600",
        "YUE2_RECONCILE_INTERVAL_S": "0.5",
        "YUE2_RECONCILE_GRACE_S": "1",
        "YUE2_BATCH_FLUSH_MS": "50",
        "YUE2_TORCH_THREADS": "1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }


@pytest.fixture(autouse=True)
def no_job_left_queued(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test's jobs that no worker ran (an API on a Redis database no worker reads) stay `queued`
    in the tests' shared database, and a later test's worker would run them (the reconciler
    republishes them, fair share starts them) and count them: each test's leftovers are cancelled
    after it."""
    yield
    if "pipeline_env" not in request.fixturenames:
        return
    from sqlalchemy import update

    from yue2_jobs.db.models import Job, JobStatus
    from yue2_jobs.db.session import session_factory, utcnow

    url = request.getfixturevalue("pipeline_env")["YUE2_DATABASE_URL"]
    with contextlib.suppress(Exception), session_factory(url)() as session:  # down: nothing runs them either
        session.execute(update(Job).where(Job.status == JobStatus.QUEUED)
                        .values(status=JobStatus.CANCELLED, finished_at=utcnow()))
        session.commit()


def make_settings(env: dict[str, str], **overrides: Any) -> Any:
    from yue2_jobs.core.config import Settings

    values = {k.removeprefix("YUE2_").lower(): v for k, v in env.items() if k.startswith("YUE2_")}
    return Settings(**{**values, **overrides})


@pytest.fixture(scope="session")
def settings(pipeline_env: dict[str, str]) -> Any:
    return make_settings(pipeline_env)


class ApiServer:
    def __init__(self, settings: Any) -> None:
        import uvicorn

        from yue2_jobs.api.app import create_app
        from yue2_jobs.api.server import config

        self.app = create_app(settings)
        self.port = free_port()
        self.server = uvicorn.Server(config(self.app, settings, host="127.0.0.1", port=self.port))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=20, what="the API server to start")
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="session")
def api(settings: Any) -> Iterator[ApiServer]:
    server = ApiServer(settings)
    yield server
    server.stop()


def new_key(settings: Any, tenant: str) -> str:
    from yue2_jobs.auth import create_api_key
    from yue2_jobs.db.session import session_factory

    with session_factory(settings.resolved_database_url)() as session:
        return create_api_key(session, tenant=tenant)


class Worker:
    """`yue2 worker` in a subprocess; its log goes to a file for the failure message."""

    def __init__(self, env: dict[str, str], log_dir: Path, *args: str, **extra_env: str) -> None:
        self.env = {**os.environ, **env, **extra_env}
        self.args = list(args)
        self.log = log_dir / f"worker-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        self.proc = subprocess.Popen([sys.executable, "-m", "workers", *self.args], cwd=ROOT, env=self.env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@contextlib.contextmanager
def worker_pool(env: dict[str, str], log_dir: Path) -> Iterator[Callable[..., Worker]]:
    """`start(*args, **extra_env)` starts a Worker on `env`; every one started is stopped at the end."""
    started: list[Worker] = []

    def start(*args: str, **extra_env: str) -> Worker:
        w = Worker(env, log_dir, *args, **extra_env).start()
        started.append(w)
        return w

    try:
        yield start
    finally:
        for w in started:
            w.stop()


@pytest.fixture
def workers(pipeline_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with worker_pool(pipeline_env, tmp_path) as start:
        yield start


@pytest.fixture(scope="session")
def eval_texts() -> list[str]:
    from yue2_jobs.training.data import read_split

    return [r["text"] for r in read_split(ROOT / "data", "general", "eval")]


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(api: Any, settings: Any, tenant: str) -> Any:
    from yue2_jobs.client import Client

    return Client(api.url, new_key(settings, tenant))
