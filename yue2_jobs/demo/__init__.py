"""`make demo`: the whole pipeline on the embedded default, with no Redis, Postgres or S3 server.

SQLite, kombu's filesystem transport and a local storage directory stand in for the three
servers; everything else is the production code path. The demo migrates a fresh database, starts
the HTTP API (in this process) and a `yue2 worker` (a subprocess holding the shipped `base`
checkpoint), submits a batch of held-out texts through the API as an OpenAI-style JSONL file,
waits with a progress bar, prints a few summaries and the throughput, and stops the worker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from tqdm import tqdm

from yue2_jobs.core.config import Settings
from yue2_jobs.core.paths import DATA

VARIANTS = ("base", "legal")
SHOWN = 5  # examples printed per variant


def _start_api(settings: Settings) -> tuple[object, str]:
    import uvicorn

    from yue2_jobs.api.app import create_app
    from yue2_jobs.api.server import config
    from yue2_jobs.core.net import free_port

    port = free_port()
    server = uvicorn.Server(config(create_app(settings), settings, host="127.0.0.1", port=port))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("demo: the API did not start within 30 s")
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def embedded_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment with the embedded-mode settings under `home` (and `extra`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}
    env.update(YUE2_HOME=str(home), YUE2_BATCH_MAX_JOBS="32", YUE2_BATCH_FLUSH_MS="50", **extra)
    return env


def start_worker(env: dict[str, str], *, variant: str, home: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`yue2 worker --variant V` in a subprocess; returns once it is ready (its ready file exists)."""
    ready, log = home / f"worker-{variant}.ready", home / f"worker-{variant}.log"
    proc = subprocess.Popen([sys.executable, "-m", "workers", "--variant", variant], cwd=home,
                            env={**env, "YUE2_WORKER_READY_FILE": str(ready)}, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    while not ready.exists():  # the worker imports torch and loads the checkpoint first
        if proc.poll() is not None:
            raise SystemExit(f"demo: the {variant} worker exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, log


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)  # warm shutdown
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


@dataclass
class EmbeddedStack:
    """A migrated SQLite database, an API key and the API (in this process) under `home`."""

    home: Path
    env: dict[str, str]
    settings: Settings
    key: str
    url: str
    server: Any


def start_embedded(*, prefix: str, tenant: str) -> EmbeddedStack:
    """The embedded pipeline's shared part; workers are started with `start_worker`."""
    from yue2_jobs.auth import create_api_key
    from yue2_jobs.db.migrate import upgrade_head
    from yue2_jobs.db.session import session_factory

    home = Path(tempfile.mkdtemp(prefix=prefix))
    env = embedded_env(home)
    os.environ.update(env)
    settings = Settings()
    upgrade_head(settings.resolved_database_url)
    with session_factory(settings.resolved_database_url)() as session:
        key = create_api_key(session, tenant=tenant)
    server, url = _start_api(settings)
    return EmbeddedStack(home=home, env=env, settings=settings, key=key, url=url, server=server)


def _show_examples(lines: list[dict], by_id: dict[str, dict[str, str]]) -> None:
    """SHOWN outputs of each variant beside their references, spread over the batch."""
    ordered = sorted(lines, key=lambda ln: int(ln["custom_id"].split("-")[1]))
    for variant in VARIANTS:
        mine = [ln for ln in ordered if ln["response"]["body"]["variant"] == variant]
        print(f"\n{variant} ({'general' if variant == 'base' else 'legal'} eval set):")
        for line in mine[:: max(1, len(mine) // SHOWN)][:SHOWN]:
            row, body = by_id[line["custom_id"]], line["response"]["body"]
            text = row["text"]
            print(f"[{line['custom_id']}] {text[:110]}{'…' if len(text) > 110 else ''}")
            print(f"  reference: {row['summary']}")
            print(f"  {body['checkpoint']}: {body['output']}")


def main(*, items: int = 200, keep: bool = False) -> None:
    from yue2_jobs.client import Client
    from yue2_jobs.training.data import read_split

    t_start = time.perf_counter()
    stack = start_embedded(prefix="yue2-demo-", tenant="demo")
    home, env, key, url, server = stack.home, stack.env, stack.key, stack.url, stack.server
    print(f"embedded pipeline in {home}: SQLite database, filesystem queue, local storage")
    workers = {v: start_worker(env, variant=v, home=home) for v in VARIANTS}
    try:
        pids = ", ".join(f"{v} {proc.pid}" for v, (proc, _) in workers.items())
        print(f"workers ready {time.perf_counter() - t_start:.1f}s after start (pids: {pids})")
        # Each variant on its own domain: base summarises package descriptions and docstrings,
        # legal names the licence a passage comes from.
        half = items // 2
        rows = [(r, "base") for r in read_split(DATA, "general", "eval")[: items - half]]
        rows += [(r, "legal") for r in read_split(DATA, "legal", "eval")[:half]]
        batch_file = home / "batch.jsonl"
        batch_file.write_text("".join(json.dumps({"custom_id": f"eval-{i}", "method": "POST", "url": "/v1/summarize",
                                                  "body": {"input": r["text"], "variant": v}},
                                                 ensure_ascii=False) + "\n"
                                      for i, (r, v) in enumerate(rows)))
        client = Client(url, key)
        t_submit = time.perf_counter()
        batch = client.create_batch(client.upload(batch_file)["id"], metadata={"source": "make demo"})
        print(f"submitted {batch['request_counts']['total']} summaries as {batch['id']} "
              f"in {time.perf_counter() - t_submit:.2f}s (API at {url})")
        with tqdm(total=len(rows), unit="job", desc="summarizing", file=sys.stdout, mininterval=0.5) as bar:
            def update(state: dict) -> None:
                for proc, log in workers.values():
                    if proc.poll() is not None:
                        raise SystemExit(f"demo: a worker exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
                counts = state["request_counts"]
                bar.update(counts["completed"] + counts["failed"] - bar.n)

            state = client.wait(batch["id"], poll_s=0.2, timeout_s=600, on_update=update)
        wall = time.perf_counter() - t_submit
        lines = [json.loads(ln) for ln in client.file_content(state["output_file_id"]).decode().splitlines()]
        _show_examples(lines, {f"eval-{i}": r for i, (r, _) in enumerate(rows)})
        bodies = [ln["response"]["body"] for ln in lines]
        tokens = sum(b["usage"]["output_tokens"] for b in bodies)
        steps = sum(b["decoding"]["decoder_steps"] for b in bodies)
        nar = sum(b["decoding"]["nar_tokens"] for b in bodies)
        latencies = [client.job(b["id"]) for b in bodies[:: max(1, len(bodies) // 40)]]
        lat = [j["finished_at"] - j["created_at"] for j in latencies]
        counts = state["request_counts"]
        print()
        print(f"{'jobs':>6} {'failed':>6} {'wall s':>7} {'jobs/s':>7} {'tokens':>7} {'tokens/s':>9} "
              f"{'tau':>5} {'NAR share':>9} {'p50 job latency s':>17}")
        print(f"{counts['completed']:>6} {counts['failed']:>6} {wall:>7.1f} {counts['completed'] / wall:>7.1f} "
              f"{tokens:>7} {tokens / wall:>9.0f} {tokens / steps:>5.2f} {100 * nar / tokens:>8.1f}% "
              f"{median(lat):>17.1f}")
        print(f"(tau: tokens per decoder step, over the jobs auto ran as ar or hybrid; NAR share: tokens the NAR "
              f"branch drafted and the "
              f"AR branch verified. Total demo time {time.perf_counter() - t_start:.1f}s.)")
        if counts["failed"] or state["status"] != "completed":
            raise SystemExit(f"demo: batch ended {state['status']} with {counts['failed']} failed requests")
    finally:
        for proc, _ in workers.values():
            stop_worker(proc)
        server.should_exit = True
        if not keep:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main(items=int(sys.argv[1]) if len(sys.argv) > 1 else 200)
