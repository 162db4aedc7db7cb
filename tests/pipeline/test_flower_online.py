"""Flower tells the truth about a busy worker: while a long micro-batch runs, the worker keeps
sending its heartbeats (Flower: Online) and answers inspect commands at once, and it takes no more
messages off the queue than it did when the batch ran in its main thread (another worker gets them).

The worker runs a runner (below) that holds the GIL for its whole decoding time, as a CPU-bound
decode loop would: one micro-batch of 300 jobs lasts about 20 s, against Flower's heartbeat expiry of
4 s (Celery's 2 s heartbeat, times two).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.pipeline.conftest import ROOT, wait_for
from tests.pipeline.e2e_helpers import batch_jobs, submit, wait_batch, write_batch
from tests.pipeline.echo_runner import echo
from workers.job_io import JobInput, JobOutput
from yue2_jobs.core.net import free_port
from yue2_jobs.db.models import JobStatus
from yue2_jobs.queue import queue_depth

JOB_MS = 70  # x 300 jobs: a micro-batch of about 21 s
AUTH = ("ops", "s3cret")
# The shipped lease and reconciler, not the pipeline tests' 2 s lease: under that, the micro-batch's
# unstarted jobs would count as lost (delivered more than a lease ago) and be published again.
SHIPPED = {"YUE2_LEASE_S": "120", "YUE2_RECONCILE_INTERVAL_S": "10", "YUE2_RECONCILE_GRACE_S": "30"}


class BusyRunner:
    """The echo runner's outputs (tests/pipeline/echo_runner.py), but its decoding time is spent
    computing in Python (holding the GIL), not asleep."""

    def __init__(self, *, variant: str, settings: Any, directory: Path | None = None) -> None:
        self.variant, self.settings = variant, settings
        self.checkpoint = f"{variant}@busy"
        self.weights_sha256 = None
        self.job_s = float(os.environ.get("YUE2_TEST_JOB_MS", "10")) / 1000

    def run(self, jobs: list[JobInput]) -> list[JobOutput | Exception]:
        end = time.monotonic() + self.job_s * len(jobs)
        spins = 0
        while time.monotonic() < end:
            spins += 1
        return [JobOutput(text=echo(j.text), input_tokens=len(j.text.split()), output_tokens=len(echo(j.text).split()),
                          decoder_steps=1, nar_tokens=0) for j in jobs]


def factory(**kwargs: Any) -> BusyRunner:
    return BusyRunner(**kwargs)


def test_a_worker_busy_in_a_micro_batch_stays_online_in_flower(
        client: Any, workers: Any, settings: Any, pipeline_env: dict[str, str], tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    worker = workers(YUE2_RUNNER="tests.pipeline.test_flower_online:factory", YUE2_TEST_JOB_MS=str(JOB_MS),
                     YUE2_WORKER_READY_FILE=str(ready), **SHIPPED)
    flower_port = free_port()
    flower_log = tmp_path / "flower.log"
    flower = subprocess.Popen([sys.executable, "-m", "yue2_jobs", "flower", "--port", str(flower_port),
                               "--basic-auth", ":".join(AUTH)], cwd=ROOT, env={**os.environ, **pipeline_env},
                              stdout=flower_log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    flower_url = f"http://127.0.0.1:{flower_port}/api/workers"

    def get(**params: str) -> Any:
        try:
            r = httpx.get(flower_url, params=params, auth=AUTH, timeout=15)  # inspect waits up to 5 s
        except httpx.TransportError:
            return None
        return r.json() if r.status_code == 200 else None

    try:
        name = wait_for(lambda: ready.exists() and ready.read_text().strip(), timeout=120,
                        what=f"the worker to start\n{worker.tail()}")
        wait_for(lambda: (get(status="1") or {}).get(name), timeout=60, what=f"Flower to see {name} online")

        write_batch(tmp_path / "long.jsonl", [f"request {i} about item {i * 7} in a sentence." for i in range(300)])
        long_batch = submit(client, tmp_path / "long.jsonl")  # 10 messages, one micro-batch
        wait_for(lambda: any(j.status == JobStatus.RUNNING for j in batch_jobs(settings, long_batch)), timeout=60,
                 what="the micro-batch to start")
        started = time.monotonic()
        time.sleep(2)  # no receive in flight is left from before the batch (kombu's BRPOP waits 1 s)
        write_batch(tmp_path / "next.jsonl", [f"later request {i}." for i in range(40)], prefix="n")
        next_batch = submit(client, tmp_path / "next.jsonl")  # 2 messages, for whoever is free

        polls: list[tuple[float, Any, bool]] = []
        while time.monotonic() - started < 12 or len(polls) < 6:
            sent = time.time()
            status = get(status="1")
            inspected = get(refresh="1", workername=name)
            answered = bool(inspected) and inspected[name].get("timestamp", 0) >= sent
            polls.append((round(time.monotonic() - started, 1), (status or {}).get(name), answered))
            time.sleep(1)
        print(f"polls (s into the batch, online, answered inspect): {polls}")
        assert all(online and answered for _, online, answered in polls), f"(s, online, answered inspect): {polls}"
        running = [j for j in batch_jobs(settings, long_batch) if j.status in (JobStatus.RUNNING, JobStatus.QUEUED)]
        assert running, "the micro-batch ended before the last poll: lengthen it"
        # Busy, it leaves the next batch's messages on the queue, for an idle worker to take.
        assert queue_depth(settings, settings.default_variant) == 2
        stats = inspected[name]["stats"]
        assert stats["prefetch_count"] == settings.batch_max_jobs, stats  # --concurrency 1: one micro-batch
        assert stats["pool"]["max-concurrency"] == 1, stats

        assert wait_batch(client, long_batch, timeout=120, worker=worker)["request_counts"]["completed"] == 300
        assert wait_batch(client, next_batch, timeout=60, worker=worker)["request_counts"]["completed"] == 40
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(20)
