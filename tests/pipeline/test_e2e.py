"""End to end on real Postgres, Redis and a moto S3 server: API -> Redis -> worker processes -> Postgres + S3.

Each test uses its own tenant; workers are subprocesses, so they can be SIGKILLed mid-batch.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis
from sqlalchemy import select

from tests.pipeline.conftest import ROOT, new_key, wait_for
from yue2_jobs.client import ApiError, Client
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import session_factory


@cache
def direct_summaries(texts: tuple[str, ...], mode: str = "hybrid") -> dict[str, str]:
    """What calling the model directly gives, without the pipeline."""
    from yue2_jobs.model.checkpoint import load_checkpoint
    from yue2_jobs.model.evaluate import summarize

    model, tokenizer = load_checkpoint(ROOT / "checkpoints" / "base")
    unique = sorted(set(texts))
    return dict(zip(unique, summarize(model, tokenizer, unique, mode=mode), strict=True))


def write_batch(path: Path, texts: list[str], *, prefix: str = "r") -> dict[str, str]:
    lines = [{"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/summarize", "body": {"input": t}}
             for i, t in enumerate(texts)]
    path.write_text("".join(json.dumps(ln, ensure_ascii=False) + "\n" for ln in lines))
    return {ln["custom_id"]: ln["body"]["input"] for ln in lines}


def submit(client: Client, path: Path) -> str:
    return client.create_batch(client.upload(path)["id"])["id"]


def wait_batch(client: Client, batch_id: str, *, timeout: float, worker: Any = None) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        state = client.batch(batch_id)
        return state if state["status"] in ("completed", "cancelled", "failed") else None

    try:
        return wait_for(done, timeout=timeout, what=f"batch {batch_id}", interval=0.25)
    except AssertionError:
        raise AssertionError(f"batch not done: {client.batch(batch_id)}\nworker log:\n"
                             f"{worker.tail() if worker else ''}") from None


def result_lines(client: Client, file_id: str | None) -> list[dict[str, Any]]:
    if not file_id:
        return []
    return [json.loads(ln) for ln in client.file_content(file_id).decode().splitlines()]


def batch_jobs(settings: Any, batch_id: str) -> list[Job]:
    with session_factory(settings.resolved_database_url)() as session:
        return list(session.execute(select(Job).where(Job.batch_id == batch_id)).scalars())


def count_outputs(s3: dict[str, str], tenant: str, batch_id: str) -> int:
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=s3["bucket"],
                                                             Prefix=f"out/{tenant}/{batch_id}/job_")
    return sum(1 for page in pages for obj in page.get("Contents", []) if obj["Key"].endswith(".json"))


def check_outputs(lines: list[dict[str, Any]], by_custom_id: dict[str, str]) -> None:
    expected = direct_summaries(tuple(by_custom_id.values()))
    counts = Counter(ln["custom_id"] for ln in lines)
    assert max(counts.values()) == 1, "a custom_id appears twice in the output file"
    assert set(counts) == set(by_custom_id)
    for ln in lines:
        assert ln["error"] is None and ln["response"]["status_code"] == 200
        assert ln["response"]["body"]["output"] == expected[by_custom_id[ln["custom_id"]]], ln["custom_id"]


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


def test_redis_flushall_loses_nothing(client: Client, workers: Any, settings: Any, tenant: str,
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
    broker.flushall()  # every message, queued or unacknowledged, is gone
    state = wait_batch(client, batch_id, timeout=600, worker=worker)
    assert state["request_counts"] == {"total": 150, "completed": 150, "failed": 0}
    check_outputs(result_lines(client, state["output_file_id"]), by_custom_id)
    # and with no worker running while Redis is emptied: the reconciler of a worker started later
    worker.stop()
    by_custom_id = write_batch(tmp_path / "in2.jsonl", eval_texts[150:190])
    batch_id = submit(client, tmp_path / "in2.jsonl")
    wait_for(lambda: all(j.enqueued_at for j in batch_jobs(settings, batch_id)), timeout=30,
             what="the second batch's messages")
    broker.flushall()
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


def test_single_jobs_generate_and_modes_equal_direct_calls(client: Client, workers: Any, eval_texts: list[str]
                                                           ) -> None:
    import torch

    from yue2_jobs.model.checkpoint import load_checkpoint

    text = eval_texts[3]
    worker = workers()
    jobs = {
        "ar": client.submit_job({"input": text, "mode": "ar"}),
        "hybrid": client.submit_job({"input": text, "mode": "hybrid"}),
        "auto": client.submit_job({"input": text}),  # the default mode
        "sampled": client.submit_job({"kind": "generate", "prompt": text, "do_sample": True, "seed": 7,
                                      "temperature": 0.8, "max_new_tokens": 20, "mode": "ar"}),
    }
    done = {k: wait_for(lambda j=j: (s := client.job(j["id"]))["status"] in ("succeeded", "failed") and s,
                        timeout=120, what=f"{k} job") for k, j in jobs.items()}
    assert {s["status"] for s in done.values()} == {"succeeded"}, (done, worker.tail())
    assert done["ar"]["output"] == done["hybrid"]["output"] == done["auto"]["output"] == direct_summaries((text,))[text]
    assert done["hybrid"]["params"]["mode"] == "hybrid" and done["hybrid"]["decoding"]["tau"] >= 1.0
    # Each job records the mode it ran: `auto` resolves to one of the two lossless modes.
    assert (done["ar"]["decoding"]["mode"], done["hybrid"]["decoding"]["mode"]) == ("ar", "hybrid")
    assert done["auto"]["params"]["mode"] == "auto" and done["auto"]["decoding"]["mode"] in ("ar", "hybrid")
    model, tokenizer = load_checkpoint(ROOT / "checkpoints" / "base")
    enc = tokenizer([text], truncation=True, max_length=tokenizer.model_max_length, return_tensors="pt")
    with torch.inference_mode():
        seq = model.generate(enc["input_ids"], enc["attention_mask"], yue_mode="ar", do_sample=True, seed=7,
                             temperature=0.8, max_new_tokens=20)
    assert done["sampled"]["output"] == tokenizer.decode(seq[0], skip_special_tokens=True).strip()
    assert done["sampled"]["kind"] == "generate"


def test_long_inputs_and_repetition_controls_through_the_pipeline(client: Client, workers: Any, eval_texts: list[str],
                                                                  tmp_path: Path) -> None:
    """long_input truncate / reject / chunk and the repetition controls, as single jobs and as
    batch lines: a rejected line fails alone, the others record what happened to their input."""
    import torch

    from yue2_jobs.model.checkpoint import load_checkpoint

    long_text = ""
    for text in eval_texts * 4:
        long_text += (" " if long_text else "") + text
        if len(long_text.split()) >= 3000:
            break
    assert len(long_text.split()) >= 3000
    worker = workers()
    jobs = {name: client.submit_job({"input": long_text, "long_input": name}) for name in ("reject", "chunk")}
    jobs["default"] = client.submit_job({"input": long_text})
    jobs["controls"] = client.submit_job({"input": eval_texts[5], "mode": "hybrid", "no_repeat_ngram_size": 2,
                                          "repetition_penalty": 1.3})
    done = {k: wait_for(lambda j=j: (s := client.job(j["id"]))["status"] in ("succeeded", "failed") and s,
                        timeout=300, what=f"{k} job") for k, j in jobs.items()}
    model, tokenizer = load_checkpoint(ROOT / "checkpoints" / "base")
    limit, n_tokens = tokenizer.model_max_length, len(tokenizer(long_text, verbose=False)["input_ids"])
    assert done["default"]["status"] == "succeeded" and done["default"]["params"]["long_input"] == "truncate"
    assert done["default"]["input_truncated"] is True
    usage = done["default"]["usage"]
    assert (usage["input_tokens"], usage["input_tokens_used"]) == (n_tokens, limit)
    rejected = done["reject"]
    assert rejected["status"] == "failed" and rejected["error"]["code"] == "input_too_long", rejected
    assert f"{n_tokens:,} tokens, over the limit of {limit:,} tokens" in rejected["error"]["message"]
    chunked = done["chunk"]
    assert chunked["status"] == "succeeded" and chunked["output"], (chunked, worker.tail())
    assert chunked["decoding"]["chunks"] > 5 and chunked["input_truncated"] is False
    assert chunked["decoding"]["decoder_steps"] > chunked["decoding"]["chunks"]
    enc = tokenizer([eval_texts[5]], return_tensors="pt")
    with torch.inference_mode():
        seq = model.generate(enc["input_ids"], enc["attention_mask"], yue_mode="ar", no_repeat_ngram_size=2,
                             repetition_penalty=1.3, max_new_tokens=done["controls"]["params"]["max_new_tokens"])
    assert done["controls"]["output"] == tokenizer.decode(seq[0], skip_special_tokens=True).strip()

    path = tmp_path / "long.jsonl"
    lines = [{"custom_id": c, "method": "POST", "url": "/v1/summarize", "body": {"input": t, **extra}}
             for c, t, extra in (("short", eval_texts[0], {}), ("cut", long_text, {}),
                                 ("refused", long_text, {"long_input": "reject"}))]
    path.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    state = wait_batch(client, submit(client, path), timeout=300, worker=worker)
    assert state["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    out = {ln["custom_id"]: ln["response"]["body"] for ln in result_lines(client, state["output_file_id"])}
    assert (out["short"]["input_truncated"], out["cut"]["input_truncated"]) == (False, True)
    assert out["cut"]["usage"] == {"input_tokens": n_tokens, "input_tokens_used": limit,
                                   "output_tokens": out["cut"]["usage"]["output_tokens"]}
    errors = result_lines(client, state["error_file_id"])
    assert [e["custom_id"] for e in errors] == ["refused"] and "input_too_long" in json.dumps(errors[0])


def test_cli_submit_wait_results_cancel(api: Any, settings: Any, workers: Any, eval_texts: list[str],
                                        tmp_path: Path) -> None:
    import subprocess
    import sys

    key = new_key(settings, f"t-{uuid.uuid4().hex[:8]}")
    env = {**__import__("os").environ, "YUE2_API_URL": api.url, "YUE2_API_KEY": key}

    def yue2(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "yue2_jobs", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)

    by_custom_id = write_batch(tmp_path / "in.jsonl", eval_texts[:10])
    submitted = yue2("submit", str(tmp_path / "in.jsonl"))
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip()
    assert batch_id.startswith("batch_") and "upload" in submitted.stderr
    assert json.loads(yue2("status", batch_id).stdout)["request_counts"]["total"] == 10
    worker = workers()
    waited = yue2("wait", batch_id, "--poll", "0.2")
    assert waited.returncode == 0, waited.stderr + worker.tail()
    assert json.loads(waited.stdout)["status"] == "completed" and "10/10" in waited.stderr
    assert yue2("results", batch_id, "-o", str(tmp_path / "out.jsonl")).returncode == 0
    check_outputs([json.loads(ln) for ln in (tmp_path / "out.jsonl").read_text().splitlines()], by_custom_id)
    cancelled = yue2("cancel", batch_id)
    assert cancelled.returncode == 2 and "409" in cancelled.stderr
