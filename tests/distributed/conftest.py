"""The two-host cluster: network namespaces on one machine, each a host with one link to a switch.

    services  198.51.100.1   Postgres (its own initdb), Redis, moto (S3)
    api       198.51.100.2   `yue2 api` (the first API process) and `yue2 watchdog`
    host-a    198.51.100.3   `yue2-worker --variant base` and `--variant legal`, a second `yue2 api`
    host-b    198.51.100.4   `yue2-worker --variant base`
    (test)    198.51.100.254 the test process, on a veth pair of its own

Worker and API hosts have their own hostname, pid namespace and YUE2_HOME (no shared disk): the
checkpoint store and the outputs are on S3. Building it needs root; under CI=true a refusal fails
the test, elsewhere it skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.netns import Host, Network
from tests.distributed.services import BUCKET, Services, start_services
from tests.pipeline.conftest import wait_for

# Peer timeouts of every Postgres connection (db.session.PEER_TIMEOUTS), short so the test's
# failovers take seconds: both ends drop a silent peer after about tcp_user_timeout, 3 s.
QUICK_PEERS = "keepalives_idle=1&keepalives_interval=1&keepalives_count=2&tcp_user_timeout=3000"
API_PORT = 8000


@dataclass
class Cluster:
    net: Network
    services: Services
    hosts: dict[str, Host]
    logs: Path
    base_env: dict[str, str]
    homes: dict[str, Path] = field(default_factory=dict)

    @property
    def database_url(self) -> str:
        return f"{self.services.database_url}?{QUICK_PEERS}"

    def env(self, host: str, **extra: str) -> dict[str, str]:
        """A process's environment on `host`: the shared settings and a YUE2_HOME of its own."""
        home = self.homes.setdefault(host, Path(self.logs / f"home-{host}"))
        home.mkdir(exist_ok=True)
        return {**self.base_env, "YUE2_HOME": str(home), **extra}

    def start(self, host: str, what: str, argv: list[str], **extra: str) -> Any:
        return self.hosts[host].popen([sys.executable, *argv], env=self.env(host, **extra),
                                      log=self.logs / f"{host}-{what}.log")

    def api_url(self, host: str) -> str:
        return f"http://{self.hosts[host].addr}:{API_PORT}"

    def start_api(self, host: str) -> None:
        self.start(host, "api", ["-m", "yue2_jobs", "api", "--host", self.hosts[host].addr, "--port", str(API_PORT)])

    def log_tail(self, *names: str, chars: int = 2500) -> str:
        out = []
        for path in sorted(self.logs.glob("*.log")):
            if not names or any(n in path.name for n in names):
                out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(out)


def _clean_environ() -> dict[str, str]:
    """This process's environment without its YUE2_* settings (the cluster's are all explicit)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}


def _refused(what: str, exc: BaseException) -> None:
    message = f"cannot build the two-host network ({what}): {exc}"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: this test must run)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        _refused("not root", PermissionError("network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN"))
    for tool in ("ip", "unshare", "runuser", "redis-server", "ss"):
        if shutil.which(tool) is None:
            _refused(tool, FileNotFoundError(f"{tool} is not installed"))
    own_pids = subprocess.run(["unshare", "--uts", "--pid", "--fork", "--mount", "--mount-proc", "true"],
                              capture_output=True, text=True)
    if own_pids.returncode != 0:
        _refused("unshare --pid --mount-proc", RuntimeError(own_pids.stderr.strip()))
    logs = tmp_path_factory.mktemp("two-hosts")
    net = Network()
    try:
        net.create()
    except Exception as exc:
        net.destroy()
        _refused("ip netns / veth", exc)
    services: Services | None = None
    try:
        hosts = {"services": net.add("services"), "api": net.add("api", own_pids=True),
                 "host-a": net.add("host-a", own_pids=True), "host-b": net.add("host-b", own_pids=True)}
        env = {**_clean_environ(), "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        services = start_services(hosts["services"], logs=logs, env=env)
        base_env = {
            **env,
            "YUE2_DATABASE_URL": f"{services.database_url}?{QUICK_PEERS}",
            "YUE2_BROKER_URL": services.broker_url,
            "YUE2_STORAGE_URL": f"s3://{BUCKET}/out",
            "YUE2_CHECKPOINT_STORE_URL": f"s3://{BUCKET}/checkpoint-store",
            "YUE2_S3_ENDPOINT_URL": services.s3_endpoint,
            "YUE2_LEASE_S": "6",
            "YUE2_BATCH_MAX_JOBS": "8",  # micro-batches of up to 64 jobs: the hosts take turns finely
            "YUE2_VISIBILITY_TIMEOUT_S": "3600",
            "YUE2_RECONCILE_INTERVAL_S": "0.5",
            "YUE2_RECONCILE_GRACE_S": "2",
            "YUE2_BATCH_FLUSH_MS": "50",
            "YUE2_TORCH_THREADS": "1",
            "YUE2_COMPILE": "0",  # a swap would otherwise build the new version's C++ step (about a minute)
            "YUE2_WATCHDOG_INTERVAL_S": "1",
            "OMP_NUM_THREADS": "1",
        }
        from yue2_jobs.db.migrate import upgrade_head

        cluster = Cluster(net=net, services=services, hosts=hosts, logs=logs, base_env=base_env)
        upgrade_head(cluster.database_url)
        yield cluster
    finally:
        net.destroy()
        if services is not None:
            services.cleanup()
        from yue2_jobs.db.session import engine_for

        engine_for.cache_clear()  # its pools point at a server that is gone


def wait_until(condition: Any, *, timeout: float, what: str, cluster: Cluster, interval: float = 0.1) -> Any:
    """`wait_for`, with the cluster's logs in the failure."""
    try:
        return wait_for(condition, timeout=timeout, what=what, interval=interval)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.log_tail()}") from None


def since(t0: float) -> float:
    return round(time.monotonic() - t0, 2)
