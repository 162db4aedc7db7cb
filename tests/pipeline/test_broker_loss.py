"""A wiped Redis mid-batch (issue 38), on the real Postgres, Redis and moto with the shipped defaults
(120 s lease, 10 s reconciler, 30 s grace): the reconciling worker notices the broker's epoch key
gone within a second and republishes at once the jobs whose messages went with the data, instead
of after the grace (queued jobs) or a lease (jobs a killed worker held). Every line once, nothing
stranded. Each test prints its timings."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from tests.pipeline.conftest import wait_for
from tests.pipeline.test_chaos import ECHO, assert_exactly_once, counts, wait_done, write_lines
from tests.scratch_redis import flush
from yue2_jobs.client import Client
from yue2_jobs.db.models import Job, WorkerProcess
from yue2_jobs.db.session import session_factory


def _jobs(settings: Any, batch_id: str, status: str) -> set[str]:
    with session_factory(settings.resolved_database_url)() as session:
        return set(session.execute(select(Job.id).where(Job.batch_id == batch_id, Job.status == status)).scalars())


def _started(settings: Any, ids: set[str]) -> set[str]:
    """Of `ids`, the jobs a worker claimed (again) or finished."""
    with session_factory(settings.resolved_database_url)() as session:
        return set(session.execute(select(Job.id).where(Job.id.in_(ids), Job.status != "queued")).scalars())


def test_a_flushed_redis_mid_batch_costs_seconds(client: Client, workers: Any, settings: Any, redis_url: str,
                                                 tmp_path: Path) -> None:
    n = 600
    by_custom_id = write_lines(tmp_path / "in.jsonl", n)
    worker = workers(**ECHO)
    batch_id = client.create_batch(client.upload(tmp_path / "in.jsonl")["id"])["id"]
    wait_for(lambda: (counts(client, batch_id) or {"completed": 0})["completed"] >= 40, timeout=120,
             what="the batch to be under way", interval=0.05)
    flush(redis_url)  # the pipeline's database: the run's own
    t_flush = time.monotonic()
    waiting = _jobs(settings, batch_id, "queued")  # their messages went with the data (a few may be read already)
    assert len(waiting) > 100, "the batch was nearly done at the flush"
    wait_for(lambda: len(_started(settings, waiting)) > len(waiting) // 2, timeout=120,
             what="the jobs queued at the flush to run", interval=0.05)
    moving_s = time.monotonic() - t_flush
    state = wait_done(client, batch_id, worker)
    print(f"Redis FLUSHDB mid-batch, default settings: half of the {len(waiting)} jobs queued at the flush "
          f"started {moving_s:.2f} s after it (target <= 5 s; 22.7 s before); batch done "
          f"{time.monotonic() - t_flush:.1f} s after it")
    assert_exactly_once(client, settings, state, by_custom_id)
    assert moving_s <= 5, f"the queue stood still {moving_s:.1f} s after the flush"


def test_a_flushed_redis_and_a_killed_worker_cost_seconds(client: Client, workers: Any, settings: Any,
                                                          redis_url: str, tenant: str, tmp_path: Path) -> None:
    """The flush takes the dead worker's record of its unacknowledged messages too (its held set), so
    its replacement releases its claims with no message to put back: the reconciler republishes
    those jobs at once because they were published before the broker's epoch."""
    n = 600
    by_custom_id = write_lines(tmp_path / "in.jsonl", n)
    ready = tmp_path / "ready"
    host = f"flush-{tenant}"
    launcher = workers("--host", host, **{**ECHO, "YUE2_TEST_JOB_MS": "20", "YUE2_WORKER_READY_FILE": str(ready)})
    child_ready = ready.with_name("ready.0")
    wait_for(child_ready.exists, timeout=120, what="the worker to be ready")
    batch_id = client.create_batch(client.upload(tmp_path / "in.jsonl")["id"])["id"]
    wait_for(lambda: (counts(client, batch_id) or {"completed": 0})["completed"] >= 100, timeout=120,
             what="the batch to be under way", interval=0.02)
    with session_factory(settings.resolved_database_url)() as session:
        pid = session.execute(select(WorkerProcess.pid).where(WorkerProcess.name == f"base-cpu0@{host}")).scalar_one()
    child_ready.unlink()
    os.kill(pid, 9)
    flush(redis_url)
    t_fault = time.monotonic()
    held = _jobs(settings, batch_id, "running")  # the dead worker's claims
    waiting = _jobs(settings, batch_id, "queued")
    assert held and waiting, "the batch was not mid-run at the fault"

    def restarted() -> bool:  # every job the dead worker held claimed again or done, and the queue moving
        with session_factory(settings.resolved_database_url)() as session:
            again = session.execute(select(Job.id).where(Job.id.in_(held), (Job.status != "running")
                                                         | (Job.attempts >= 2))).scalars().all()
        return len(again) == len(held) and bool(_started(settings, waiting))

    wait_for(child_ready.exists, timeout=120, what="the launcher's replacement to be ready", interval=0.02)
    ready_s = time.monotonic() - t_fault
    wait_for(restarted, timeout=180, what="the dead worker's jobs to run again", interval=0.05)
    again_s = time.monotonic() - t_fault
    state = wait_done(client, batch_id, launcher)
    print(f"Redis FLUSHDB + worker SIGKILL, default settings: the replacement ready {ready_s:.2f} s after the "
          f"fault; all {len(held)} released jobs running again {again_s:.2f} s after it (target <= 15 s; "
          f"157 s before); batch done "
          f"{time.monotonic() - t_fault:.1f} s after it")
    assert_exactly_once(client, settings, state, by_custom_id)
    assert again_s <= 15, f"the released jobs waited {again_s:.1f} s"
