"""Faults during a batch, on real Postgres, Redis and a moto S3 server: a Postgres restart (of a cluster
the test started, tests/private_postgres.py: never the machine's), a 20 s S3 outage, a worker killed
with SIGKILL. After each, every custom_id is in the output or error file exactly once, no job is
left `queued` or `running`, and no job failed because of the fault.

The worker runs the echo runner (no model: tests/pipeline/echo_runner.py), so each batch is
long enough to be hit mid-run yet short, with the shipped defaults for the lease, the reconciler,
the visibility timeout, the outage retries and the prefetch (not the short test settings of the
other pipeline tests). Each test prints how long the pipeline took to recover.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from tests.pipeline.conftest import (
    ApiServer,
    S3Server,
    make_settings,
    new_key,
    service_unavailable,
    stack_env,
    wait_for,
    worker_pool,
)
from tests.pipeline.echo_runner import echo
from tests.private_postgres import PrivatePostgres, PrivatePostgresError
from tests.scratch_redis import ScratchRedis, ScratchRedisError
from yue2_jobs.client import ApiError, Client
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import engine_for, session_factory

# The shipped defaults, over the short lease and fast reconciler the other pipeline tests use.
DEFAULTS = {"YUE2_LEASE_S": "120", "YUE2_VISIBILITY_TIMEOUT_S": str(6 * 3600), "YUE2_RECONCILE_INTERVAL_S": "10",
            "YUE2_RECONCILE_GRACE_S": "30", "YUE2_BATCH_MAX_JOBS": "32", "YUE2_BATCH_FLUSH_MS": "50"}
ECHO = {"YUE2_RUNNER": "tests.pipeline.echo_runner:factory", "YUE2_TEST_JOB_MS": "15", **DEFAULTS}
N = 400


def write_lines(path: Path, n: int, *, large_every: int = 0) -> dict[str, str]:
    """`n` requests with distinct inputs; every `large_every`-th one is over the 8 KB inline limit, so
    the worker reads it back from the uploaded file."""
    by_custom_id = {}
    with path.open("w") as f:
        for i in range(n):
            text = f"request {i} about item {i * 7} " + ("and more detail " * 600 if large_every and
                                                        i % large_every == 0 else "in a sentence.")
            by_custom_id[f"c{i}"] = text
            f.write(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/summarize",
                                "body": {"input": text}}) + "\n")
    return by_custom_id


def tolerant(fn: Any) -> Any:
    """`fn()`, or None while the API answers 503 or cannot be reached (the fault is in progress)."""
    try:
        return fn()
    except ApiError as exc:
        if exc.status == 503:
            return None
        raise
    except httpx.TransportError:
        return None


def counts(client: Client, batch_id: str) -> dict[str, int] | None:
    state = tolerant(lambda: client.batch(batch_id))
    return state["request_counts"] if state else None


def wait_done(client: Client, batch_id: str, worker: Any, *, timeout: float = 240) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        state = tolerant(lambda: client.batch(batch_id))
        return state if state and state["status"] in ("completed", "failed", "cancelled") else None

    try:
        return wait_for(done, timeout=timeout, what=f"batch {batch_id} to finish", interval=0.2)
    except AssertionError:
        raise AssertionError(f"{tolerant(lambda: client.batch(batch_id))}\nworker log:\n{worker.tail()}") from None


def lines_of(client: Client, file_id: str | None) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in client.file_content(file_id).decode().splitlines()] if file_id else []


def assert_exactly_once(client: Client, settings: Any, state: dict[str, Any], by_custom_id: dict[str, str]) -> None:
    """Every custom_id once across both files, nothing left queued or running, nothing failed."""
    ok, errors = lines_of(client, state["output_file_id"]), lines_of(client, state["error_file_id"])
    seen = Counter(ln["custom_id"] for ln in ok + errors)
    assert set(seen) == set(by_custom_id) and max(seen.values()) == 1, seen.most_common(3)
    assert errors == [], f"jobs failed by the fault: {errors[:3]}"
    assert state["request_counts"] == {"total": len(by_custom_id), "completed": len(by_custom_id), "failed": 0}
    for ln in ok:
        assert ln["response"]["body"]["output"] == echo(by_custom_id[ln["custom_id"]])
    with session_factory(settings.resolved_database_url)() as session:
        statuses = Counter(session.execute(select(Job.status).where(Job.batch_id == state["id"])).scalars())
    assert statuses == {"succeeded": len(by_custom_id)}, statuses


def run_with_fault(client: Client, workers: Any, tmp_path: Path, fault: Any, *, large_every: int = 0
                   ) -> tuple[dict[str, Any], dict[str, str], dict[str, float], Any]:
    by_custom_id = write_lines(tmp_path / "in.jsonl", N, large_every=large_every)
    worker = workers(**ECHO)
    batch_id = client.create_batch(client.upload(tmp_path / "in.jsonl")["id"])["id"]
    wait_for(lambda: (counts(client, batch_id) or {"completed": 0})["completed"] >= 40, timeout=120,
             what="the batch to be under way", interval=0.05)
    before = counts(client, batch_id)
    assert before is not None and before["completed"] < N, "the batch finished before the fault"
    t_fault = time.monotonic()
    worker = fault(worker) or worker
    t_cleared = time.monotonic()
    at_clear = (counts(client, batch_id) or before)["completed"]
    wait_for(lambda: (counts(client, batch_id) or {"completed": 0})["completed"] > at_clear or
             (counts(client, batch_id) or {"completed": 0})["completed"] == N, timeout=120,
             what="jobs to finish again after the fault", interval=0.05)
    t_flowing = time.monotonic()
    state = wait_done(client, batch_id, worker)
    timing = {"fault_s": round(t_cleared - t_fault, 2), "flowing_again_after_s": round(t_flowing - t_cleared, 2),
              "batch_done_after_s": round(time.monotonic() - t_cleared, 2)}
    return state, by_custom_id, timing, worker


@dataclass
class PrivateStack:
    """The API, workers and settings of one test, on a Postgres cluster and a Redis server of its own."""
    postgres: PrivatePostgres
    settings: Any
    client: Client
    workers: Any


@pytest.fixture
def private_stack(s3: dict[str, str], tenant: str, tmp_path: Path) -> Iterator[PrivateStack]:
    """A stack the test may take Postgres away from: the session's shares the machine's cluster with
    everyone on it. Its broker is a scratch Redis of its own too, so no message of the session's
    stack (published to the shared database 0) names a job its database lacks."""
    with contextlib.ExitStack() as stack:
        try:
            postgres = PrivatePostgres.create()
        except PrivatePostgresError as exc:
            reason = f"restarting a Postgres of the test's own needs root and initdb: {exc}"
            if os.environ.get("CI") == "true":
                pytest.fail(reason + " (CI=true: the chaos tests must run)")
            pytest.skip(reason)
        stack.callback(postgres.destroy)
        stack.callback(lambda: engine_for(postgres.url()).dispose())  # close its pool before the server goes
        try:
            broker = ScratchRedis.start()
        except ScratchRedisError as exc:
            service_unavailable("a Redis server of the test's own", exc)
        stack.callback(broker.stop)
        env = stack_env(database_url=postgres.url(), broker_url=broker.url(0), s3=s3, home=tmp_path)
        settings = make_settings(env)
        api = ApiServer(settings)
        stack.callback(api.stop)
        start_worker = stack.enter_context(worker_pool(env, tmp_path))
        yield PrivateStack(postgres=postgres, settings=settings, client=Client(api.url, new_key(settings, tenant)),
                           workers=start_worker)


def test_postgres_restart_mid_batch_strands_and_fails_nothing(private_stack: PrivateStack, tmp_path: Path) -> None:
    client, settings = private_stack.client, private_stack.settings

    def restart(_: Any) -> None:
        private_stack.postgres.restart()  # a fast shutdown: every session is cut, as in a real restart
        # This process's pooled connections (the test's and the in-thread API's) died with the
        # server; the API would find out on its next statement (one 503), the test need not.
        engine_for(settings.resolved_database_url).dispose()

    state, by_custom_id, timing, worker = run_with_fault(client, private_stack.workers, tmp_path, restart)
    assert_exactly_once(client, settings, state, by_custom_id)
    assert "retrying in" in worker.log.read_text(errors="replace"), "the restart did not meet the worker"
    print(f"postgres restart: {timing}")


def test_s3_outage_of_20s_mid_batch_fails_nothing(client: Client, workers: Any, settings: Any,
                                                  s3_server: S3Server, tmp_path: Path) -> None:
    def outage(worker: Any) -> None:
        s3_server.stop()
        t0 = time.monotonic()
        try:
            # The outage must be noticed mid-batch (the worker retries a read or an upload) ...
            wait_for(lambda: "retrying in" in worker.tail(), timeout=20, what="the worker to meet the outage")
            # ... and last 20 s, as in the probe: the fault is the passing time itself.
            time.sleep(max(0.0, 20 - (time.monotonic() - t0)))
        finally:
            s3_server.start()

    state, by_custom_id, timing, _ = run_with_fault(client, workers, tmp_path, outage, large_every=25)
    assert_exactly_once(client, settings, state, by_custom_id)  # large inputs included: read back by range
    print(f"s3 outage: {timing}")


def test_sigkill_of_the_worker_mid_batch_loses_and_duplicates_nothing(client: Client, workers: Any, settings: Any,
                                                                     tenant: str, tmp_path: Path) -> None:
    held: list[str] = []

    def kill(worker: Any) -> Any:
        worker.kill()
        with session_factory(settings.resolved_database_url)() as session:
            held.extend(session.execute(select(Job.id).where(Job.status == "running", Job.tenant == tenant)
                                        ).scalars())
        return workers(**ECHO)  # a replacement, as the launcher would start

    state, by_custom_id, timing, _ = run_with_fault(client, workers, tmp_path, kill)
    assert_exactly_once(client, settings, state, by_custom_id)
    with session_factory(settings.resolved_database_url)() as session:
        attempts = dict(session.execute(select(Job.id, Job.attempts).where(Job.batch_id == state["id"])).all())
    assert held and all(attempts[j] == 2 for j in held if j in attempts), "jobs the dead worker held ran once more"
    assert max(attempts.values()) <= 2
    print(f"worker SIGKILL: {timing}")


def unacked_job_ids(redis_url: str) -> set[str]:
    """Job ids in every message Redis holds as delivered and unacknowledged (kombu's `unacked` hash)."""
    import redis

    from yue2_jobs.queue import job_ids_of_message

    with redis.Redis.from_url(redis_url) as r:
        return {j for raw in r.hvals("unacked") for j in job_ids_of_message(raw)}


def test_a_killed_worker_with_default_settings_stalls_the_queue_for_seconds(
        client: Client, workers: Any, settings: Any, redis_url: str, tenant: str, tmp_path: Path) -> None:
    """The launcher's child is SIGKILLed mid-batch; the launcher restarts it under the same name, and
    the replacement puts the dead one's claims and prefetched messages back before it loads, so the
    queue moves as soon as it is ready: not after the 120 s lease or the 6 h visibility timeout."""
    from yue2_jobs.db.models import WorkerProcess

    n = 500
    by_custom_id = write_lines(tmp_path / "in.jsonl", n)
    ready = tmp_path / "ready"
    host = f"chaos-{tenant}"
    launcher = workers("--host", host, **{**ECHO, "YUE2_TEST_JOB_MS": "20",
                                          "YUE2_WORKER_READY_FILE": str(ready)})
    child_ready = ready.with_name("ready.0")
    wait_for(child_ready.exists, timeout=120, what="the worker to be ready")
    batch_id = client.create_batch(client.upload(tmp_path / "in.jsonl")["id"])["id"]
    wait_for(lambda: (counts(client, batch_id) or {"completed": 0})["completed"] >= 100, timeout=120,
             what="the batch to be under way", interval=0.02)
    node = f"base-cpu0@{host}"
    with session_factory(settings.resolved_database_url)() as session:
        pid = session.execute(select(WorkerProcess.pid).where(WorkerProcess.name == node)).scalar_one()
        held = list(session.execute(select(Job.id).where(Job.status == "running", Job.batch_id == batch_id))
                    .scalars())
    child_ready.unlink()
    os.kill(pid, 9)
    t_kill = time.monotonic()
    at_kill = counts(client, batch_id)
    assert at_kill is not None and at_kill["completed"] < n, "the batch finished before the kill"
    assert unacked_job_ids(redis_url) & set(held), "the dead worker held no unacknowledged message"
    wait_for(child_ready.exists, timeout=120, what="the launcher's replacement to be ready", interval=0.02)
    t_ready = time.monotonic()
    at_ready = counts(client, batch_id)
    assert at_ready is not None
    wait_for(lambda: (counts(client, batch_id) or {"completed": 0})["completed"] > at_ready["completed"],
             timeout=120, what="jobs to finish again after the replacement is ready", interval=0.05)
    t_moving = time.monotonic()
    state = wait_done(client, batch_id, launcher)
    moving_s = t_moving - t_ready
    print(f"worker SIGKILL, default settings: replacement ready {t_ready - t_kill:.1f} s after the kill; queue "
          f"moving again {moving_s:.2f} s after the replacement is ready (target <= 15 s); batch done "
          f"{time.monotonic() - t_kill:.1f} s after the kill; {at_kill['completed']} of {n} done at the kill")
    assert_exactly_once(client, settings, state, by_custom_id)
    assert moving_s <= 15, f"the queue stood still {moving_s:.1f} s after the replacement was ready"
    with session_factory(settings.resolved_database_url)() as session:
        attempts = dict(session.execute(select(Job.id, Job.attempts).where(Job.batch_id == batch_id)).all())
    assert held and max(attempts.values()) <= 2
    # Nothing of the dead worker lingers in Redis: no unacknowledged message carries this batch's jobs
    # once the worker's last micro-batch returns (the batch is completed as its last job is recorded,
    # a moment before the micro-batch that recorded it is acknowledged).
    t_done = time.monotonic()
    wait_for(lambda: not unacked_job_ids(redis_url) & set(attempts), timeout=30,
             what="every message of the batch to be acknowledged", interval=0.05)
    print(f"the batch's last message acknowledged {time.monotonic() - t_done:.2f} s after it completed")
