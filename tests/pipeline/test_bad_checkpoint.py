"""A bad checkpoint never serves, on the real services (issue 39):

- the new user's sequence: garbage published as a `legal` version, `yue2 watchdog --once` →
  refused, with its reason in `yue2 checkpoints list`, the watchdog's log and /metrics; legal
  jobs still come from the shipped weights. A good retrained version then swaps in, and
  `yue2 checkpoints rollback legal` returns the same worker process to the shipped weights;
- a worker that cannot load its checkpoint backs off with one line an attempt, stays down with
  its reason in its status row, /healthz answers 503 naming the variant while its jobs wait, and
  the worker loads the variant's next active version without a restart.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select

from tests.checkpoints.garbage import GARBAGE, retrained_drafter
from tests.pipeline.conftest import ROOT, make_settings, wait_for
from yue2_jobs.db.models import CheckpointActivation, CheckpointVersion, Job, JobStatus, WorkerProcess
from yue2_jobs.db.session import session_factory, utcnow

LEGAL = ROOT / "checkpoints" / "legal"
TEXT = ("The licensee may copy and distribute the software in source or binary form, provided that the "
        "copyright notice and this permission notice appear in all copies.")


@pytest.fixture
def clean_registry(settings: Any) -> Iterator[Any]:
    """The tests' sessions; afterwards no version of any variant is left (later tests' workers start
    from the shipped directories)."""
    sessions = session_factory(settings.resolved_database_url)
    yield sessions
    with sessions() as session:
        session.execute(delete(CheckpointVersion))
        session.execute(delete(CheckpointActivation))
        session.commit()
    shutil.rmtree(Path(settings.resolved_checkpoint_store_url.removeprefix("file://")) / "checkpoints",
                  ignore_errors=True)


def yue2(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "yue2_jobs", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)
    assert (done.returncode == 0) == ok, done.stdout + done.stderr
    return done


def legal_worker(sessions: Any) -> WorkerProcess | None:
    with sessions() as session:
        return session.execute(select(WorkerProcess).where(
            WorkerProcess.variant == "legal", WorkerProcess.checkpoint != "legal@starting",
            WorkerProcess.load_error.is_(None))).scalar_one_or_none()


def summarize(client: Any) -> dict[str, Any]:
    job = client.submit_job({"input": TEXT, "variant": "legal", "mode": "ar"})
    return client.wait(job["id"], timeout_s=120)


@pytest.mark.slow
def test_garbage_published_as_legal_never_serves_and_rollback_returns_to_the_shipped_weights(
        client: Any, workers: Any, pipeline_env: dict[str, str], tmp_path: Path, clean_registry: Any) -> None:
    import os

    sessions, env = clean_registry, {**os.environ, **pipeline_env}
    workers("--variant", "legal")
    shipped = wait_for(lambda: legal_worker(sessions), timeout=120, what="the legal worker to serve").checkpoint
    before = summarize(client)
    assert before["status"] == "succeeded" and before["checkpoint"] == shipped

    kinds = ("random weights", "another tokenizer", "all EOS", "one token repeated", "NaN weight")
    for kind in kinds:
        yue2(env, "checkpoints", "publish", str(GARBAGE[kind](tmp_path / kind.replace(" ", "-"))), "--variant", "legal")
    log = yue2(env, "watchdog", "--once").stderr  # validates every staged version, oldest first
    assert log.count("failed validation, legal@") == len(kinds) and "keeps serving: " in log, log
    listing = yue2(env, "checkpoints", "list", "--variant", "legal").stdout.splitlines()
    assert [line.split()[1] for line in listing] == ["active"] + ["failed"] * 5, listing
    assert listing[0].split()[0] == shipped and "seed " in listing[0]
    after = summarize(client)
    assert (after["checkpoint"], after["output"]) == (shipped, before["output"])  # the shipped weights serve
    worker = legal_worker(sessions)
    assert worker is not None and worker.checkpoint == shipped

    metrics = _metrics(pipeline_env)
    assert 'yue2_checkpoint_versions{state="failed",variant="legal"} 5.0' in metrics
    assert 'yue2_checkpoint_validation_failed{' in metrics and "NaN or Inf" in metrics

    # A good retrained legal swaps in; the rollback brings the same process back to the shipped weights.
    good = retrained_drafter(tmp_path / "good", LEGAL)
    out = yue2(env, "checkpoints", "publish", str(good), "--variant", "legal").stdout
    version = next(line.split()[1] for line in out.splitlines() if line.startswith("published "))
    yue2(env, "watchdog", "--once")
    swapped = legal_worker(sessions)
    assert swapped is not None and swapped.checkpoint == version and swapped.pid == worker.pid
    assert "rolled back: " + shipped in yue2(env, "checkpoints", "rollback", "legal").stdout
    yue2(env, "watchdog", "--once")
    back = legal_worker(sessions)
    assert back is not None and (back.checkpoint, back.pid) == (shipped, worker.pid)
    assert summarize(client)["output"] == before["output"]
    history = yue2(env, "checkpoints", "history", "--variant", "legal").stdout.splitlines()
    assert [h.split()[-1] for h in history] == ["seed", "activate", "rollback"], history


def _metrics(env: dict[str, str]) -> str:
    """The API's /metrics, from an app that serves it (the shared test API has no token)."""
    from fastapi.testclient import TestClient

    from yue2_jobs.api.app import create_app

    with TestClient(create_app(make_settings(env, metrics_token="metrics-token-for-tests"))) as api:
        return api.get("/metrics", headers={"Authorization": "Bearer metrics-token-for-tests"}).text


