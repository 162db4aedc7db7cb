"""The overnight batch at OpenAI's file limit: a 200 MB, 50,000-line JSONL file through upload,
batch creation, 50,000 jobs and finalization, on the real stack (API and worker processes,
Postgres, Redis, a moto S3 server), measuring seconds and peak memory.

Memory is each process's own peak RSS from /proc (`VmHWM`, reset through `/proc/PID/clear_refs`
before each step, so a figure is that step's peak over the RSS before it):
- the API process across the upload, across the batch creation, and across reading the output
  file back (GET /v1/files/{id}/content);
- a finalization alone, redone in a fresh process (the worker finalizes the batch after its last
  job; this repeats it where it can be measured on its own), and the worker across the whole run.

The jobs run on `tests.pipeline.echo_runner` (no model): this measures what the pipeline carries
(files, rows, messages, outputs), not decoding, which `make bench` and `benchmarks/pipeline.py`
measure. Needs Postgres on 127.0.0.1 (it makes and drops a database of its own), redis-server
(it starts its own; `--redis` names a database to empty instead), and root for `clear_refs`
(without it a figure is the process's peak since it started).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from procs import http_up, stop_all, wait_until  # noqa: E402
from scratch_db import ScratchDatabase  # noqa: E402

from tests.scratch_redis import benchmark_redis  # noqa: E402
from yue2_jobs.core.net import free_port  # noqa: E402

MB = 1_000_000  # file sizes, decimal as OpenAI's "200 MB" (YUE2_MAX_FILE_BYTES is 200 MiB: it fits)
MIB = 1024 * 1024  # memory


def rss_mb(pid: int) -> dict[str, float]:
    """A process's resident set now and its peak, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    values = {ln.split(":")[0]: int(ln.split()[1]) for ln in status.splitlines()  # kB
              if ln.startswith(("VmRSS", "VmHWM"))}
    return {"rss": values["VmRSS"] * 1024 / MIB, "peak": values["VmHWM"] * 1024 / MIB}


def reset_peak(pid: int) -> float:
    """Make the process's peak its current RSS (clear_refs 5); returns that RSS in MiB."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass  # not root: the peak is since the process started
    return rss_mb(pid)["rss"]


def write_file(path: Path, *, lines: int, total_mb: float) -> int:
    """`lines` summarize requests of long inputs (eval texts, repeated) adding up to `total_mb`."""
    from yue2_jobs.training.data import read_split

    pool = " ".join(r["text"] for c in ("general", "legal") for r in read_split(ROOT / "data", c, "eval"))
    budget = int(total_mb * MB / lines)  # bytes per line
    with path.open("wb") as f:
        for i in range(lines):
            start = (i * 7919) % (len(pool) - budget)
            text = pool[start:start + budget]
            line = b""
            while not line or len(line) > budget:  # multi-byte characters and escapes: trim to the budget
                line = json.dumps({"custom_id": f"big-{i}", "method": "POST", "url": "/v1/summarize",
                                   "body": {"input": text}}, ensure_ascii=False).encode() + b"\n"
                text = text[:len(text) - max(1, (len(line) - budget) // 2)]
            f.write(line)
    return path.stat().st_size


def finalize_alone(db_url: str, storage_url: str, endpoint: str, batch_id: str) -> dict[str, float]:
    """Redo the batch's finalization in this fresh process; its seconds and peak RSS growth."""
    from sqlalchemy import update

    from yue2_jobs.db.models import Batch, BatchStatus
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.jobs.batches import try_finalize
    from yue2_jobs.storage import storage_from_url

    storage = storage_from_url(storage_url, endpoint_url=endpoint)
    with session_factory(db_url)() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(status=BatchStatus.FINALIZING,
                                                                          finalizing_at=None))
        session.commit()
        before = reset_peak(os.getpid())
        t0 = time.perf_counter()
        assert try_finalize(session, batch_id=batch_id, storage=storage)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "rss_before_mb": before, "peak_growth_mb": rss_mb(os.getpid())["peak"] - before}


