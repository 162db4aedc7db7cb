"""The shared services of the two-host test, each on the `services` host's address: a Postgres
of its own (`initdb` into a temporary directory, run as the postgres user: tests/private_postgres.py),
Redis and moto."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.distributed.netns import SUBNET, Host
from tests.pipeline.conftest import wait_for
from tests.private_postgres import init_data_dir, is_ready, pg_bin, server_argv

PG_PORT, REDIS_PORT, S3_PORT = 5432, 6379, 5000
BUCKET = "yue2-dist"


@dataclass
class Services:
    host: Host
    pg_dir: Path

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.host.addr}:{PG_PORT}/yue2"

    @property
    def broker_url(self) -> str:
        return f"redis://{self.host.addr}:{REDIS_PORT}/0"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.host.addr}:{S3_PORT}"

    def cleanup(self) -> None:
        shutil.rmtree(self.pg_dir, ignore_errors=True)


def start_services(host: Host, *, logs: Path, env: dict[str, str]) -> Services:
    # The postgres user must reach the data directory: not under pytest's root-only tmp tree.
    pg_dir = Path(tempfile.mkdtemp(prefix="yue2-dist-pg-"))
    services = Services(host=host, pg_dir=pg_dir)
    data = init_data_dir(pg_dir)
    with (data / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all {SUBNET}.0/24 trust\n")
    # Under runuser: `ip netns exec` runs what it is given as root, and postgres refuses root.
    host.popen(["runuser", "-u", "postgres", "--", *server_argv(data, host=host.addr, port=PG_PORT, socket_dir=pg_dir)],
               env=env, log=logs / "postgres.log")
    host.popen(["redis-server", "--bind", host.addr, "--port", str(REDIS_PORT), "--save", "", "--appendonly", "no",
                "--protected-mode", "no"], env=env, log=logs / "redis.log")
    host.popen([str(Path(sys.executable).with_name("moto_server")), "-H", host.addr, "-p", str(S3_PORT)],
               env=env, log=logs / "moto.log")

    wait_for(lambda: is_ready(host.addr, PG_PORT), timeout=60, what="Postgres on the services host", interval=0.2)
    subprocess.run(["runuser", "-u", "postgres", "--", pg_bin("createdb"), "-h", host.addr, "-p", str(PG_PORT),
                    "yue2"], check=True, capture_output=True)

    import boto3
    import redis

    wait_for(lambda: _answers(lambda: redis.Redis.from_url(services.broker_url, socket_timeout=1).ping()),
             timeout=30, what="Redis on the services host")
    s3 = boto3.client("s3", endpoint_url=services.s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    wait_for(lambda: _answers(lambda: s3.list_buckets()), timeout=60, what="moto on the services host")
    s3.create_bucket(Bucket=BUCKET)
    return services


def _answers(call: object) -> bool:
    try:
        call()  # type: ignore[operator]
    except Exception:
        return False
    return True
