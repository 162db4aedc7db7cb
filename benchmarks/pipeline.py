"""Pipeline benchmark: N summary jobs through API -> Redis -> worker -> Postgres + S3 (a moto server).

Measures, in one run:
- submit time: upload of the JSONL file plus POST /v1/batches (the jobs are in Postgres then);
- end-to-end jobs/s and decoder tokens/s, from the start of the submit to the batch's `completed_at`;
- the bare decoder's tokens/s on the same texts: what a worker runs (its runner, the continuous
  engine, the jobs' default mode with a fresh chooser, groups of --batch, the same torch threads,
  the same CPUs and nice value) in a process of its own without the pipeline, once before the
  pipeline starts and once after it stops (this VM's speed drifts by tens of percent over
  minutes); pipeline efficiency = end-to-end tokens/s / their mean, printed with the modes both
  decoded; a figure above 1.05 is flagged, not reported as efficiency;
- the worker's time outside the engine loop, from its log (`workers/tasks.py` logs each
  micro-batch's seconds and the seconds of them decoding): (total - decoding) / total over all
  micro-batches and per micro-batch, and the efficiency split into the factors that multiply to
  it: the worker's busy share of the end-to-end time, the engine loop's share of that, and the
  loop's tokens/s against the bare decoder's;
- the CPU seconds each process used while the jobs ran (the worker, its upload helpers, the API,
  moto, Postgres, Redis) and each of the worker's threads, and how much of the worker's CPU other
  processes took (the machine may be shared); with --profile, where the worker's threads spend
  their time (py-spy, when it is installed);
- GET /v1/jobs/{id} latency p50/p99 under an open-loop load of --rps requests/s while a second
  batch (--latency-jobs) runs. It is a separate phase: on a 2-core machine the load generator and
  the API would otherwise take the worker's cores and the efficiency figure would measure that.

Placement (--placement): `pinned` (the default) measures the pipeline's cost apart from contention:
the worker (its launcher, the worker process and its upload helpers) and the bare decoder run on
one core (--worker-cpus, default the last usable CPU) at the same nice value; the API, moto, the
load generator, this script, and the already-running Postgres and Redis (moved with
sched_setaffinity for the run and put back where they were when it ends) run on the others.
`shared` is the old footing: every process on every core, the worker at nice 10. On a machine
that others use too, their processes still run on the worker's core: the table gives how long
the decoding thread and the bare decoder waited for it (run-queue wait), and a negative
--worker-nice (root) ranks both above other sessions' processes (each starts a session of its own,
so that with the kernel's autogroups on, the nice value counts across sessions).
Needs Postgres on 127.0.0.1 (pinned: on this host, run by a user this script may move; the run makes
and drops a database of its own) and redis-server (a Redis server of the run's own; --redis names a
database to empty instead).

    python benchmarks/pipeline.py --jobs 10000            # pinned (2 cores: worker on 1, the rest on 0)
    python benchmarks/pipeline.py --placement shared      # the issue-30 footing
    python benchmarks/pipeline.py --jobs 1000 --bare-jobs 1000 --latency-jobs 0 --profile
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from procs import (  # noqa: E402
    ServicePinning,
    children,
    core_times,
    cpus_text,
    descendants,
    http_up,
    listener_pid,
    parse_cpus,
    run_queue_wait,
    set_priority,
    stop_all,
    taskset,
    wait_until,
)
from scratch_db import ScratchDatabase  # noqa: E402
from worker_cost import (  # noqa: E402
    MICRO_BATCH,
    PROFILE_HZ,
    CpuLedger,
    profile_summary,
    py_spy,
    thread_names,
    worker_log_figures,
)

from tests.scratch_redis import benchmark_redis  # noqa: E402
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
    uploads and the broker, which is what efficiency measures. Also says how busy its CPUs were
    with other processes meanwhile."""
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
    cpus = sorted(os.sched_getaffinity(0))
    wait0, busy0, cpu0, t0 = run_queue_wait(os.getpid()), core_times(cpus)[0], time.process_time(), time.perf_counter()
    for start in range(0, len(jobs), delivery):
        out = _drain(runner, jobs[start:start + delivery], batch)
        tokens += sum(o.output_tokens for o in out)
        modes.update(o.mode or "?" for o in out)
    dt = time.perf_counter() - t0
    own, busy, wait = time.process_time() - cpu0, core_times(cpus)[0] - busy0, run_queue_wait(os.getpid()) - wait0
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt, "jobs_per_s": len(jobs) / dt,
            "mode": jobs[0].decoding_params.mode, "decoded_modes": dict(modes), "batching": settings.batching,
            "delivery_jobs": delivery, "cpus": cpus_text(cpus), "nice": os.nice(0), "cpu_s": own,
            "run_queue_wait": wait / dt, "other_load": max(0.0, busy - own) / (dt * len(cpus))}


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