@dataclass
class Stack:
    """moto, the API and one worker (an echo runner), on a scratch database and a Redis database."""

    env: dict[str, str]
    url: str
    endpoint: str
    api_pid: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


def start_stack(*, db_url: str, redis_url: str, logs: Path) -> Stack:
    import boto3
    import httpx

    s3_port, api_port = free_port(), free_port()
    endpoint, url = f"http://127.0.0.1:{s3_port}", f"http://127.0.0.1:{api_port}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "YUE2_HOME": str(logs),
           "YUE2_DATABASE_URL": db_url, "YUE2_BROKER_URL": redis_url,
           "YUE2_STORAGE_URL": "s3://yue2-bigbatch/out", "YUE2_S3_ENDPOINT_URL": endpoint,
           "YUE2_RUNNER": "tests.pipeline.echo_runner:factory", "YUE2_TEST_JOB_MS": "0",
           "YUE2_WORKER_READY_FILE": str(logs / "ready"), "YUE2_TORCH_THREADS": "1"}
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    procs = [subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    stack = Stack(env=env, url=url, endpoint=endpoint, api_pid=0, procs=procs)
    try:
        wait_until(lambda: http_up(httpx, endpoint), 30, "moto")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="yue2-bigbatch")
        api = subprocess.Popen([sys.executable, "-m", "yue2_jobs", "api", "--port", str(api_port)], cwd=ROOT,
                               env=env, stdout=(logs / "api.log").open("wb"), stderr=subprocess.STDOUT)
        procs.append(api)
        stack.api_pid = api.pid
        wait_until(lambda: http_up(httpx, url + "/healthz"), 60, "the API")
        procs.append(subprocess.Popen([sys.executable, "-m", "workers"], cwd=ROOT, env=env,
                                      stdout=(logs / "worker.log").open("wb"), stderr=subprocess.STDOUT))
        wait_until(lambda: (logs / "ready").exists(), 120, "the worker")
    except BaseException:
        stop_all(procs)
        raise
    return stack


def measure_steps(stack: Stack, *, db_url: str, in_file: Path, logs: Path) -> dict[str, Any]:
    """Upload, create, run, download and a finalization alone; each step's seconds and peaks."""
    import httpx
    from sqlalchemy import func, select

    from yue2_jobs.auth import create_api_key
    from yue2_jobs.client import Client
    from yue2_jobs.db.models import Batch, Job, WorkerProcess
    from yue2_jobs.db.session import session_factory

    sessions = session_factory(db_url)
    with sessions() as session:
        key = create_api_key(session, tenant="bench")
        worker_pid = session.execute(select(WorkerProcess.pid)).scalar_one()
    client = Client(stack.url, key, timeout=600)
    result: dict[str, Any] = {}

    def step(name: str, action: Any) -> Any:
        before = reset_peak(stack.api_pid)
        t0 = time.perf_counter()
        out = action()
        result[name] = {"seconds": time.perf_counter() - t0, "api_rss_before_mb": before,
                        "api_peak_growth_mb": rss_mb(stack.api_pid)["peak"] - before}
        print(f"{name}: {result[name]['seconds']:.1f}s, API peak +{result[name]['api_peak_growth_mb']:.0f} MiB")
        return out

    worker_before = reset_peak(worker_pid)
    file_id = step("upload", lambda: client.upload(in_file)["id"])
    batch = step("create", lambda: client.create_batch(file_id))
    t_run = time.perf_counter()
    wait_until(lambda: client.batch(batch["id"])["status"] in ("completed", "failed", "cancelled"), 3600,
               "the batch", interval=1.0)
    state = client.batch(batch["id"])
    with sessions() as session:
        last_job = session.execute(select(func.max(Job.finished_at)).where(Job.batch_id == batch["id"])).scalar()
        done_at = session.execute(select(Batch.completed_at).where(Batch.id == batch["id"])).scalar()
    result["run"] = {"seconds": time.perf_counter() - t_run, "request_counts": state["request_counts"],
                     "worker_rss_before_mb": worker_before,
                     "worker_peak_growth_mb": rss_mb(worker_pid)["peak"] - worker_before,
                     "last_job_to_completed_s": (done_at - last_job).total_seconds()}
    print(f"run: {result['run']}")
    out_path = logs / "out.jsonl"

    def download() -> int:
        with httpx.stream("GET", f"{stack.url}/v1/files/{state['output_file_id']}/content",
                          headers={"Authorization": f"Bearer {key}"}, timeout=600) as r, out_path.open("wb") as f:
            for chunk in r.iter_bytes():
                f.write(chunk)
        return sum(1 for _ in out_path.open("rb"))

    result["download_lines"] = step("download", download)
    finalize = subprocess.run([sys.executable, __file__, "--finalize-only", db_url, "s3://yue2-bigbatch/out",
                               stack.endpoint, batch["id"]], cwd=ROOT, env=stack.env, capture_output=True, text=True)
    if finalize.returncode != 0:
        raise SystemExit(f"the finalization alone failed:\n{finalize.stderr[-3000:]}")
    result["finalize_alone"] = json.loads(finalize.stdout.splitlines()[-1])
    return result


