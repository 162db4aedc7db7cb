"""`docker compose config` accepts the stack, and the stack has what production needs.

No Docker engine runs on these machines, but `config` needs none: it parses, interpolates and
validates the file. The compose v2 plugin is used when installed, else docker-compose v1 (which
`.ci/run` installs from Debian when neither is there); locally the test skips without either.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def compose_config(**env: str) -> subprocess.CompletedProcess[str]:
    cmd = compose_command()
    if cmd is None:
        if os.environ.get("CI") == "true":
            pytest.fail("neither `docker compose` nor `docker-compose` is installed (CI=true: the check must run)")
        pytest.skip("no docker compose here")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}
    return subprocess.run([*cmd, "-f", str(ROOT / "docker-compose.yml"), "config"], capture_output=True, text=True,
                          env={**clean, **env}, cwd=ROOT)


def test_compose_config_is_valid_and_complete() -> None:
    done = compose_config(YUE2_FLOWER_BASIC_AUTH="ops:secret")
    assert done.returncode == 0, done.stderr
    cfg = yaml.safe_load(done.stdout)
    services = cfg["services"]
    assert {"redis", "postgres", "minio", "minio-bucket", "migrate", "api", "worker-base", "worker-legal", "watchdog",
            "flower", "prometheus"} <= set(services)
    assert services["watchdog"]["command"] == ["yue2", "watchdog"]
    assert services["migrate"]["command"] == ["alembic", "upgrade", "head"]
    for name in ("worker-base", "worker-legal"):
        w = services[name]
        devices = w["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
        assert w["command"][:1] == ["yue2-worker"]
        assert w["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert (ROOT / w["build"]["dockerfile"]).is_file()
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["flower"]["environment"]["YUE2_FLOWER_BASIC_AUTH"] == "ops:secret"
    fonts = services["worker-fonts"]  # render jobs: CPU processes, no GPU reservation
    assert fonts["command"] == ["yue2-worker", "--variant", "fonts"] and "deploy" not in fonts
    for svc in services.values():
        if "build" in svc:
            assert (ROOT / svc["build"]["dockerfile"]).is_file()


def test_flower_without_credentials_is_refused() -> None:
    done = compose_config()
    assert done.returncode != 0
    assert "set YUE2_FLOWER_BASIC_AUTH=user:password" in done.stderr