@dataclass
class Placement:
    """Where each process runs: `worker` (the worker and the bare decoder) and `services` (the
    rest), both None on the shared footing."""

    mode: str
    worker: list[int] | None
    services: list[int] | None
    nice: int

    @classmethod
    def of(cls, args: argparse.Namespace) -> Placement:
        usable = sorted(os.sched_getaffinity(0))
        nice = args.worker_nice if args.worker_nice is not None else (0 if args.placement == "pinned" else 10)
        if args.placement == "shared":
            return cls("shared", None, None, nice)
        worker = parse_cpus(args.worker_cpus) if args.worker_cpus else usable[-1:]
        services = parse_cpus(args.service_cpus) if args.service_cpus else [c for c in usable if c not in worker]
        if not services or set(worker) & set(services) or not set(worker + services) <= set(usable):
            raise SystemExit(f"bench: pinned placement needs disjoint worker CPUs ({cpus_text(worker)}) and service "
                             f"CPUs ({cpus_text(services)}) among the usable ones ({cpus_text(usable)}); "
                             f"or --placement shared")
        if args.threads > len(worker):
            print(f"warning: {args.threads} torch threads on {len(worker)} worker CPU(s)")
        return cls("pinned", worker, services, nice)

    @property
    def pinned(self) -> bool:
        return self.worker is not None

    def describe(self) -> str:
        if self.worker is None:
            return (f"shared: every process on CPUs {cpus_text(os.sched_getaffinity(0))}, worker and bare decoder "
                    f"at nice {self.nice}")
        return (f"pinned: worker + bare decoder on CPU {cpus_text(self.worker)} (nice {self.nice}); API, moto, "
                f"load generator, Postgres, Redis, this script on CPU {cpus_text(self.services or [])}")


def local_port(url: str, default: int) -> int | None:
    """The port of a service URL on this host (None: on another host, so not ours to move)."""
    parsed = urlparse(url.replace("postgresql+psycopg", "postgresql"))
    return (parsed.port or default) if parsed.hostname in ("127.0.0.1", "localhost", "::1") else None


def service_pinning(args: argparse.Namespace, place: Placement) -> Any:
    """Postgres and Redis moved to the service CPUs for the run (a no-op when shared)."""
    if place.services is None:
        return contextlib.nullcontext()
    roots = {}
    for name, url, default in (("postgres", args.pg, 5432), ("redis", args.redis, 6379)):
        port = local_port(url, default)
        pid = listener_pid(port) if port else None
        if pid is None:
            print(f"warning: {name} ({url}) has no listening process on this host: not moved")
        else:
            roots[name] = pid
    return ServicePinning(roots, place.services)