def print_table(result: dict[str, Any]) -> None:
    rows = [
        ("file", f"{result['lines']} lines, {result['file_mb']:.0f} MB", ""),
        ("upload s", f"{result['upload']['seconds']:.1f}", ""),
        ("upload: API peak RSS growth MiB", f"{result['upload']['api_peak_growth_mb']:.0f}", "<= 64"),
        ("create s", f"{result['create']['seconds']:.1f}", "<= 10"),
        ("create: API peak RSS growth MiB", f"{result['create']['api_peak_growth_mb']:.0f}", "<= 64"),
        ("jobs completed", f"{result['run']['request_counts']['completed']}/{result['lines']}", ""),
        ("run s (echo runner)", f"{result['run']['seconds']:.0f}", ""),
        ("last job -> batch completed s", f"{result['run']['last_job_to_completed_s']:.1f}", ""),
        ("finalize alone s", f"{result['finalize_alone']['seconds']:.1f}", ""),
        ("finalize alone: peak RSS growth MiB", f"{result['finalize_alone']['peak_growth_mb']:.0f}", "<= 128"),
        ("worker, whole run: peak RSS growth MiB", f"{result['run']['worker_peak_growth_mb']:.0f}", ""),
        ("download output: API peak RSS growth MiB", f"{result['download']['api_peak_growth_mb']:.0f}", ""),
    ]
    print()
    print(f"{'metric':<44} {'value':>22} {'target':>8}")
    for name, value, target in rows:
        print(f"{name:<44} {value:>22} {target:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--mb", type=float, default=200.0, help="size of the input file")
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default=None, help="a Redis database the run empties before and after "
                        "(default: a redis-server of the run's own on a free 127.0.0.1 port)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bigbatch.json"))
    parser.add_argument("--finalize-only", nargs=4, metavar=("DB_URL", "STORAGE_URL", "ENDPOINT", "BATCH_ID"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.finalize_only:
        print(json.dumps(finalize_alone(*args.finalize_only)))
        return
    with benchmark_redis(args.redis) as redis_url:
        run(args, redis_url)


def run(args: argparse.Namespace, redis_url: str) -> None:
    scratch = ScratchDatabase.create(args.pg, "yue2_bigbatch")
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"yue2-bigbatch-{scratch.name}"
    logs.mkdir(parents=True, exist_ok=True)
    in_file = logs / "in.jsonl"
    size = write_file(in_file, lines=args.lines, total_mb=args.mb)
    print(f"{in_file}: {args.lines} lines, {size / MB:.0f} MB")
    stack: Stack | None = None
    try:
        stack = start_stack(db_url=scratch.url, redis_url=redis_url, logs=logs)
        result = {"lines": args.lines, "file_mb": size / MB,
                  **measure_steps(stack, db_url=scratch.url, in_file=in_file, logs=logs)}
    finally:
        if stack is not None:
            stop_all(stack.procs)
        scratch.drop()
    print_table(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
