"""Pipeline benchmark: N summary jobs through API -> Redis -> worker -> Postgres + S3 (a moto server).

Measures, in one run:
- submit time: upload of the JSONL file plus POST /v1/batches (the jobs are in Postgres then);
- end-to-end jobs/s and decoder tokens/s, from the start of the submit to the batch `completed`;
- the bare decoder's tokens/s on the same texts: what a worker runs (its runner, the continuous
  engine, the jobs' default mode with a fresh chooser, groups of --batch, the same torch threads)
  in this process without the pipeline, once before the pipeline starts and once after it stops
  (this VM's speed drifts by tens of percent over minutes); pipeline efficiency = end-to-end
  tokens/s / their mean, printed with the modes both decoded; a figure above 1.05 is flagged, not
  reported as efficiency;
- GET /v1/jobs/{id} latency p50/p99 under an open-loop load of --rps requests/s while a second
  batch (--latency-jobs) runs. It is a separate phase: on a 2-core machine the load generator and
  the API would otherwise take the worker's cores and the efficiency figure would measure that.

Every process runs on this machine: the API (uvicorn), one worker, Postgres, Redis, moto and the
load generator share its cores. Needs Postgres and Redis on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from procs import http_up, stop_all, wait_until  # noqa: E402
from scratch_db import ScratchDatabase  # noqa: E402

from yue2_jobs.core.net import free_port  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def texts_for(n: int) -> list[str]:
    from yue2_jobs.training.data import read_split

    pool = [r["text"] for c in ("general", "legal") for r in read_split(ROOT / "data", c, "eval")]
    return [pool[i % len(pool)] for i in range(n)]


def bare_tokens_per_s(texts: list[str], *, variant_dir: Path, batch: int, threads: int) -> dict[str, Any]:
    """What one worker process decodes without the pipeline: its runner (`ModelRunner`) with a
    worker's settings (continuous batching, the API's defaults for a `{"input": ...}` line, so the
    jobs' default mode and its chooser starting fresh, `batch` jobs per group, `threads` torch
    threads). The jobs come in deliveries as a worker takes them (`batch` messages of `batch` ids,
    its prefetch) and each delivery is drained before the next, its groups admitted as the
    engine's queue runs low, as `workers/engine_loop.py` does. Left out: claiming, recording,
    uploads and the broker, which is what efficiency measures."""
    import torch

    from workers.job_io import JobInput
    from workers.runner import ModelRunner
    from yue2_jobs.core.config import Settings
    from yue2_jobs.jobs.params import validate_job

    torch.set_num_threads(threads)
    settings = Settings(checkpoints={"base": variant_dir}, batch_max_jobs=batch, torch_threads=threads)
    runner = ModelRunner(variant="base", settings=settings)
    jobs = [JobInput.of(id=str(i), kind="summarize", text=t,
                        params=validate_job({"input": t}, kind=None, settings=settings).params)
            for i, t in enumerate(texts)]
    assert all(runner.continuous_ok(j) for j in jobs)
    delivery = batch * batch  # queue.make_celery: a worker prefetches batch_max_jobs messages of as many ids
    tokens, modes = 0, Counter[str]()
    t0 = time.perf_counter()
    for start in range(0, len(jobs), delivery):
        out = _drain(runner, jobs[start:start + delivery], batch)
        tokens += sum(o.output_tokens for o in out)
        modes.update(o.mode or "?" for o in out)
    dt = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt, "jobs_per_s": len(jobs) / dt,
            "mode": jobs[0].decoding_params.mode, "decoded_modes": dict(modes), "batching": settings.batching,
            "delivery_jobs": delivery}


def _drain(runner: Any, jobs: list[Any], batch: int) -> list[Any]:
    """One delivery through the runner's engine until it is empty (`engine_loop._continuous_loop`
    without the database): groups of `batch` admitted while the engine's queue is short, a row
    that failed with its whole step rerun alone."""
    from collections import deque

    engine = runner.engine
    todo = deque(jobs[i:i + batch] for i in range(0, len(jobs), batch))
    by_id = {j.id: j for j in jobs}
    outputs = []
    while todo or engine.has_work():
        while todo and len(engine.waiting) < engine.max_rows:
            requests, bad = runner.requests_for(todo.popleft())
            assert not bad, bad
            engine.submit(requests)
        for res in engine.step():
            out = runner.run([by_id[res.request.key]])[0] if res.isolate else runner.output_of(res)
            assert not isinstance(out, Exception), out
            outputs.append(out)
    return outputs


def efficiency_text(result: dict[str, Any]) -> str:
    """The efficiency, or why it is not one: above 1.05 the baseline is not what the worker ran, or
    the machine's speed moved between the runs (the bare runs before and after say by how much)."""
    eff, bare = result["efficiency"], result["bare"]
    if eff <= 1.05:
        return f"{eff:.3f}"
    drift = abs(bare["before"]["tokens_per_s"] - bare["after"]["tokens_per_s"]) / bare["tokens_per_s"]
    return f"{eff:.3f}?! (>1.05: the bare runs differ by {100 * drift:.0f}%; rerun)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--bare-jobs", type=int, default=10_000, help="texts the bare decoder runs (a prefix; "
                        "the same as --jobs by default, so the chooser learns over as many jobs)")
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size (YUE2_BATCH_MAX_JOBS)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the worker and the bare run")
    parser.add_argument("--rps", type=int, default=200, help="GET /v1/jobs/{id} requests per second")
    parser.add_argument("--worker-nice", type=int, default=10, help="nice value of the worker process")
    parser.add_argument("--latency-jobs", type=int, default=2_000, help="jobs of the batch that runs under GET load")
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pipeline.json"))
    args = parser.parse_args()

    import boto3
    import httpx
    import redis
    from sqlalchemy import select

    from yue2_jobs.auth import create_api_key
    from yue2_jobs.client import Client
    from yue2_jobs.db.models import Job
    from yue2_jobs.db.session import session_factory

    texts = texts_for(args.jobs)
    bare_kwargs = {"variant_dir": ROOT / "checkpoints" / "base", "batch": args.batch, "threads": args.threads}
    print(f"bare decoder on {args.bare_jobs} texts (before)")
    bare_before = bare_tokens_per_s(texts[:args.bare_jobs], **bare_kwargs)
    scratch = ScratchDatabase.create(args.pg, "yue2_bench")
    db, db_url = scratch.name, scratch.url
    redis.Redis.from_url(args.redis).flushdb()
    procs: list[subprocess.Popen[bytes]] = []
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"yue2-bench-{db}"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        s3_port, api_port = free_port(), free_port()
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "YUE2_HOME": str(logs), "YUE2_DATABASE_URL": db_url, "YUE2_BROKER_URL": args.redis,
               "YUE2_STORAGE_URL": "s3://yue2-bench/out", "YUE2_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
               "YUE2_BATCH_MAX_JOBS": str(args.batch), "YUE2_TORCH_THREADS": str(args.threads),
               "YUE2_WORKER_READY_FILE": str(logs / "ready")}
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        procs.append(subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        endpoint = f"http://127.0.0.1:{s3_port}"
        wait_until(lambda: http_up(httpx, endpoint), 30, "moto")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="yue2-bench")
        procs.append(subprocess.Popen([sys.executable, "-m", "yue2_jobs", "api", "--port", str(api_port)], cwd=ROOT,
                                      env=env, stdout=(logs / "api.log").open("wb"), stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{api_port}"
        wait_until(lambda: http_up(httpx, url + "/healthz"), 60, "the API")
        # Everything shares this machine's cores; the worker runs at nice 10, as a batch worker placed
        # beside an API should, so that interactive GETs are not queued behind decoding.
        procs.append(subprocess.Popen(["nice", "-n", str(args.worker_nice), sys.executable, "-m", "workers"],
                                      cwd=ROOT, env=env,
                                      stdout=(logs / "worker.log").open("wb"), stderr=subprocess.STDOUT))
        wait_until(lambda: (logs / "ready").exists(), 120, "the worker")
        with session_factory(db_url)() as session:
            key = create_api_key(session, tenant="bench")
        client = Client(url, key, timeout=300)
        batch_file = logs / "batch.jsonl"
        batch_file.write_text("".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/summarize",
                                                  "body": {"input": t}}) + "\n" for i, t in enumerate(texts)))

        def run_batch(path: Path, *, under_load: bool) -> dict[str, Any]:
            t0 = time.perf_counter()
            batch = client.create_batch(client.upload(path)["id"])
            submit_s = time.perf_counter() - t0
            latencies: list[float] = []
            stop_file = logs / f"stop-{batch['id']}"
            if under_load:
                with session_factory(db_url)() as session:
                    ids = list(session.execute(select(Job.id).where(Job.batch_id == batch["id"])).scalars())
                (logs / "ids.txt").write_text("\n".join(ids))
                loader = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "loadgen.py"), "--url", url,
                                           "--key", key, "--ids", str(logs / "ids.txt"), "--rps", str(args.rps),
                                           "--seconds", "3600", "--stop-file", str(stop_file)],
                                          stdout=subprocess.PIPE)
            last = -1
            while (state := client.batch(batch["id"]))["status"] not in ("completed", "failed", "cancelled"):
                done = state["request_counts"]["completed"] + state["request_counts"]["failed"]
                if done // 1000 != last // 1000:
                    print(f"  {done}/{state['request_counts']['total']} done after {time.perf_counter() - t0:.0f}s",
                          flush=True)
                last = done
                time.sleep(0.5)
            e2e_s = time.perf_counter() - t0
            load_s = time.perf_counter() - t0
            stop_file.touch()
            if under_load:
                report = json.loads(loader.communicate()[0])
                latencies = report["latencies"]
                load_s = report["sent_s"]
                if report["error_count"]:
                    print(f"  {report['error_count']} GET errors, e.g. {report['errors'][:3]}")
            with session_factory(db_url)() as session:
                rows = session.execute(select(Job.output_tokens, Job.started_at, Job.finished_at, Job.status,
                                              Job.decoded_mode).where(Job.batch_id == batch["id"])).all()
            return {"submit_s": submit_s, "e2e_s": e2e_s, "rows": rows, "latencies": latencies, "load_s": load_s}

        batch_file = logs / "batch.jsonl"
        batch_file.write_text("".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/summarize",
                                                  "body": {"input": t}}) + "\n" for i, t in enumerate(texts)))
        print(f"phase 1: {args.jobs} jobs, no other load")
        phase1 = run_batch(batch_file, under_load=False)
        if not args.latency_jobs:
            phase2 = {"e2e_s": 0.0, "rows": [], "latencies": [], "load_s": 0.0}
        load_file = logs / "batch2.jsonl"
        load_file.write_text("".join(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/summarize",
                                                 "body": {"input": t}}) + "\n"
                                     for i, t in enumerate(texts[:args.latency_jobs])))
        if args.latency_jobs:
            print(f"phase 2: {args.latency_jobs} jobs under {args.rps} GET /v1/jobs/{{id}} per second")
            phase2 = run_batch(load_file, under_load=True)
    finally:
        stop_all(procs)
        scratch.drop()
        redis.Redis.from_url(args.redis).flushdb()
    # The bare decoder runs after the pipeline is down, so neither steals the other's cores.
    print(f"bare decoder on {args.bare_jobs} texts (after)")
    bare_after = bare_tokens_per_s(texts[:args.bare_jobs], **bare_kwargs)
    bare = {"before": bare_before, "after": bare_after,
            "tokens_per_s": (bare_before["tokens_per_s"] + bare_after["tokens_per_s"]) / 2}
    rows, e2e_s, submit_s = phase1["rows"], phase1["e2e_s"], phase1["submit_s"]
    tokens = sum(r.output_tokens or 0 for r in rows)
    pipeline_modes = dict(Counter(r.decoded_mode or "?" for r in rows))
    busy_s = (max(r.finished_at for r in rows) - min(r.started_at for r in rows)).total_seconds()
    latencies = phase2["latencies"]
    e2e_tps = tokens / e2e_s
    result = {
        "jobs": args.jobs, "succeeded": sum(r.status == "succeeded" for r in rows), "batch": args.batch,
        "threads": args.threads, "submit_s": submit_s, "e2e_s": e2e_s, "e2e_jobs_per_s": args.jobs / e2e_s,
        "tokens": tokens, "e2e_tokens_per_s": e2e_tps, "worker_busy_s": busy_s,
        "bare": bare, "efficiency": e2e_tps / bare["tokens_per_s"], "pipeline_modes": pipeline_modes,
        "get_job": {"rps_target": args.rps, "requests": len(latencies), "jobs": args.latency_jobs,
                    "batch_s": phase2["e2e_s"],
                    "batch_succeeded": sum(r.status == "succeeded" for r in phase2["rows"]),
                    "achieved_rps": len(latencies) / phase2["load_s"] if latencies else 0.0,
                    "p50_ms": 1000 * median(latencies) if latencies else None,
                    "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else None},
    }
    print()
    print(f"{'metric':<44} {'value':>12} {'target':>10}")
    for name, value, target in [
        ("jobs succeeded", f"{result['succeeded']}/{args.jobs}", ""),
        ("submit s (upload + create batch)", f"{submit_s:.2f}", "<= 5"),
        ("end-to-end s", f"{e2e_s:.1f}", ""),
        ("end-to-end jobs/s", f"{result['e2e_jobs_per_s']:.1f}", ""),
        ("end-to-end decoder tokens/s", f"{e2e_tps:.0f}", ""),
        (f"bare decoder tokens/s ({args.bare_jobs} texts), before", f"{bare_before['tokens_per_s']:.0f}", ""),
        (f"bare decoder tokens/s ({args.bare_jobs} texts), after", f"{bare_after['tokens_per_s']:.0f}", ""),
        ("modes: pipeline (decoded)", json.dumps(pipeline_modes), ""),
        ("modes: bare decoder (decoded, after)", json.dumps(bare_after["decoded_modes"]), ""),
        ("pipeline efficiency", efficiency_text(result), ">= 0.95"),
        (f"phase 2: {args.latency_jobs} jobs under GET load, s", f"{phase2['e2e_s']:.1f}", ""),
        (f"GET /v1/jobs/{{id}} p50 ms @ {args.rps}/s", f"{result['get_job']['p50_ms'] or 0:.1f}", ""),
        (f"GET /v1/jobs/{{id}} p99 ms @ {args.rps}/s", f"{result['get_job']['p99_ms'] or 0:.1f}", "<= 20"),
        ("GET achieved requests/s", f"{result['get_job']['achieved_rps']:.0f}", ""),
    ]:
        print(f"{name:<44} {value:>12} {target:>10}" if len(value) <= 12 else f"{name:<44} {value} {target}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")



if __name__ == "__main__":
    main()