def run_bare(args: argparse.Namespace, place: Placement, texts_n: int) -> dict[str, Any]:
    """`bare_tokens_per_s` in a process of its own, on the worker's CPUs at the worker's nice value."""
    cmd = [*taskset(place.worker), "nice", "-n", str(place.nice), sys.executable, __file__, "--bare-only",
           "--bare-jobs", str(texts_n), "--batch", str(args.batch), "--threads", str(args.threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}  # as the launcher sets for its children
    bare = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, start_new_session=place.pinned)
    prioritize(bare.pid, place)
    out = bare.communicate()[0].decode()
    if bare.returncode:
        raise SystemExit(f"bench: the bare decoder exited with {bare.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def prioritize(pid: int, place: Placement) -> None:
    """Pinned: the nice value for `pid` (in a session of its own) against other sessions' processes
    too. Shared: the worker stays in this script's session, where its nice value ranks it below the
    API's GETs, as before."""
    if place.pinned and place.nice and (why := set_priority(pid, place.nice)):
        print(f"warning: {why}")


def efficiency_text(result: dict[str, Any]) -> str:
    """The efficiency, or why it is not one: above 1.05 the baseline is not what the worker ran, or
    the machine's speed moved between the runs (the bare runs before and after say by how much)."""
    eff, bare = result["efficiency"], result["bare"]
    if eff <= 1.05:
        return f"{eff:.3f}"
    drift = abs(bare["before"]["tokens_per_s"] - bare["after"]["tokens_per_s"]) / bare["tokens_per_s"]
    return f"{eff:.3f}?! (>1.05: the bare runs differ by {100 * drift:.0f}%; rerun)"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--bare-jobs", type=int, default=10_000, help="texts the bare decoder runs (a prefix; "
                        "the same as --jobs by default, so the chooser learns over as many jobs)")
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size (YUE2_BATCH_MAX_JOBS)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the worker and the bare run")
    parser.add_argument("--rps", type=int, default=200, help="GET /v1/jobs/{id} requests per second")
    parser.add_argument("--placement", choices=("pinned", "shared"), default="pinned",
                        help="pinned: worker and bare decoder on --worker-cpus, everything else on --service-cpus; "
                        "shared: every process on every core (the issue-30 footing)")
    parser.add_argument("--worker-cpus", default=None, help="pinned: CPUs of the worker and the bare decoder "
                        "(default: the last usable CPU)")
    parser.add_argument("--service-cpus", default=None, help="pinned: CPUs of everything else (default: the rest)")
    parser.add_argument("--worker-nice", type=int, default=None, help="nice value of the worker process and the "
                        "bare decoder (default: 0 pinned, 10 shared, as a batch worker beside an API)")
    parser.add_argument("--uploads-on", choices=("worker", "services"), default="worker",
                        help="pinned: where the worker's S3 upload helpers run: its own core (the strict footing) "
                        "or the services' (YUE2_UPLOAD_CPUS)")
    parser.add_argument("--profile", action="store_true", help="sample the worker's threads with py-spy while the "
                        "jobs run (py-spy must be installed; it runs on the service CPUs)")
    parser.add_argument("--latency-jobs", type=int, default=2_000, help="jobs of the batch that runs under GET load")
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default=None, help="a Redis database the run empties before and after "
                        "(default: a redis-server of the run's own on a free 127.0.0.1 port)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pipeline.json"))
    parser.add_argument("--bare-only", action="store_true", help=argparse.SUPPRESS)  # run_bare's child
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.bare_only:
        print(json.dumps(bare_tokens_per_s(texts_for(args.bare_jobs), variant_dir=ROOT / "checkpoints" / "base",
                                           batch=args.batch, threads=args.threads)))
        return
    place = Placement.of(args)
    if place.services is not None:
        os.sched_setaffinity(0, place.services)  # this script, and what it starts without taskset
    # A SIGTERM unwinds (the `finally`s stop the processes and put Postgres and Redis back).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"placement {place.describe()}")
    # From here on args.redis is the database the run empties: the one --redis named, or ours.
    with benchmark_redis(args.redis) as args.redis, service_pinning(args, place) as moved:
        if isinstance(moved, ServicePinning):
            for name, pid in moved.roots.items():
                print(f"  moved {name} (pid {pid}, {moved.counts()[name]} processes) from CPUs {moved.before[name]} "
                      f"to {cpus_text(place.services or [])} until this run ends")
        print(f"bare decoder on {args.bare_jobs} texts (before)")
        bare_before = run_bare(args, place, args.bare_jobs)
        run = run_pipeline(args, place, moved)
        # The bare decoder runs after the pipeline is down, so neither steals the other's cores.
        print(f"bare decoder on {args.bare_jobs} texts (after)")
        bare_after = run_bare(args, place, args.bare_jobs)
    report(args, place, run, bare_before, bare_after)


