"""`make test-compose`: docker-compose.yml's cpu profile, run for real on a Docker engine.

The images come from infra/compose.offline.yml (stand-ins built from Debian packages and a local
wheelhouse by infra/offline/build-standins.sh, which `make test-compose` runs first); every other
line of the stack is docker-compose.yml's own. The stack is built and brought up once, with a
metrics token of this run's own (so Prometheus scrapes the API only if the token reaches both);
then the first API key (the one-shot `apikey` service) sends a 100-line batch, half to `base` and
half to `legal`, through the `openai` client, every output is checked against the checkpoint decoded
directly here, Prometheus must report every target it discovers up, and `down -v` must leave no
container, network or volume behind. Timings (build, up, batch) go to
benchmarks/results/compose.json and the terminal.

Skipped unless YUE2_TEST_COMPOSE=1 (the Makefile target sets it): it needs a Docker engine, takes
minutes and is not part of `make test`.
"""

from __future__ import annotations

import gzip
import io
import ipaddress
import json
import os
import re
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import wait_for
from tests.test_compose import compose_command

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "yue2-compose-test"
LINES_PER_VARIANT = 50
# (service, port) of every scrape target under --profile cpu: the API, one process per CPU worker
# container, the fonts worker's two processes (infra/prometheus.yml).
EXPECTED_TARGETS = {("api", "8000"), ("worker-base-cpu", "9200"), ("worker-legal-cpu", "9200"),
                    ("worker-fonts", "9200"), ("worker-fonts", "9201")}
LONG_RUNNING = ("postgres", "redis", "minio", "api", "worker-base-cpu", "worker-legal-cpu", "worker-fonts",
                "prometheus")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("YUE2_TEST_COMPOSE") != "1",
                                 reason="make test-compose runs this (YUE2_TEST_COMPOSE=1): it needs a Docker engine")]


class Stack:
    """docker compose on the two files, under this test's project name and environment."""

    def __init__(self) -> None:
        cmd = compose_command()
        assert cmd is not None, "neither `docker compose` nor `docker-compose` is installed"
        self.cmd = [*cmd, "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml"),
                    "-f", str(ROOT / "infra" / "compose.offline.yml"), "--profile", "cpu"]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}
        self.metrics_token = secrets.token_urlsafe(16)
        self.env = {**clean, "YUE2_FLOWER_BASIC_AUTH": "ops:" + secrets.token_urlsafe(12),
                    "YUE2_METRICS_TOKEN": self.metrics_token}
        self.timings: dict[str, float] = {}

    def run(self, *args: str, timeout: float = 900) -> str:
        done = subprocess.run([*self.cmd, *args], capture_output=True, text=True, env=self.env, cwd=ROOT,
                              timeout=timeout)
        assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.monotonic()
        value = fn()
        self.timings[name] = round(time.monotonic() - start, 1)
        return value

    def container(self, service: str) -> dict[str, Any]:
        ids = self.run("ps", "-a", "-q", service).split()
        assert len(ids) == 1, f"{service}: {ids}"
        return json.loads(subprocess.run(["docker", "inspect", ids[0]], capture_output=True, text=True,
                                         check=True).stdout)[0]

    def healthy(self) -> bool:
        return all(self.container(s)["State"].get("Health", {}).get("Status") == "healthy" for s in LONG_RUNNING)

    def project_ids(self, *kind: str) -> list[str]:
        """The ids of this project's objects of one kind (`ps`, `network ls`), by compose's label."""
        label = f"label=com.docker.compose.project={PROJECT}"
        return subprocess.run(["docker", *kind, "-q", "--no-trunc", "--filter", label], capture_output=True,
                              text=True, check=True).stdout.split()

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={PROJECT}"
        found = []
        for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
            out = subprocess.run(["docker", *kind, "-q", "--filter", label], capture_output=True, text=True)
            found += [f"{kind[0]} {x}" for x in out.stdout.split()]
        return found


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = Stack()
    s.run("down", "-v", "--remove-orphans")  # what an interrupted run left
    try:
        s.timed("build_s", lambda: s.run("build"))
        s.timed("up_s", lambda: s.run("up", "-d"))
        s.timed("healthy_s", lambda: wait_for(s.healthy, timeout=900, what=f"{LONG_RUNNING} healthy", interval=1.0))
        yield s
    finally:
        logs = subprocess.run([*s.cmd, "logs", "--no-color", "--tail", "30"], capture_output=True, text=True,
                              env=s.env, cwd=ROOT).stdout
        s.timed("down_s", lambda: s.run("down", "-v", "--remove-orphans", "--timeout", "60"))
        out = ROOT / "benchmarks" / "results" / "compose.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(s.timings, indent=2) + "\n")
        print(f"\ncompose stack timings (s): {s.timings}")
        assert not s.leftovers(), f"`down -v` left {s.leftovers()}\n{logs[-5000:]}"


