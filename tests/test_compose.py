"""`docker compose config` accepts the stack, and the stack has what production needs.

`config` needs no Docker engine: it parses, interpolates and validates the file. The compose v2
plugin is used when installed, else docker-compose v1 (which `.ci/run` installs from Debian when
neither is there); locally the test skips without either. Both profiles are named, since compose
v2's `config` leaves out the services of profiles not named. `make test-compose`
(tests/compose/test_stack.py) runs the cpu profile for real.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ONE_SHOT = {"minio-bucket", "migrate", "apikey"}
# Long-running services without a healthcheck: neither has an endpoint that says more than that
# the process runs (which `restart: unless-stopped` already watches), and nothing waits on them.
NO_HEALTHCHECK = {"watchdog", "flower"}
# The variables the stack refuses to start without (`${VAR:?...}`): no secret has a default.
REQUIRED = {"YUE2_FLOWER_BASIC_AUTH": "ops:secret", "YUE2_METRICS_TOKEN": "tok-from-env-123"}
WORKERS = {"worker-base", "worker-legal", "worker-base-cpu", "worker-legal-cpu", "worker-fonts"}


def compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def compose_config(*files: str, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = compose_command()
    if cmd is None:
        if os.environ.get("CI") == "true":
            pytest.fail("neither `docker compose` nor `docker-compose` is installed (CI=true: the check must run)")
        pytest.skip("no docker compose here")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}
    paths = [a for f in (files or ("docker-compose.yml",)) for a in ("-f", str(ROOT / f))]
    return subprocess.run([*cmd, *paths, "--profile", "cpu", "--profile", "gpu", "config"], capture_output=True,
                          text=True, env={**clean, **env}, cwd=ROOT)


def services(*files: str, **env: str) -> dict[str, Any]:
    done = compose_config(*files, **{**REQUIRED, **env})
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(done.stdout)["services"])


def published(svc: dict[str, Any]) -> list[tuple[str, str]]:
    """(host address, host port) of each published port, from v1's short or v2's long syntax."""
    out = []
    for p in svc.get("ports", []):
        if isinstance(p, dict):
            out.append((p.get("host_ip", ""), str(p.get("published", ""))))
        else:
            parts = str(p).split("/")[0].split(":")
            out.append((parts[0] if len(parts) == 3 else "", parts[-2] if len(parts) > 1 else ""))
    return out


def test_compose_config_is_valid_and_complete() -> None:
    svcs = services()
    assert {"redis", "postgres", "minio", "minio-bucket", "migrate", "apikey", "api", "worker-base", "worker-legal",
            "worker-base-cpu", "worker-legal-cpu", "watchdog", "flower", "prometheus"} <= set(svcs)
    assert svcs["watchdog"]["command"] == ["yue2", "watchdog"]
    assert svcs["migrate"]["command"] == ["yue2", "migrate"]
    assert svcs["apikey"]["command"] == ["yue2-first-apikey"] and "apikey:/keys" in str(svcs["apikey"]["volumes"])
    assert svcs["apikey"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name in ("worker-base", "worker-legal"):
        w = svcs[name]
        devices = w["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
        assert w["command"][:1] == ["yue2-worker"] and w["profiles"] == ["gpu"]
        assert w["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert svcs["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert svcs["flower"]["environment"]["YUE2_FLOWER_BASIC_AUTH"] == "ops:secret"
    fonts = svcs["worker-fonts"]  # render jobs: CPU processes, no GPU reservation, in every profile
    assert fonts["command"] == ["yue2-worker", "--variant", "fonts"] and "deploy" not in fonts
    assert "profiles" not in fonts
    for svc in svcs.values():
        if "build" in svc:
            assert (ROOT / svc["build"]["dockerfile"]).is_file()


def test_the_cpu_profile_serves_base_and_legal_without_a_gpu() -> None:
    svcs = services()
    for variant in ("base", "legal"):
        cpu, gpu = svcs[f"worker-{variant}-cpu"], svcs[f"worker-{variant}"]
        assert cpu["profiles"] == ["cpu"] and "deploy" not in cpu
        assert cpu["command"] == gpu["command"] == ["yue2-worker", "--variant", variant]
        assert cpu["build"]["dockerfile"] == "infra/Dockerfile" and gpu["build"]["dockerfile"] == "infra/Dockerfile.gpu"
        assert cpu["environment"]["YUE2_DEVICE"] == "cpu" and cpu["environment"]["YUE2_WORKER_PROCS"] == "1"
        assert cpu["depends_on"] == gpu["depends_on"]
        # one process per container, and no fixed hostname: replicas (--scale) get distinct node names
        assert "hostname" not in cpu
    # only the model workers have a profile: everything else runs under either
    assert {n for n, s in svcs.items() if "profiles" in s} == {"worker-base", "worker-legal", "worker-base-cpu",
                                                             "worker-legal-cpu"}


def test_every_pulled_image_is_pinned_to_a_release_tag() -> None:
    for name, svc in services().items():
        if "build" in svc:
            continue
        image, _, tag = svc["image"].rpartition(":")
        assert image and tag != "latest" and re.search(r"\d+\.\d+|^RELEASE\.", tag), (name, svc["image"])
    for dockerfile in ("infra/Dockerfile", "infra/Dockerfile.gpu"):
        base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (ROOT / dockerfile).read_text(), re.M)
        assert base and re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base.group(1)), dockerfile


def test_published_ports_bind_loopback_only() -> None:
    ports = {name: published(svc) for name, svc in services().items() if svc.get("ports")}
    assert ports == {"api": [("127.0.0.1", "8000")], "flower": [("127.0.0.1", "5555")],
                     "prometheus": [("127.0.0.1", "9090")]}


def test_long_running_services_have_healthchecks_and_dependents_wait_on_them() -> None:
    svcs = services()
    for name, svc in svcs.items():
        if name in ONE_SHOT | NO_HEALTHCHECK:  # the list stays true: a new healthcheck moves its service out
            assert "healthcheck" not in svc, name
            continue
        assert svc["healthcheck"]["test"][0] == "CMD", name
    assert svcs["minio-bucket"]["depends_on"]["minio"]["condition"] == "service_healthy"
    for name in WORKERS:  # a worker is healthy once its launcher's ready file is on its tmpfs
        env = svcs[name]["environment"]
        assert env["YUE2_WORKER_READY_FILE"] == "/run/yue2/worker-ready" and "/run/yue2" in svcs[name]["tmpfs"]
        assert svcs[name]["healthcheck"]["test"] == ["CMD", "test", "-f", env["YUE2_WORKER_READY_FILE"]]


def test_the_metrics_token_reaches_the_api_and_prometheus() -> None:
    for token in ("tok-from-env-123", "another-token-456"):
        svcs = services(YUE2_METRICS_TOKEN=token)
        assert svcs["api"]["environment"]["YUE2_METRICS_TOKEN"] == token
        assert svcs["prometheus"]["environment"]["YUE2_METRICS_TOKEN"] == token
    prom = yaml.safe_load((ROOT / "infra" / "prometheus.yml").read_text())
    api_job = next(j for j in prom["scrape_configs"] if j["job_name"] == "yue2-api")
    token_file = api_job["authorization"]["credentials_file"]
    assert "credentials" not in api_job["authorization"]  # no token written into the file
    entrypoint = " ".join(services()["prometheus"]["entrypoint"])
    # the container's own variable, read by its shell: `config` prints compose's escape ($$) as written
    assert re.search(r'"\$\$?YUE2_METRICS_TOKEN" > ' + re.escape(token_file) + " ", entrypoint), entrypoint


def test_prometheus_discovers_the_api_and_every_worker_service() -> None:
    svcs = services()
    prom = yaml.safe_load((ROOT / "infra" / "prometheus.yml").read_text())
    names = {n for job in prom["scrape_configs"] for sd in job.get("dns_sd_configs", []) for n in sd["names"]}
    workers = {n for n, s in svcs.items() if s.get("command", [""])[0] == "yue2-worker"}
    assert workers == WORKERS and names == WORKERS | {"api"}
    for name in WORKERS:
        assert svcs[name]["environment"]["YUE2_METRICS_PORT"] == "9200"
        assert svcs[name]["environment"]["YUE2_METRICS_HOST"] == "0.0.0.0"


def test_the_offline_override_swaps_images_only() -> None:
    """infra/compose.offline.yml (make test-compose) changes images, build arguments and MinIO's
    stand-in: commands, environment, ports and profiles stay docker-compose.yml's."""
    real, offline = services(), services("docker-compose.yml", "infra/compose.offline.yml")
    assert set(real) == set(offline)
    for name, svc in real.items():
        if name in ("minio", "minio-bucket"):
            continue
        for key in ("command", "environment", "ports", "profiles", "depends_on", "entrypoint"):
            assert svc.get(key) == offline[name].get(key), (name, key)
        if "build" in svc and svc.get("profiles") != ["gpu"]:  # the gpu image is not built offline
            assert offline[name]["build"]["args"]["PYTHON_IMAGE"].startswith("yue2-offline/"), name