def run_pipeline(args: argparse.Namespace, place: Placement, moved: Any) -> dict[str, Any]:
    import boto3
    import httpx
    from sqlalchemy import select

    from yue2_jobs.auth import create_api_key
    from yue2_jobs.client import Client
    from yue2_jobs.db.models import Batch, Job
    from yue2_jobs.db.session import session_factory

    texts = texts_for(args.jobs)
    scratch = ScratchDatabase.create(args.pg, "yue2_bench")
    db, db_url = scratch.name, scratch.url
    procs: list[subprocess.Popen[bytes]] = []
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"yue2-bench-{db}"
    logs.mkdir(parents=True, exist_ok=True)
    worker_log = logs / "worker.log"
    try:
        s3_port, api_port = free_port(), free_port()
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "YUE2_HOME": str(logs), "YUE2_DATABASE_URL": db_url, "YUE2_BROKER_URL": args.redis,
               "YUE2_STORAGE_URL": "s3://yue2-bench/out", "YUE2_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
               "YUE2_BATCH_MAX_JOBS": str(args.batch), "YUE2_TORCH_THREADS": str(args.threads),
               "YUE2_WORKER_READY_FILE": str(logs / "ready")}
        if args.uploads_on == "services" and place.services is not None:  # YUE2_UPLOAD_CPUS: off the decode core
            env["YUE2_UPLOAD_CPUS"] = json.dumps(place.services)
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        on_services = taskset(place.services)
        moto = subprocess.Popen([*on_services, sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                 str(s3_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(moto)
        endpoint = f"http://127.0.0.1:{s3_port}"
        wait_until(lambda: http_up(httpx, endpoint), 30, "moto")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="yue2-bench")
        api = subprocess.Popen([*on_services, sys.executable, "-m", "yue2_jobs", "api", "--port", str(api_port)],
                               cwd=ROOT, env=env, stdout=(logs / "api.log").open("wb"), stderr=subprocess.STDOUT)
        procs.append(api)
        url = f"http://127.0.0.1:{api_port}"
        wait_until(lambda: http_up(httpx, url + "/healthz"), 60, "the API")
        # Pinned: the launcher's usable CPUs are the worker's, so it places its one child there
        # (`workers/launcher.py`); the child's upload helpers inherit them (unless --uploads-on
        # services). Shared: the worker runs at nice 10, as a batch worker placed beside an API
        # should, so that interactive GETs are not queued behind decoding.
        # --host: a node name of its own, beside any other worker on this host.
        launcher = subprocess.Popen([*taskset(place.worker), "nice", "-n", str(place.nice), sys.executable, "-m",
                                     "workers", "--host", db], cwd=ROOT, env=env, stdout=worker_log.open("wb"),
                                    stderr=subprocess.STDOUT, start_new_session=place.pinned)
        procs.append(launcher)
        prioritize(launcher.pid, place)  # the worker and its helpers are in its session
        wait_until(lambda: (logs / "ready").exists(), 300, "the worker")
        worker = wait_until(lambda: children(launcher.pid), 10, "the worker process")[0]
        placement = {"mode": place.mode, "uploads_on": args.uploads_on,
                     "worker_process": cpus_text(os.sched_getaffinity(worker)),
                     "api": cpus_text(os.sched_getaffinity(api.pid)), "moto": cpus_text(os.sched_getaffinity(moto.pid)),
                     "this_script": cpus_text(os.sched_getaffinity(0)), "nice": place.nice}
        roots = moved.roots if isinstance(moved, ServicePinning) else {}
        placement.update({name: cpus_text(os.sched_getaffinity(pid)) for name, pid in roots.items()})
        print(f"  worker process {worker} on CPUs {placement['worker_process']}; API on {placement['api']}, "
              f"moto on {placement['moto']}" + "".join(f", {n} on {placement[n]}" for n in roots))
        with session_factory(db_url)() as session:
            key = create_api_key(session, tenant="bench")
        client = Client(url, key, timeout=300)

        def run_batch(path: Path, *, under_load: bool) -> dict[str, Any]:
            t0, t0_wall = time.perf_counter(), time.time()
            batch = client.create_batch(client.upload(path)["id"])
            submit_s = time.perf_counter() - t0
            latencies: list[float] = []
            stop_file = logs / f"stop-{batch['id']}"
            if under_load:
                with session_factory(db_url)() as session:
                    ids = list(session.execute(select(Job.id).where(Job.batch_id == batch["id"])).scalars())
                (logs / "ids.txt").write_text("\n".join(ids))
                loader = subprocess.Popen([*on_services, sys.executable, str(ROOT / "benchmarks" / "loadgen.py"),
                                           "--url", url, "--key", key, "--ids", str(logs / "ids.txt"), "--rps",
                                           str(args.rps), "--seconds", "3600", "--stop-file", str(stop_file)],
                                          stdout=subprocess.PIPE)
            last = -1
            while (state := client.batch(batch["id"]))["status"] not in ("completed", "failed", "cancelled"):
                done = state["request_counts"]["completed"] + state["request_counts"]["failed"]
                if done // 1000 != last // 1000:
                    print(f"  {done}/{state['request_counts']['total']} done after {time.perf_counter() - t0:.0f}s",
                          flush=True)
                last = done
                time.sleep(0.2)
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
                done_at = session.execute(select(Batch.completed_at).where(Batch.id == batch["id"])).scalar()
            # The batch's own completion time, not the next poll's.
            end_wall = done_at.timestamp() if done_at is not None else t0_wall + time.perf_counter() - t0
            return {"submit_s": submit_s, "e2e_s": end_wall - t0_wall, "rows": rows, "latencies": latencies,
                    "load_s": load_s, "t0_wall": t0_wall, "end_wall": end_wall}

        batch_file = logs / "batch.jsonl"
        batch_file.write_text("".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/summarize",
                                                  "body": {"input": t}}) + "\n" for i, t in enumerate(texts)))
        pg_pid, redis_pid = roots.get("postgres"), roots.get("redis")
        groups = {"worker process": lambda: [worker], "worker upload helpers": lambda: descendants(worker),
                  "launcher": lambda: [launcher.pid], "API": lambda: [api.pid, *descendants(api.pid)],
                  "moto": lambda: [moto.pid], "this script": lambda: [os.getpid()]}
        if pg_pid:
            groups["postgres (all databases)"] = lambda: [pg_pid, *descendants(pg_pid)]
        if redis_pid:
            groups["redis (all databases)"] = lambda: [redis_pid]
        ledger = CpuLedger(groups, worker, place.worker, ("worker process", "worker upload helpers", "launcher"))
        spy, profile_raw = py_spy() if args.profile else None, logs / "worker-profile.txt"
        if args.profile and spy is None:
            print("warning: --profile needs py-spy (pip install py-spy): not profiling")
        print(f"phase 1: {args.jobs} jobs, no other load")
        log_from = worker_log.stat().st_size
        ledger.start()
        # Blocking samples (the worker stops for each): --nonblocking ones of a thread that is running
        # come out torn and are dropped, so they under-count decoding.
        sampler = subprocess.Popen([*on_services, spy, "record", "--pid", str(worker), "--threads", "--idle",
                                    "--rate", str(PROFILE_HZ), "--format", "raw", "--output", str(profile_raw)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if spy else None
        phase1 = run_batch(batch_file, under_load=False)

        def logged_jobs() -> int:
            text = worker_log.read_bytes()[log_from:].decode(errors="replace")
            return sum(int(m["jobs"]) for m in map(MICRO_BATCH.search, text.splitlines()) if m)

        # The batch completes when its last results are recorded; the micro-batch logs just after.
        try:
            wait_until(lambda: logged_jobs() >= args.jobs, 30, "the worker's last micro-batch line")
        except SystemExit as exc:
            print(f"warning: {exc}; its figures cover {logged_jobs()} of {args.jobs} jobs")
        cpu = ledger.stop(thread_names(worker))
        # The upload helpers start with the first uploads (spawned, so their start counts above).
        placement["worker_helpers"] = sorted({cpus_text(os.sched_getaffinity(p)) for p in descendants(worker)})
        print(f"  the worker's {len(descendants(worker))} helper processes on CPUs {placement['worker_helpers']}")
        phase1["log"] = worker_log.read_bytes()[log_from:].decode(errors="replace")
        phase1["cpu"], phase1["placement"], phase1["profile"] = cpu, placement, None
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)
            sampler.wait(60)
            if profile_raw.exists():
                phase1["profile"] = profile_summary(profile_raw.read_text(), rate=PROFILE_HZ)
                print(f"  worker profile (py-spy raw samples): {profile_raw}")
        if args.latency_jobs:
            load_file = logs / "batch2.jsonl"
            load_file.write_text("".join(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/summarize",
                                                     "body": {"input": t}}) + "\n"
                                         for i, t in enumerate(texts[:args.latency_jobs])))
            print(f"phase 2: {args.latency_jobs} jobs under {args.rps} GET /v1/jobs/{{id}} per second")
            phase2 = run_batch(load_file, under_load=True)
        else:
            phase2 = {"e2e_s": 0.0, "rows": [], "latencies": [], "load_s": 0.0}
        print(f"  logs: {logs}")
    finally:
        stop_all(procs)
        scratch.drop()
    return {"phase1": phase1, "phase2": phase2}


