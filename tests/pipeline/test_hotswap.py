"""Hot swap under load on the real services: a new `base` version is published while a worker
runs a batch; the watchdog validates and activates it and swaps the worker between micro-batches.
No job fails or is lost, jobs carry the version that decoded them, the worker's pid is unchanged;
a bad version is rejected while the active one keeps serving."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import delete

from tests.checkpoints.garbage import retrained_drafter
from tests.pipeline.conftest import ROOT, wait_for
from tests.pipeline.test_e2e import batch_jobs, submit, wait_batch, write_batch
from yue2_jobs.checkpoints import registry
from yue2_jobs.checkpoints.watchdog import live_workers, run_pass
from yue2_jobs.db.models import CheckpointActivation, CheckpointState, CheckpointVersion, JobStatus
from yue2_jobs.db.session import session_factory
from yue2_jobs.jobs.capacity import STARTING
from yue2_jobs.model.checkpoint import load_checkpoint, save_checkpoint, verify_checkpoint_dir
from yue2_jobs.queue import make_celery
from yue2_jobs.storage import storage_from_url


@pytest.fixture
def base_registry(settings: Any) -> Iterator[tuple[Any, Any, Any]]:
    """(sessions, checkpoint store, Celery app); leaves no version of any variant behind, or later tests'
    workers would load it instead of the seed."""
    app = make_celery(settings)
    app.conf.broker_pool_limit = 8
    yield session_factory(settings.resolved_database_url), storage_from_url(settings.resolved_checkpoint_store_url), app
    with session_factory(settings.resolved_database_url)() as session:  # each pass also seeds legal
        session.execute(delete(CheckpointVersion))
        session.execute(delete(CheckpointActivation))
        session.commit()
    shutil.rmtree(Path(settings.resolved_checkpoint_store_url.removeprefix("file://")) / "checkpoints",
                  ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def reported(sessions: Any) -> dict[str, Any]:
    """Each live base worker's own report (its row in worker_processes), by node name; a row a
    killed worker of an earlier test left (stale within the liveness window) is skipped."""
    with sessions() as session:
        return {w.name: {"checkpoint": w.checkpoint, "pid": w.pid, "weights_sha256": w.weights_sha256,
                         "swap": {"state": w.swap_state, "version": w.swap_version}}
                for w in live_workers(session, "base") if _running(w.pid) and w.checkpoint != f"base@{STARTING}"}


def test_publish_under_load_swaps_the_worker_with_no_failed_or_lost_job(
        client: Any, workers: Any, settings: Any, eval_texts: list[str], tmp_path: Path, base_registry: Any) -> None:
    sessions, store, app = base_registry
    worker = workers(YUE2_BATCH_MAX_JOBS="1")  # one message (32 jobs) per micro-batch: many swap points
    wait_for(lambda: reported(sessions), timeout=120, what="the worker to report")
    (name, before), = reported(sessions).items()
    assert before["checkpoint"].startswith("base@")

    # Trained before the batch starts, so the swap lands while most of it is still to run (trained
    # after its first jobs, on a loaded machine the batch could end before the swap).
    retrained = retrained_drafter(tmp_path / "retrained-base")  # a new drafter: the same `ar` outputs
    write_batch(tmp_path / "a.jsonl", (eval_texts * 2)[:320], prefix="a")
    batch_a = submit(client, tmp_path / "a.jsonl")
    wait_for(lambda: client.batch(batch_a)["request_counts"]["completed"] >= 32, timeout=120, what="first jobs")

    with sessions() as session:
        new = registry.publish(session, store=store, store_url=settings.resolved_checkpoint_store_url,
                               directory=retrained, variant="base")
    t_publish = time.monotonic()
    done = run_pass(settings, sessions, store, app)
    t_served = time.monotonic() - t_publish
    assert done["base"]["activated"] == [new.version] and done["base"]["swapped"] == [name], done
    after = reported(sessions)[name]
    assert after["checkpoint"] == f"base@{new.version}" and after["pid"] == before["pid"]  # no restart
    assert after["weights_sha256"] == verify_checkpoint_dir(retrained)["model.safetensors"]["sha256"]

    write_batch(tmp_path / "b.jsonl", eval_texts[:64], prefix="b")
    batch_b = submit(client, tmp_path / "b.jsonl")
    for batch_id, total in ((batch_a, 320), (batch_b, 64)):
        state = wait_batch(client, batch_id, timeout=300, worker=worker)
        assert state["request_counts"] == {"total": total, "completed": total, "failed": 0}
    jobs_a, jobs_b = batch_jobs(settings, batch_a), batch_jobs(settings, batch_b)
    assert {j.status for j in jobs_a + jobs_b} == {JobStatus.SUCCEEDED} and {j.attempts for j in jobs_a} == {1}
    old, new_ck = before["checkpoint"], f"base@{new.version}"
    served = {j.checkpoint for j in jobs_a}
    assert served == {old, new_ck}, served  # the batch straddles the swap
    # Every job decoded before the switch carries the old version, every one after it the new.
    last_old = max(j.finished_at for j in jobs_a if j.checkpoint == old)
    first_new = min(j.finished_at for j in jobs_a if j.checkpoint == new_ck)
    assert last_old <= first_new
    assert {j.checkpoint for j in jobs_b} == {new_ck}
    assert {j.weights_sha256 for j in jobs_b} == {after["weights_sha256"]}
    print(f"publish -> worker serving the new version: {t_served:.1f}s")

    # A version with NaN weights is rejected; the worker keeps serving the active one.
    model, tok = load_checkpoint(retrained)
    with torch.no_grad():
        model.decoder_layers[1].ffn.fc2.weight[3, 3] = float("nan")
    broken = save_checkpoint(model, tok, tmp_path / "nan-base")
    with sessions() as session:
        bad = registry.publish(session, store=store, store_url=settings.resolved_checkpoint_store_url,
                               directory=broken, variant="base")
    run_pass(settings, sessions, store, app)
    with sessions() as session:
        assert registry.get(session, variant="base", version=bad.version).state == CheckpointState.FAILED
        assert registry.active(session, "base").version == new.version
    assert reported(sessions)[name]["checkpoint"] == new_ck

    # The watchdog registered the starting directory as base's first version: a rollback returns to
    # it (the shipped weights), and a second one to the retrained version; each pass swaps the worker.
    with sessions() as session:
        back = registry.rollback(session, "base")
        assert back.source is not None and back.source.startswith("seed ")
    run_pass(settings, sessions, store, app)
    assert reported(sessions)[name]["checkpoint"] == before["checkpoint"] == f"base@{back.version}"
    with sessions() as session:
        assert registry.rollback(session, "base").version == new.version
        assert [(a.version, a.how) for a in registry.history(session, "base")] == [
            (back.version, "seed"), (new.version, "activate"), (back.version, "rollback"), (new.version, "rollback")]
    run_pass(settings, sessions, store, app)
    final = reported(sessions)[name]
    assert final["checkpoint"] == new_ck and final["pid"] == before["pid"]


def test_a_worker_that_cannot_load_keeps_serving_and_the_version_is_rolled_back(
        client: Any, workers: Any, settings: Any, eval_texts: list[str], tmp_path: Path, base_registry: Any) -> None:
    sessions, store, app = base_registry
    with sessions() as session:  # the seed as the active version, then a newer one that passes validation
        seed = registry.publish(session, store=store, store_url=settings.resolved_checkpoint_store_url,
                                directory=ROOT / "checkpoints" / "base", variant="base")
    run_pass(settings, sessions, store, app)
    workers()
    wait_for(lambda: reported(sessions), timeout=120, what="the worker to report")
    (name, before), = reported(sessions).items()
    assert before["checkpoint"] == f"base@{seed.version}"
    with sessions() as session:
        new = registry.publish(session, store=store, store_url=settings.resolved_checkpoint_store_url,
                               directory=retrained_drafter(tmp_path / "retrained"), variant="base")
        from yue2_jobs.checkpoints.validate import validate_version

        assert validate_version(session, new, store=store, settings=settings)
        registry.activate(session, new)
    # The worker's copy cannot be fetched: its store files vanished after validation.
    store_root = Path(settings.resolved_checkpoint_store_url.removeprefix("file://"))
    shutil.rmtree(store_root / "checkpoints" / "base" / new.version)
    shutil.rmtree(settings.resolved_checkpoint_cache_dir / "base" / new.version, ignore_errors=True)
    run_pass(settings, sessions, store, app)
    with sessions() as session:
        failed = registry.get(session, variant="base", version=new.version)
        assert failed.state == CheckpointState.FAILED and f"worker load failed on {name}" in failed.error
        assert registry.active(session, "base").version == seed.version
    after = reported(sessions)[name]
    assert after["checkpoint"] == before["checkpoint"] and after["pid"] == before["pid"]
    assert after["swap"]["state"] == "failed"
    write_batch(tmp_path / "in.jsonl", eval_texts[:40])
    state = wait_batch(client, submit(client, tmp_path / "in.jsonl"), timeout=300)
    assert state["request_counts"] == {"total": 40, "completed": 40, "failed": 0}