def first_api_key(stack: Stack) -> str:
    wait_for(lambda: stack.container("apikey")["State"]["Status"] == "exited", timeout=300, what="the apikey service",
             interval=1.0)
    assert stack.container("apikey")["State"]["ExitCode"] == 0, stack.run("logs", "--no-color", "apikey")
    found = re.findall(r"YUE2_API_KEY=(yk-\S+)", stack.run("logs", "--no-color", "apikey"))
    assert found, stack.run("logs", "--no-color", "apikey")
    return found[-1]


def eval_texts(variant_set: str, n: int) -> list[str]:
    with gzip.open(ROOT / "data" / variant_set / "eval.jsonl.gz", "rt") as f:
        return [json.loads(line)["text"] for line in f][:n]


def direct(variant: str, texts: list[str]) -> list[str]:
    """The checkpoint decoded here, in this process: what every output line must say."""
    from yue2_jobs.decode.params import DecodingParams
    from yue2_jobs.decode.session import DecodeSession
    from yue2_jobs.model.checkpoint import load_checkpoint

    model, tokenizer = load_checkpoint(ROOT / "checkpoints" / variant)
    return list(DecodeSession(model, tokenizer=tokenizer).summarize(texts, DecodingParams(mode="hybrid")))


def test_a_100_line_batch_through_the_openai_client_with_the_first_key(stack: Stack) -> None:
    from openai import OpenAI

    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=first_api_key(stack), max_retries=2)
    texts = {"base": eval_texts("general", LINES_PER_VARIANT), "legal": eval_texts("legal", LINES_PER_VARIANT)}
    lines = [{"custom_id": f"{v}-{i}", "method": "POST", "url": "/v1/summarize",
              "body": {"input": t, "variant": v, "mode": "hybrid"}}
             for v, ts in texts.items() for i, t in enumerate(ts)]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()

    def run_batch() -> Any:
        file_id = client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch").id
        b = client.batches.create(input_file_id=file_id, endpoint="/v1/summarize", completion_window="24h")
        return wait_for(lambda: (x := client.batches.retrieve(b.id)).status in ("completed", "failed", "cancelled",
                                                                                  "expired") and x,
                        timeout=900, what=f"batch {b.id}", interval=1.0)

    batch = stack.timed("batch_s", run_batch)
    assert batch.status == "completed" and batch.request_counts is not None, batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (100, 100, 0)
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in lines)
    got = {x["custom_id"]: x["response"]["body"]["output"] for x in out if x["response"]["status_code"] == 200}
    for variant, ts in texts.items():
        want = direct(variant, ts)
        assert [got.get(f"{variant}-{i}") for i in range(len(ts))] == want, variant


