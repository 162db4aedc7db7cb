"""Hot swap under steady load: a new `legal` version is published while the workers run jobs.

Starts the API and a launcher with --procs worker processes for `legal` (a Postgres database of its
own on 127.0.0.1, a redis-server of its own unless --redis names a database to empty, local
storage), submits --jobs summaries, and once a tenth of them are done publishes a new `legal`
version (the checkpoint in --new) and runs one watchdog pass (validate, activate, swap the workers
one at a time). Prints: jobs succeeded / failed / lost, how many each version served,
every worker's pid before and after, and the time from publish to all workers serving it.

    python benchmarks/hotswap.py [--jobs 1200] [--procs 2] [--new checkpoints/base]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from procs import http_up, wait_until  # noqa: E402
from scratch_db import ScratchDatabase  # noqa: E402

from tests.scratch_redis import benchmark_redis  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=6000)
    p.add_argument("--procs", type=int, default=2, help="worker processes of the launcher (1 torch thread each)")
    p.add_argument("--new", default=None, help="checkpoint published as new legal (default: legal with a retrained "
                   "drafter, which validation passes: its `ar` outputs are legal's)")
    p.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--redis", default=None, help="a Redis database the run empties before and after "
                   "(default: a redis-server of the run's own on a free 127.0.0.1 port)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hotswap.json"))
    args = p.parse_args()
    with benchmark_redis(args.redis) as redis_url:
        run(args, redis_url)


def run(args: argparse.Namespace, redis_url: str) -> None:
    import httpx
    from sqlalchemy import select

    from yue2_jobs.auth import create_api_key
    from yue2_jobs.checkpoints import registry
    from yue2_jobs.checkpoints.watchdog import live_workers, run_pass
    from yue2_jobs.client import Client
    from yue2_jobs.core.config import Settings
    from yue2_jobs.db.models import Job
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.queue import make_celery
    from yue2_jobs.storage import storage_from_url
    from yue2_jobs.training.data import read_split

    scratch = ScratchDatabase.create(args.pg, "yue2_hotswap")
    db, db_url = scratch.name, scratch.url
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"yue2-{db}"
    home.mkdir(parents=True)
    if args.new is None:
        from tests.checkpoints.garbage import retrained_drafter

        new_dir = retrained_drafter(home / "legal-retrained", ROOT / "checkpoints" / "legal")
    else:
        new_dir = Path(args.new)
    env = {**os.environ, "YUE2_HOME": str(home), "YUE2_DATABASE_URL": db_url, "YUE2_BROKER_URL": redis_url,
           "YUE2_TORCH_THREADS": "1", "YUE2_DEFAULT_VARIANT": "legal", "YUE2_WORKER_READY_FILE": str(home / "ready")}
    os.environ.update({k: v for k, v in env.items() if k.startswith("YUE2_")})
    settings = Settings()
    procs = []
    try:
        port = 18000 + os.getpid() % 1000
        procs.append(subprocess.Popen([sys.executable, "-m", "yue2_jobs", "api", "--port", str(port)], cwd=ROOT,
                                      env=env, stdout=(home / "api.log").open("wb"), stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_up(httpx, url + "/healthz"), 60, "the API")
        procs.append(subprocess.Popen([sys.executable, "-m", "workers", "--variant", "legal", "--procs",
                                       str(args.procs)], cwd=ROOT, env=env, stdout=(home / "worker.log").open("wb"),
                                      stderr=subprocess.STDOUT))
        wait_until(lambda: (home / "ready").exists(), 180, "the workers")
        app = make_celery(settings)
        app.conf.broker_pool_limit = 8

        def reported() -> dict:  # each worker's own report (its row in worker_processes)
            with session_factory(db_url)() as session:
                return {w.name: {"checkpoint": w.checkpoint, "pid": w.pid} for w in live_workers(session, "legal")}

        before = wait_until(lambda: (v := reported()) and len(v) == args.procs and v, 60, "the workers' reports")
        with session_factory(db_url)() as session:
            key = create_api_key(session, tenant="bench")
        client = Client(url, key, timeout=300)
        rows = read_split(ROOT / "data", "legal", "eval") + read_split(ROOT / "data", "general", "eval")
        texts = [rows[i % len(rows)]["text"] for i in range(args.jobs)]
        batch_file = home / "batch.jsonl"
        batch_file.write_text("".join(json.dumps({"custom_id": f"j{i}", "method": "POST", "url": "/v1/summarize",
                                                  "body": {"input": t, "variant": "legal"}}) + "\n"
                                      for i, t in enumerate(texts)))
        t0 = time.monotonic()
        batch = client.create_batch(client.upload(batch_file)["id"])["id"]
        wait_until(lambda: client.batch(batch)["request_counts"]["completed"] >= args.jobs // 10, 600, "a tenth")
        store = storage_from_url(settings.resolved_checkpoint_store_url)
        sessions = session_factory(db_url)
        t_pub = time.monotonic()
        with sessions() as session:
            new = registry.publish(session, store=store, store_url=settings.resolved_checkpoint_store_url,
                                   directory=new_dir, variant="legal")
        did = run_pass(settings, sessions, store, app)
        swap_s = time.monotonic() - t_pub
        done_at_swap = client.batch(batch)["request_counts"]["completed"]
        state = wait_until(lambda: (s := client.batch(batch))["status"] == "completed" and s, 1800, "the batch")
        wall = time.monotonic() - t0
        after = wait_until(lambda: (v := reported()) and len(v) == args.procs and v, 60, "the workers' reports")
        with session_factory(db_url)() as session:
            jobs = session.execute(select(Job.status, Job.checkpoint, Job.attempts, Job.worker, Job.finished_at)
                                   .where(Job.batch_id == batch)).all()
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(120)
        scratch.drop()
    by_status = Counter(j.status for j in jobs)
    # On each worker, every job the old version decoded finished before the first the new one decoded.
    new_ck = f"legal@{new.version}"
    clean_cut = {}
    for w in sorted({j.worker for j in jobs}):
        olds = [j.finished_at for j in jobs if j.worker == w and j.checkpoint != new_ck]
        news = [j.finished_at for j in jobs if j.worker == w and j.checkpoint == new_ck]
        clean_cut[w] = {"old": len(olds), "new": len(news), "ordered": not olds or not news or max(olds) <= min(news)}
    by_ckpt = Counter(j.checkpoint for j in jobs)
    lost = args.jobs - len(jobs) + sum(n for s, n in by_status.items() if s not in ("succeeded", "failed"))
    result = {
        "jobs": args.jobs, "succeeded": by_status.get("succeeded", 0), "failed": by_status.get("failed", 0),
        "lost": lost, "max_attempts": max(j.attempts for j in jobs), "served_by": dict(by_ckpt),
        "new_version": new_ck, "per_worker": clean_cut, "publish_to_all_serving_s": swap_s,
        "completed_when_swapped": done_at_swap, "wall_s": wall, "watchdog": did, "request_counts": state[
            "request_counts"],
        "workers": {n: {"before": before[n]["checkpoint"], "after": after[n]["checkpoint"],
                        "pid_before": before[n]["pid"], "pid_after": after[n]["pid"]} for n in sorted(before)},
    }
    print(f"{args.jobs} legal jobs, {args.procs} workers: {result['succeeded']} succeeded, {result['failed']} failed, "
          f"{lost} lost, max attempts {result['max_attempts']}")
    for ckpt, n in sorted(by_ckpt.items()):
        print(f"  {n:>5} jobs served by {ckpt}")
    for n, w in result["workers"].items():
        print(f"  {n}: {w['before']} -> {w['after']}, pid {w['pid_before']} -> {w['pid_after']}")
    for w, c in clean_cut.items():
        print(f"  {w}: {c['old']} jobs on the old version, then {c['new']} on the new; "
              f"{'all old before all new' if c['ordered'] else 'OLD AND NEW INTERLEAVED'}")
    steps = did.get("legal", {})
    print(f"publish -> all {args.procs} workers serving {result['new_version']}: {swap_s:.1f}s "
          f"(validation {steps.get('validate_s', float('nan')):.1f}s, swapping {args.procs} workers one at a time "
          f"{steps.get('converge_s', float('nan')):.1f}s; {done_at_swap} jobs done by then; whole batch {wall:.0f}s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")



if __name__ == "__main__":
    main()
