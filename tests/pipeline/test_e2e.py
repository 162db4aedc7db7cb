"""End to end on real Postgres, Redis and a moto S3 server: API -> Redis -> worker processes -> Postgres + S3.

Each test uses its own tenant; workers are subprocesses, so they can be SIGKILLed mid-batch.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.pipeline.conftest import new_key, wait_for
from tests.pipeline.e2e_helpers import (
    batch_jobs,
    check_outputs,
    count_outputs,
    direct_summaries,
    result_lines,
    submit,
    wait_batch,
    write_batch,
)
from tests.scratch_redis import flush
from yue2_jobs.client import ApiError, Client


def test_500_jobs_end_to_end(client: Client, workers: Any, settings: Any, s3: dict[str, str], tenant: str,
                             eval_texts: list[str], tmp_path: Path) -> None:
    texts = (eval_texts * 2)[:500]
    by_custom_id = write_batch(tmp_path / "in.jsonl", texts)
    worker = workers()
    batch_id = submit(client, tmp_path / "in.jsonl")
    state = wait_batch(client, batch_id, timeout=600, worker=worker)
    assert state["status"] == "completed"
    assert state["request_counts"] == {"total": 500, "completed": 500, "failed": 0}
    assert state["error_file_id"] is None
    check_outputs(result_lines(client, state["output_file_id"]), by_custom_id)
    jobs = batch_jobs(settings, batch_id)
    assert {j.status for j in jobs} == {"succeeded"}
    assert {j.attempts for j in jobs} == {1}
    assert len({j.checkpoint for j in jobs}) == 1 and jobs[0].checkpoint.startswith("base@")
    assert all(j.output_tokens and j.decoder_steps and j.started_at <= j.finished_at for j in jobs)
    assert count_outputs(s3, tenant, batch_id) == 500
    one = client.job(jobs[0].id)
    assert one["output"] == direct_summaries(tuple(by_custom_id.values()))[by_custom_id[jobs[0].custom_id]]
    assert one["output_url"].startswith(s3["endpoint"])


def test_redis_flushed_loses_nothing(client: Client, workers: Any, settings: Any, tenant: str,
                                      eval_texts: list[str], tmp_path: Path) -> None:
    by_custom_id = write_batch(tmp_path / "in.jsonl", eval_texts[:150])
    batch_id = submit(client, tmp_path / "in.jsonl")
    broker = redis.Redis.from_url(settings.broker_url)
    wait_for(lambda: all(j.enqueued_at for j in batch_jobs(settings, batch_id)), timeout=30,
             what="the batch's messages in Redis")
    assert broker.llen("yue2.base") > 0
    worker = workers()
    wait_for(lambda: client.batch(batch_id)["request_counts"]["completed"] >= 10, timeout=300,
             what="the first jobs to finish", interval=0.05)
    flush(settings.broker_url)  # every message, queued or unacknowledged, is gone (the database is the run's own)
    state = wait_batch(client, batch_id, timeout=600, worker=worker)
    assert state["request_counts"] == {"total": 150, "completed": 150, "failed": 0}
    check_outputs(result_lines(client, state["output_file_id"]), by_custom_id)
    # and with no worker running while Redis is emptied: the reconciler of a worker started later
    worker.stop()
    by_custom_id = write_batch(tmp_path / "in2.jsonl", eval_texts[150:190])
    batch_id = submit(client, tmp_path / "in2.jsonl")
    wait_for(lambda: all(j.enqueued_at for j in batch_jobs(settings, batch_id)), timeout=30,
             what="the second batch's messages")
    flush(settings.broker_url)
    assert broker.llen("yue2.base") == 0
    worker = workers()
    state = wait_batch(client, batch_id, timeout=300, worker=worker)
    assert state["request_counts"] == {"total": 40, "completed": 40, "failed": 0}
    check_outputs(result_lines(client, state["output_file_id"]), by_custom_id)


def test_poison_job_fails_after_max_attempts_and_batch_mates_succeed(
        client: Client, workers: Any, settings: Any, eval_texts: list[str], tmp_path: Path) -> None:
    texts = eval_texts[:24]
    texts[5] = "KILLME " + texts[5]
    texts[17] = "RAISEME " + texts[17]
    by_custom_id = write_batch(tmp_path / "in.jsonl", texts)
    env = {"YUE2_RUNNER": "tests.pipeline.faulty_runner:factory", "YUE2_MAX_ATTEMPTS": "3",
           "YUE2_WORKER_RESTART_MAX_S": "1"}
    batch_id = submit(client, tmp_path / "in.jsonl")
    worker = workers(**env)  # the launcher restarts its child each time the poison job kills it
    wait_for(lambda: client.batch(batch_id)["status"] == "completed", timeout=600,
             what="the batch with a poison job", interval=0.2)
    assert worker.alive()
    kills = worker.log.read_text(errors="replace").count("exited with -9; restarting")
    state = client.batch(batch_id)
    assert state["request_counts"] == {"total": 24, "completed": 22, "failed": 2}
    errors = {ln["custom_id"]: ln for ln in result_lines(client, state["error_file_id"])}
    assert set(errors) == {"r5", "r17"}
    assert errors["r5"]["error"]["code"] == "max_attempts_exceeded"
    assert errors["r17"]["error"]["code"] == "job_failed" and "RAISEME" in errors["r17"]["error"]["message"]
    jobs = {j.custom_id: j for j in batch_jobs(settings, batch_id)}
    assert jobs["r5"].attempts == 3 and kills == 3
    assert jobs["r17"].attempts <= 2  # 2 when it shared the first, killed, micro-batch with r5
    check_outputs(result_lines(client, state["output_file_id"]),
                  {k: v for k, v in by_custom_id.items() if k not in ("r5", "r17")})
    assert max(j.attempts for k, j in jobs.items() if k != "r5") <= 2


def test_openai_client_against_the_api(api: Any, settings: Any, workers: Any, eval_texts: list[str],
                                       tmp_path: Path) -> None:
    import openai

    key = new_key(settings, f"t-{uuid.uuid4().hex[:8]}")
    oa = openai.OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0)
    by_custom_id = write_batch(tmp_path / "in.jsonl", eval_texts[:12])
    with (tmp_path / "in.jsonl").open("rb") as f:
        uploaded = oa.files.create(file=f, purpose="batch")
    batch = oa.batches.create(input_file_id=uploaded.id, endpoint="/v1/summarize",  # type: ignore[arg-type]
                              completion_window="24h", metadata={"run": "test"})
    assert batch.status == "in_progress" and batch.request_counts.total == 12
    worker = workers()
    batch = wait_for(lambda: (b := oa.batches.retrieve(batch.id)).status == "completed" and b, timeout=300,
                     what=f"batch {batch.id} via the openai client")
    assert batch.request_counts.completed == 12 and batch.metadata == {"run": "test"}
    lines = [json.loads(ln) for ln in oa.files.content(batch.output_file_id).text.splitlines()]
    check_outputs(lines, by_custom_id)
    assert oa.files.content(uploaded.id).read() == (tmp_path / "in.jsonl").read_bytes()
    with pytest.raises(openai.NotFoundError):
        oa.batches.retrieve("batch_" + "0" * 32)
    worker.stop()


def test_cancel_job_and_batch(client: Client, workers: Any, settings: Any, eval_texts: list[str],
                              tmp_path: Path) -> None:
    # Queued work cancelled before any worker runs: it never runs.
    job = client.submit_job({"input": eval_texts[0]})
    assert client.cancel(job["id"])["status"] == "cancelled"
    write_batch(tmp_path / "a.jsonl", eval_texts[:30])
    queued_batch = submit(client, tmp_path / "a.jsonl")
    state = client.cancel(queued_batch)
    assert state["status"] == "cancelled" and state["request_counts"]["completed"] == 0
    errors = result_lines(client, state["error_file_id"])
    assert len(errors) == 30 and {e["error"]["code"] for e in errors} == {"cancelled"}
    # A running batch: finished jobs keep their results, the rest end cancelled.
    write_batch(tmp_path / "b.jsonl", eval_texts[:250])
    running_batch = submit(client, tmp_path / "b.jsonl")
    worker = workers()
    wait_for(lambda: client.batch(running_batch)["request_counts"]["completed"] >= 20, timeout=300,
             what="part of the batch to finish", interval=0.05)
    assert client.cancel(running_batch)["status"] in ("cancelling", "cancelled")
    state = wait_batch(client, running_batch, timeout=300, worker=worker)
    assert state["status"] == "cancelled"
    done, errors = result_lines(client, state["output_file_id"]), result_lines(client, state["error_file_id"])
    assert len(done) + len(errors) == 250 and len(errors) > 0 and len(done) >= 20
    jobs = batch_jobs(settings, running_batch) + batch_jobs(settings, queued_batch)
    assert all(j.output_key is None for j in jobs if j.status == "cancelled")
    assert client.job(job["id"])["status"] == "cancelled"
    assert client.cancel(running_batch)["status"] == "cancelled"  # cancelling twice is harmless
    # Cancelling a completed batch is a conflict, not a silent change.
    write_batch(tmp_path / "c.jsonl", eval_texts[:2])
    small = submit(client, tmp_path / "c.jsonl")
    assert wait_batch(client, small, timeout=120, worker=worker)["status"] == "completed"
    with pytest.raises(ApiError, match="409"):
        client.cancel(small)