@pytest.mark.slow
def test_a_worker_that_cannot_load_stays_down_quietly_and_health_says_so(
        workers: Any, pipeline_env: dict[str, str], tmp_path: Path, clean_registry: Any) -> None:
    from fastapi.testclient import TestClient

    from yue2_jobs.api.app import create_app
    from yue2_jobs.checkpoints import registry
    from yue2_jobs.checkpoints.validate import validate_version
    from yue2_jobs.storage import storage_from_url

    sessions = clean_registry
    broken = tmp_path / "broken"
    shutil.copytree(LEGAL, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")  # fails its manifest's sha256
    extra = {"YUE2_CHECKPOINTS": f'{{"broken": "{broken}"}}', "YUE2_WORKER_LOAD_ATTEMPTS": "3",
             "YUE2_WORKER_LOAD_BACKOFF_S": "0.5"}
    t0 = time.monotonic()
    worker = workers("--variant", "broken", **extra)

    def down() -> WorkerProcess | None:
        with sessions() as session:
            return session.execute(select(WorkerProcess).where(WorkerProcess.variant == "broken",
                                                               WorkerProcess.load_error.is_not(None))).scalar()

    row = wait_for(down, timeout=120, what="the broken worker to report itself down")
    assert "CheckpointCorruptError" in row.load_error and "model.safetensors" in row.load_error
    wait_for(lambda: "staying down" in worker.tail(), timeout=30, what="the worker to say it stays down")
    lines = worker.log.read_text().splitlines()
    attempts = [line for line in lines if "cannot load variant 'broken'" in line]
    assert len(attempts) == 3 and "Traceback" not in worker.tail(), worker.tail()
    assert len(lines) <= 10, "\n".join(lines)
    assert worker.alive()  # down, not restarting
    print(f"a worker that cannot load: {len(lines)} log lines, down after {time.monotonic() - t0:.1f}s")

    settings = make_settings(pipeline_env, checkpoints={"broken": str(broken)}, health_stall_s=0)
    with sessions() as session:
        session.add(Job(id=f"job_broken_{int(time.time())}", tenant="t-broken", kind="summarize", variant="broken",
                        status=JobStatus.QUEUED, params={}, input_text=TEXT, created_at=utcnow()))
        session.commit()
    with TestClient(create_app(settings)) as api:
        health = api.get("/healthz")
    assert health.status_code == 503 and health.json()["status"] == "degraded", health.text
    assert health.json()["variants_stalled"]["broken"] == {"queued": 1, "workers_down": 1}
    assert any("variant 'broken': 1 job(s) queued and no live worker (1 worker(s) down" in p
               for p in health.json()["problems"]), health.text
    assert str(broken) not in health.text  # /healthz answers anyone: the reason stays in the status row

    # The fix: a good version of the variant becomes active; the down worker loads it, no restart.
    store = storage_from_url(settings.resolved_checkpoint_store_url)
    with sessions() as session:
        good = registry.publish(session, store=store, store_url=settings.resolved_checkpoint_store_url,
                                directory=LEGAL, variant="broken")
        assert validate_version(session, good, store=store, settings=settings) is not None
        registry.activate(session, good)
    pid = row.pid

    def serving() -> bool:
        with sessions() as session:
            w = session.execute(select(WorkerProcess).where(WorkerProcess.variant == "broken")).scalar()
            return w is not None and w.load_error is None and w.checkpoint == f"broken@{good.version}" and w.pid == pid

    wait_for(serving, timeout=60, what="the down worker to load the new active version")
