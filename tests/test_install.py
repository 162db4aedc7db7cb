"""A non-editable install finds its migrations, checkpoints and eval sets as package data: built as
a wheel from a copy of the source tree, installed into a temporary venv (its dependencies come from
this venv's site-packages, the project itself does not), it migrates a SQLite database and runs the
embedded demo from a directory that holds no checkout."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", ".yue2", ".pytest_cache", ".ruff_cache", "build", "benchmarks", "tests", "docs", ".cache"}

pytestmark = pytest.mark.slow


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=lambda d, names: [n for n in names if n in SKIP
                                                                      or n.endswith(".egg-info")])
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"),
          str(src)])
    env_dir = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    purelib = Path(_run([str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                         "['purelib'])"]).stdout.strip())
    # The dependencies: this venv's site-packages as a plain path (a .pth line adds the directory,
    # not the .pth files in it, so the editable install of the checkout stays out).
    (purelib / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    wheel = next((tmp / "dist").glob("yue2_jobs-*.whl"))
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(purelib),
          str(wheel)])
    return env_dir


def test_an_installed_package_migrates_and_runs_the_demo(installed: Path, tmp_path: Path) -> None:
    python = str(installed / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_") and k != "PYTHONPATH"}
    env["YUE2_HOME"] = str(tmp_path / "home")
    env["YUE2_COMPILE"] = "0"  # no C++ build at the workers' start (tests/decode/test_compiled.py covers it)
    where = _run([python, "-c", "import yue2_jobs, workers; print(yue2_jobs.__file__); print(workers.__file__)"],
                 cwd=tmp_path, env=env).stdout.split()
    assert all(str(installed) in w for w in where), where  # the installed copy, not the checkout
    db = tmp_path / "m.db"
    out = _run([python, "-m", "yue2_jobs", "migrate", "--database-url", f"sqlite:///{db}"], cwd=tmp_path, env=env)
    assert "database at head" in out.stdout and db.is_file()
    demo = _run([python, "-m", "yue2_jobs", "demo", "--items", "8"], cwd=tmp_path, env=env)
    assert demo.stdout.split("p50 job latency s\n", 1)[1].split()[:2] == ["8", "0"]  # jobs succeeded, failed
    assert "base@" in demo.stdout and "legal@" in demo.stdout
