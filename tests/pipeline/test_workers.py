"""The launcher against the real pipeline: warm shutdown loses and redoes no job; Flower lists the
workers with basic auth and its counters, and the worker's Prometheus counters, rise as jobs run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.pipeline.conftest import ROOT, wait_for
from tests.pipeline.test_e2e import batch_jobs, check_outputs, result_lines, submit, wait_batch, write_batch
from yue2_jobs.core.net import free_port
from yue2_jobs.db.models import JobStatus


def test_warm_shutdown_finishes_the_current_batch_and_loses_no_job(
        client: Any, workers: Any, settings: Any, eval_texts: list[str], tmp_path: Path) -> None:
    by_custom_id = write_batch(tmp_path / "in.jsonl", (eval_texts * 2)[:160])
    batch_id = submit(client, tmp_path / "in.jsonl")  # 5 messages of 32 job ids
    worker = workers(YUE2_BATCH_MAX_JOBS="1")  # one message per micro-batch: SIGTERM lands mid-backlog
    wait_for(lambda: client.batch(batch_id)["request_counts"]["completed"] >= 5, timeout=120,
             what="the first jobs to finish")
    assert worker.proc is not None
    os.kill(worker.proc.pid, signal.SIGTERM)  # the launcher only: it forwards a warm shutdown to its child
    assert worker.proc.wait(120) == 0, worker.tail()
    log = worker.log.read_text(errors="replace")
    assert "warm shutdown: 1 worker(s) finish their current batch" in log
    statuses = [j.status for j in batch_jobs(settings, batch_id)]
    assert JobStatus.RUNNING not in statuses, "a job was left half-done"
    done_before = statuses.count(JobStatus.SUCCEEDED)
    assert done_before % 32 == 0 and 32 <= done_before < 160, done_before  # whole micro-batches
    workers()
    state = wait_batch(client, batch_id, timeout=300)
    assert state["request_counts"] == {"total": 160, "completed": 160, "failed": 0}
    assert {j.attempts for j in batch_jobs(settings, batch_id)} == {1}  # nothing was started twice
    check_outputs(result_lines(client, state["output_file_id"]), by_custom_id)


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_flower_lists_workers_and_counters_rise(client: Any, workers: Any, pipeline_env: dict[str, str],
                                               eval_texts: list[str], tmp_path: Path) -> None:
    metrics_port, flower_port = free_port(), free_port()
    worker = workers(YUE2_METRICS_PORT=str(metrics_port))
    flower_log = tmp_path / "flower.log"
    flower = subprocess.Popen([sys.executable, "-m", "yue2_jobs", "flower", "--port", str(flower_port),
                               "--basic-auth", "ops:s3cret"], cwd=ROOT, env={**os.environ, **pipeline_env},
                              stdout=flower_log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        flower_url = f"http://127.0.0.1:{flower_port}"
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

        def get(url: str, **kw: Any) -> httpx.Response | None:
            try:
                return httpx.get(url, timeout=15, **kw)  # Flower waits up to 5 s per inspect command
            except httpx.TransportError:
                return None

        page = wait_for(lambda: get(metrics_url), timeout=120, what="the worker's metrics endpoint").text
        node = re.search(r'yue2_worker_checkpoint_events_total\{checkpoint="base@\w+",event="load",worker="([^"]+)"',
                         page)
        assert node, page[:2000]
        name = node.group(1)
        assert _metric(page, "yue2_worker_jobs_total", worker=name, status="succeeded") == 0

        def listed() -> dict[str, Any] | None:
            r = get(f"{flower_url}/api/workers", params={"refresh": "1"}, auth=("ops", "s3cret"))
            return r.json() if r is not None and r.status_code == 200 and name in r.json() else None

        before = wait_for(listed, timeout=60, what=f"Flower to list {name}")
        unauth = get(f"{flower_url}/api/workers")
        assert unauth is not None and unauth.status_code == 401
        assert get(f"{flower_url}/api/workers", auth=("ops", "wrong")).status_code == 401  # type: ignore[union-attr]
        tasks_before = sum(before[name].get("stats", {}).get("total", {}).values())

        write_batch(tmp_path / "in.jsonl", eval_texts[:40])
        batch_id = submit(client, tmp_path / "in.jsonl")
        state = wait_batch(client, batch_id, timeout=300, worker=worker)
        assert state["request_counts"]["completed"] == 40

        page = get(metrics_url).text  # type: ignore[union-attr]
        assert _metric(page, "yue2_worker_jobs_total", worker=name, status="succeeded") == 40
        assert _metric(page, "yue2_worker_tokens_total", worker=name) > 40
        assert _metric(page, "yue2_worker_batch_occupancy_count", worker=name) > 0  # decoder steps observed
        assert _metric(page, "yue2_worker_decoder_steps_total", worker=name) > 0
        assert 'yue2_worker_queue_depth{where="broker"' in page or "yue2_worker_queue_depth{" in page

        def counted() -> bool:
            after = listed()
            return bool(after) and sum(after[name].get("stats", {}).get("total", {}).values()) > tasks_before

        wait_for(counted, timeout=60, what="the worker's task counter in Flower to rise")
        tasks = get(f"{flower_url}/api/tasks", params={"workername": name}, auth=("ops", "s3cret")).json()
        done = [t for t in tasks.values() if t["state"] == "SUCCESS" and t["name"] == "yue2.run_jobs"]
        assert len(done) == 2  # 40 jobs = 2 messages of 32 and 8 ids, each a task event pair
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(20)
    # A worker still loading answers inspect commands later; that is not a warning.
    assert "Inspect method" not in flower_log.read_text(), flower_log.read_text()[-3000:]