def test_prometheus_scrapes_every_target_and_the_api_with_this_runs_token(stack: Stack) -> None:
    def targets() -> list[dict[str, Any]]:
        with urllib.request.urlopen("http://127.0.0.1:9090/api/v1/targets?state=active", timeout=5) as r:
            return list(json.load(r)["data"]["activeTargets"])

    def all_up() -> list[dict[str, Any]] | None:
        found = targets()
        seen = {(t["labels"].get("service"), t["scrapeUrl"].split(":")[2].split("/")[0]) for t in found}
        return found if seen == EXPECTED_TARGETS and all(t["health"] == "up" for t in found) else None

    try:
        found = wait_for(all_up, timeout=120, what="every Prometheus target up", interval=1.0)
    except AssertionError:
        raise AssertionError(json.dumps([(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets()])) from None
    assert len(found) == len(EXPECTED_TARGETS)
    with pytest.raises(urllib.error.HTTPError) as refused:  # the token guards /metrics
        urllib.request.urlopen("http://127.0.0.1:8000/metrics", timeout=5)
    assert refused.value.code == 401


def test_published_ports_bind_loopback_only(stack: Stack) -> None:
    bound = {(s, b["HostIp"], b["HostPort"]) for s in ("api", "flower", "prometheus")
             for bindings in stack.container(s)["HostConfig"]["PortBindings"].values() for b in bindings}
    assert bound == {("api", "127.0.0.1", "8000"), ("flower", "127.0.0.1", "5555"), ("prometheus", "127.0.0.1", "9090")}
    for s in LONG_RUNNING:
        if s not in ("api", "prometheus"):
            assert not stack.container(s)["HostConfig"]["PortBindings"], s


def inspect(kind: str, ids: list[str]) -> list[dict[str, Any]]:
    """`docker KIND inspect IDS` (container, network), parsed."""
    return list(json.loads(subprocess.run(["docker", kind, "inspect", *ids], capture_output=True, text=True,
                                          check=True).stdout))


def test_every_address_is_inside_the_test_subnet_and_every_port_on_loopback(stack: Stack) -> None:
    """What the engine really assigned, not what the files ask for: the project's networks, each
    container's addresses and each published port's host address."""
    allowed = ipaddress.ip_network("198.51.100.0/24")
    networks = inspect("network", stack.project_ids("network", "ls"))
    assert networks, f"no network of project {PROJECT}"
    for net in networks:
        subnets = [c["Subnet"] for c in (net.get("IPAM") or {}).get("Config") or []]
        assert subnets, (net["Name"], net.get("IPAM"))
        for config in net["IPAM"]["Config"]:
            subnet = ipaddress.ip_network(config["Subnet"])  # an IPv6 one is outside too
            assert subnet.network_address in allowed and subnet.broadcast_address in allowed, (net["Name"], config)
            if config.get("Gateway"):
                assert ipaddress.ip_address(config["Gateway"]) in allowed, (net["Name"], config)
        for member in (net.get("Containers") or {}).values():
            assert ipaddress.ip_interface(member["IPv4Address"]).ip in allowed, (net["Name"], member)
            assert not member.get("IPv6Address"), (net["Name"], member)
    running = inspect("container", stack.project_ids("ps"))
    services = {c["Config"]["Labels"]["com.docker.compose.service"] for c in running}
    assert set(LONG_RUNNING) <= services, services
    published = set()
    for c in running:
        service = c["Config"]["Labels"]["com.docker.compose.service"]
        attached = c["NetworkSettings"]["Networks"]
        assert attached, service
        for name, where in attached.items():
            assert ipaddress.ip_address(where["IPAddress"]) in allowed, (service, name, where["IPAddress"])
            assert not where.get("GlobalIPv6Address"), (service, name, where["GlobalIPv6Address"])
        # NetworkSettings.Ports: the bindings in force (what `docker port` prints), not the requested ones
        for port, bindings in (c["NetworkSettings"]["Ports"] or {}).items():
            for b in bindings or []:
                published.add((service, port, b["HostIp"], b["HostPort"]))
    assert published == {("api", "8000/tcp", "127.0.0.1", "8000"), ("flower", "5555/tcp", "127.0.0.1", "5555"),
                         ("prometheus", "9090/tcp", "127.0.0.1", "9090")}, published
