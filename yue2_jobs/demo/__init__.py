"""`make demo`: the whole pipeline on the embedded default, with no Redis, Postgres or S3 server.

SQLite, kombu's filesystem transport and a local storage directory stand in for the three
servers; everything else is the production code path. The demo migrates a fresh database, starts
the HTTP API (in this process) and a `yue2 worker` (a subprocess holding the shipped `base`
checkpoint), submits a batch of held-out texts through the API as an OpenAI-style JSONL file,
waits with a progress bar, prints a few summaries and the throughput, and stops the worker.

A demo's stop owes nothing (`procs.NOTHING`): its results are thrown away with its directory, so
its workers are SIGKILLed at once, never given a warm shutdown. However it is stopped (Ctrl-C to
its process group, SIGTERM to it or to the `make` above it, once or twice, mid-micro-batch) it
exits within `DEMO_STOP_S`, every process it started gone and its directory removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from tqdm import tqdm

from yue2_jobs.core.config import Settings
from yue2_jobs.core.paths import DATA
from yue2_jobs.core.procs import (
    KILL_S,
    NOTHING,
    die_with_parent,
    shielded,
    signals_deferred,
    stop_all,
    stop_once_on_signals,
)

VARIANTS = ("base", "legal")
SHOWN = 5  # examples printed per variant
# The API thread gets this long to answer the requests in hand once told to exit, then as long
# again told to exit at once (uvicorn's force_exit: no wait for open connections).
SERVER_STOP_S = 5.0
# A stopped demo exits within this of the signal: its workers SIGKILLed and gone (KILL_S, while the
# API stops beside them), the API (2 x SERVER_STOP_S), the directory removed and the interpreter's
# exit (a few seconds on a loaded 2-core host). tests/demo/test_signals.py holds it to this.
DEMO_STOP_S = KILL_S + 2 * SERVER_STOP_S + 10.0


def _start_api(settings: Settings) -> tuple[Any, threading.Thread, str]:
    import uvicorn

    from yue2_jobs.api.app import create_app
    from yue2_jobs.api.server import config
    from yue2_jobs.core.net import free_port

    port = free_port()
    server = uvicorn.Server(config(create_app(settings), settings, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("demo: the API did not start within 30 s")
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


def embedded_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment with the embedded-mode settings under `home` (and `extra`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_")}
    env.update(YUE2_HOME=str(home), YUE2_BATCH_MAX_JOBS="32", YUE2_BATCH_FLUSH_MS="50", **extra)
    return env


def start_worker(env: dict[str, str], *, variant: str, home: Path,
                 owner: dict[str, tuple[subprocess.Popen[bytes], Path]] | None = None, cpus: list[int] | None = None,
                 ) -> tuple[subprocess.Popen[bytes], Path]:
    """`yue2 worker --variant V` in a subprocess; returns once it is ready (its ready file exists).
    The worker gets SIGTERM if this process dies, however it dies. It is in `owner[variant]` from
    the moment it exists, so a stop that lands while it loads finds it. `cpus`: the CPUs it may run
    on (its launcher splits them among its children), else all of this process's."""
    ready, log = home / f"worker-{variant}.ready", home / f"worker-{variant}.log"
    with signals_deferred():  # a stop landing between Popen's fork and `owner` would miss the process
        proc = subprocess.Popen([sys.executable, "-m", "workers", "--variant", variant], cwd=home,
                                env={**env, "YUE2_WORKER_READY_FILE": str(ready)}, stdout=log.open("wb"),
                                stderr=subprocess.STDOUT, preexec_fn=_pinned(cpus), process_group=0)
        if owner is not None:
            owner[variant] = (proc, log)
    try:
        while not ready.exists():  # the worker imports torch and loads the checkpoint first
            if proc.poll() is not None:
                raise SystemExit(f"demo: the {variant} worker exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
    except BaseException:  # interrupted while it starts: it must not outlive us
        stop_all([proc], NOTHING)
        raise
    return proc, log


@dataclass
class EmbeddedStack:
    """A migrated SQLite database, an API key and the API (in this process) under `home`, and the
    workers started in it (`worker`): `embedded_stack` stops them all and removes `home`."""

    home: Path
    env: dict[str, str]
    settings: Settings
    key: str
    url: str
    server: Any
    workers: dict[str, tuple[subprocess.Popen[bytes], Path]] = field(default_factory=dict)

    def worker(self, variant: str, *, cpus: list[int] | None = None) -> subprocess.Popen[bytes]:
        """Start a worker for `variant` (see `start_worker`; `cpus`: pinned to these), owned by this stack."""
        return start_worker(self.env, variant=variant, home=self.home, owner=self.workers, cpus=cpus)[0]


def _pinned(cpus: list[int] | None) -> Callable[[], None]:
    """A worker's `preexec_fn`: its CPUs set (when given), and SIGTERM when this process dies."""
    def setup() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        die_with_parent()
    return setup


def stop_with_parent() -> None:
    """A demo's own lifetime: SIGTERM stops its workers and removes its directory as Ctrl-C does,
    a second one of either changes nothing, and it gets SIGTERM when whatever started it (`make`,
    a shell) dies."""
    stop_once_on_signals()
    die_with_parent(signal.SIGTERM)


@contextlib.contextmanager
def embedded_stack(*, prefix: str, tenant: str, keep: bool = False) -> Iterator[EmbeddedStack]:
    """The embedded pipeline's shared part, for the length of a `with`. However the block ends
    (an error, Ctrl-C, or SIGTERM, which `stop_once_on_signals` turns into SystemExit) its workers
    are SIGKILLed and its directory removed (unless `keep`), within `DEMO_STOP_S`."""
    from yue2_jobs.auth import create_api_key
    from yue2_jobs.db.migrate import upgrade_head
    from yue2_jobs.db.session import session_factory

    home: Path | None = None
    server: Any = None
    thread: threading.Thread | None = None
    stack: EmbeddedStack | None = None
    try:
        home = Path(tempfile.mkdtemp(prefix=prefix))
        print(f"embedded pipeline in {home}: SQLite database, filesystem queue, local storage", flush=True)
        env = embedded_env(home)
        # This process's settings are the embedded ones too: YUE2_* variables a user exported for
        # a real stack (`yue2 stack up`) must not point the demo at it.
        for name in [n for n in os.environ if n.startswith("YUE2_")]:
            del os.environ[name]
        os.environ.update(env)
        settings = Settings()
        upgrade_head(settings.resolved_database_url)
        with session_factory(settings.resolved_database_url)() as session:
            key = create_api_key(session, tenant=tenant)
        server, thread, url = _start_api(settings)
        stack = EmbeddedStack(home=home, env=env, settings=settings, key=key, url=url, server=server)
        yield stack
    finally:
        with shielded():
            if server is not None:
                server.should_exit = True  # it winds down while the workers die
            if stack is not None:
                stop_all([proc for proc, _ in stack.workers.values()], NOTHING)
            if server is not None and thread is not None:
                _stop_server(server, thread)  # its last requests may still write under home
            if home is not None and not keep:
                shutil.rmtree(home, ignore_errors=True)


def _stop_server(server: Any, thread: threading.Thread) -> None:
    """Wait for the API thread (already told to exit) up to SERVER_STOP_S, then tell it to exit
    without waiting for open connections, and wait as long again. One still running after that is
    left (a daemon thread), said so."""
    thread.join(SERVER_STOP_S)
    if thread.is_alive():
        server.force_exit = True
        thread.join(SERVER_STOP_S)
    if thread.is_alive():
        print(f"demo: the API did not stop within {2 * SERVER_STOP_S:.0f}s", file=sys.stderr, flush=True)


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

    stop_with_parent()
    t_start = time.perf_counter()
    with embedded_stack(prefix="yue2-demo-", tenant="demo", keep=keep) as stack:
        for variant in VARIANTS:
            stack.worker(variant)
        workers, url, key, home = stack.workers, stack.url, stack.key, stack.home
        pids = ", ".join(f"{v} {proc.pid}" for v, (proc, _) in workers.items())
        print(f"workers ready {time.perf_counter() - t_start:.1f}s after start (pids: {pids})", flush=True)
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


if __name__ == "__main__":
    main(items=int(sys.argv[1]) if len(sys.argv) > 1 else 200)