def report(args: argparse.Namespace, place: Placement, run: dict[str, Any], bare_before: dict[str, Any],
           bare_after: dict[str, Any]) -> None:
    phase1, phase2 = run["phase1"], run["phase2"]
    bare = {"before": bare_before, "after": bare_after,
            "tokens_per_s": (bare_before["tokens_per_s"] + bare_after["tokens_per_s"]) / 2}
    rows, e2e_s, submit_s = phase1["rows"], phase1["e2e_s"], phase1["submit_s"]
    tokens = sum(r.output_tokens or 0 for r in rows)
    pipeline_modes = dict(Counter(r.decoded_mode or "?" for r in rows))
    busy_s = (max(r.finished_at for r in rows) - min(r.started_at for r in rows)).total_seconds()
    latencies = phase2["latencies"]
    e2e_tps = tokens / e2e_s
    wl = worker_log_figures(phase1["log"], t0_wall=phase1["t0_wall"], end_wall=phase1["end_wall"], tokens=tokens,
                            batch=args.batch)
    cpu = phase1["cpu"]
    # CPU seconds per job on the worker's side (what pinned puts on its core) against the bare
    # decoder's: a ceiling on the efficiency that other processes' load hardly moves.
    worker_cpu = sum(cpu["processes"][g] for g in ("worker process", "worker upload helpers", "launcher"))
    decode_name = cpu["decode_thread"].get("name", "")
    threads_cpu = {n: t["cpu_s"] for n, t in cpu["worker_threads"].items()}
    recorder = sum(c for n, c in threads_cpu.items() if "record" in n)
    per_job = {"decode thread": threads_cpu.get(decode_name, 0.0), "recorder thread": recorder,
               "other threads": cpu["processes"]["worker process"] - threads_cpu.get(decode_name, 0.0) - recorder,
               "upload helpers": cpu["processes"]["worker upload helpers"]}
    per_job = {k: 1000 * v / args.jobs for k, v in per_job.items()}
    bare_cpu_per_token = sum(b["cpu_s"] / b["tokens"] for b in (bare_before, bare_after)) / 2
    cpu_figures = {"worker_cpu_s": worker_cpu, "ms_per_job": per_job,
                   "bare_ms_per_job": 1000 * bare_cpu_per_token * tokens / args.jobs,
                   "ceiling": bare_cpu_per_token * tokens / worker_cpu if worker_cpu else None}
    factors = {}
    if wl["micro_batches"]:
        factors = {"worker_busy_share": wl["total_s"] / e2e_s, "engine_loop_share": 1 - wl["outside_loop"],
                   "loop_vs_bare_speed": wl["loop_tokens_per_s"] / bare["tokens_per_s"]}
    result = {
        "jobs": args.jobs, "succeeded": sum(r.status == "succeeded" for r in rows), "batch": args.batch,
        "threads": args.threads, "placement": phase1["placement"], "submit_s": submit_s, "e2e_s": e2e_s,
        "e2e_jobs_per_s": args.jobs / e2e_s, "tokens": tokens, "e2e_tokens_per_s": e2e_tps, "worker_busy_s": busy_s,
        "bare": bare, "efficiency": e2e_tps / bare["tokens_per_s"], "efficiency_factors": factors,
        "worker_cpu": cpu_figures,
        "pipeline_modes": pipeline_modes, "worker_log": wl, "cpu_s": cpu, "profile": phase1["profile"],
        "get_job": {"rps_target": args.rps, "requests": len(latencies), "jobs": args.latency_jobs,
                    "batch_s": phase2["e2e_s"],
                    "batch_succeeded": sum(r.status == "succeeded" for r in phase2["rows"]),
                    "achieved_rps": len(latencies) / phase2["load_s"] if latencies else 0.0,
                    "p50_ms": 1000 * median(latencies) if latencies else None,
                    "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else None},
    }
    pct = "{:.1f} %".format
    waits = [("pipeline, decode thread", cpu["decode_thread"].get("run_queue_wait", 0.0)),
             ("bare before", bare_before["run_queue_wait"]),
             ("bare after", bare_after["run_queue_wait"])]
    lines: list[tuple[str, str, str]] = [
        ("placement", place.mode, ""),
        ("jobs succeeded", f"{result['succeeded']}/{args.jobs}", ""),
        ("submit s (upload + create batch)", f"{submit_s:.2f}", "<= 5"),
        ("end-to-end s", f"{e2e_s:.1f}", ""),
        ("end-to-end jobs/s", f"{result['e2e_jobs_per_s']:.1f}", ""),
        ("end-to-end decoder tokens/s", f"{e2e_tps:.0f}", ""),
        (f"bare decoder tokens/s ({args.bare_jobs} texts), before", f"{bare_before['tokens_per_s']:.0f}", ""),
        (f"bare decoder tokens/s ({args.bare_jobs} texts), after", f"{bare_after['tokens_per_s']:.0f}", ""),
        ("modes: pipeline (decoded)", json.dumps(pipeline_modes), ""),
        ("modes: bare decoder (decoded, after)", json.dumps(bare_after["decoded_modes"]), ""),
        (f"pipeline efficiency ({place.mode})", efficiency_text(result), ">= 0.95"),
    ]
    if wl["micro_batches"]:
        per = wl["outside_loop_per_micro_batch"]
        lines += [
            ("worker micro-batches (median jobs each)",
             f"{wl['micro_batches']} ({wl['jobs_per_micro_batch_median']:.0f})", ""),
            ("worker time outside the engine loop", pct(100 * wl["outside_loop"]), "<= 3 %"),
            ("  per micro-batch: median / max", f"{pct(100 * per['median'])} / {pct(100 * per['max'])}", ""),
            (f"  ms outside the loop per {args.batch} jobs", f"{wl['outside_loop_ms_per_group']:.1f}", ""),
            ("engine-loop decoder tokens/s", f"{wl['loop_tokens_per_s']:.0f}", ""),
            ("efficiency = busy share x loop share x speed",
             " x ".join(f"{v:.3f}" for v in factors.values()), ""),
        ]
        if "head_s" in wl:
            lines.append(("  e2e s: head / micro-batches / gaps / tail",
                          f"{wl['head_s']:.1f} / {wl['total_s']:.1f} / {wl['gaps_s']:.1f} / {wl['tail_s']:.1f}", ""))
        lines += [(f"  {name} (all micro-batches)", pct(100 * secs / wl["total_s"]), "")
                  for name, secs in sorted(wl["parts_s"].items(), key=lambda kv: -kv[1])]
    else:
        lines.append(("worker time outside the engine loop", "no micro-batch lines in the worker's log", ""))
    lines += [
        ("worker CPU ms/job: " + ", ".join(per_job) + " | bare",
         ", ".join(f"{v:.1f}" for v in per_job.values()) + f" | {cpu_figures['bare_ms_per_job']:.1f}", ""),
        ("CPU ceiling on efficiency (bare CPU / worker CPU)", f"{cpu_figures['ceiling'] or 0:.3f}", ""),
    ]
    lines += [(f"run-queue wait / wall (contention), {name}", pct(100 * v), "") for name, v in waits]
    lines += [(f"CPU s, {name}", f"{s:.1f}", "") for name, s in cpu["processes"].items()]
    lines += [(f"  worker thread {name}: CPU s / run-queue wait s",
               f"{t['cpu_s']:.1f} / {t['run_queue_wait_s']:.1f}", "")
              for name, t in list(cpu["worker_threads"].items())[:8]]
    lines += [
        (f"phase 2: {args.latency_jobs} jobs under GET load, s", f"{phase2['e2e_s']:.1f}", ""),
        (f"GET /v1/jobs/{{id}} p50 ms @ {args.rps}/s", f"{result['get_job']['p50_ms'] or 0:.1f}", ""),
        (f"GET /v1/jobs/{{id}} p99 ms @ {args.rps}/s", f"{result['get_job']['p99_ms'] or 0:.1f}", "<= 20"),
        ("GET achieved requests/s", f"{result['get_job']['achieved_rps']:.0f}", ""),
    ]
    print()
    print(f"placement {place.describe()}")
    print(f"{'metric':<48} {'value':>14} {'target':>10}")
    for name, value, target in lines:
        print(f"{name:<48} {value:>14} {target:>10}" if len(value) <= 14 else f"{name:<48} {value} {target}")
    for thread, where in (phase1["profile"] or {}).items():
        spent = sum(where.values())
        top = ", ".join(f"{k} {v:.1f}s" for k, v in list(where.items())[:6])
        print(f"profile {thread} ({spent:.1f} s sampled): {top}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