def test_the_build_context_leaves_out_the_environment_and_the_corpora() -> None:
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    assert patterns[0] == "*"  # an allow-list: nothing new enters the context unnamed (.venv, caches, results)
    assert "data/*/train.jsonl.gz" in patterns and not any(p.startswith("!.") for p in patterns)


@pytest.mark.parametrize(("missing", "message"), [
    ("YUE2_FLOWER_BASIC_AUTH", "set YUE2_FLOWER_BASIC_AUTH=user:password"),
    ("YUE2_METRICS_TOKEN", "set YUE2_METRICS_TOKEN=")])
def test_a_stack_without_a_secret_is_refused(missing: str, message: str) -> None:
    # No default token or password: each copy of the file would share it.
    done = compose_config(**{k: v for k, v in REQUIRED.items() if k != missing})
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_the_offline_engine_keeps_containers_clear_of_the_two_host_test() -> None:
    """dockerd's bridge and pools (infra/offline/daemon.json) stay inside 198.51.100.0/24, as every
    address a test uses must, yet clear of the namespaces' addresses in tests/distributed: an engine
    owning 198.51.100.1 made the two-host test's services host unreachable (the route was local)."""
    import ipaddress
    import json

    from tests.distributed.netns import CLIENT_ADDR, SUBNET

    daemon = json.loads((ROOT / "infra" / "offline" / "daemon.json").read_text())
    test_net = ipaddress.ip_network(f"{SUBNET}.0/24")
    docker_nets = [ipaddress.ip_interface(daemon["bip"]).network]
    docker_nets += [ipaddress.ip_network(pool["base"]) for pool in daemon["default-address-pools"]]
    namespaces = [ipaddress.ip_address(f"{SUBNET}.{i}") for i in range(1, 11)] + [ipaddress.ip_address(CLIENT_ADDR)]
    for net in docker_nets:
        assert net.subnet_of(test_net), f"{net} is outside {test_net}"
        taken = [str(a) for a in namespaces if a in net]
        assert not taken, f"docker's {net} holds the two-host test's {taken}"
