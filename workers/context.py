"""What a worker process holds while it runs: settings, connections, its runtime, the serving
runner (through its hot swap), its live claims."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor

from sqlalchemy.orm import Session, sessionmaker

from workers.metrics import WorkerMetrics
from workers.protocol import Runner, engine_runner
from workers.runtime import WorkerRuntime
from workers.swap import HotSwap
from workers.uploader import Uploader
from yue2_jobs.core.config import Settings
from yue2_jobs.jobs.state import ClaimedJob
from yue2_jobs.storage import Storage


class WorkerContext:
    """One worker process's shared state. Every thread it has is its `runtime`'s; every field is
    set here (`requeue` by the worker once its Celery app exists) and only `claims` (under `lock`),
    the swap (under its own lock) and the events change later.

    `load(version)`: a runner for another version of the variant (None: no hot swap)."""

    def __init__(self, *, settings: Settings, sessions: sessionmaker[Session], storage: Storage, runner: Runner,
                 name: str, runtime: WorkerRuntime | None = None, load: Callable[[str], Runner] | None = None,
                 metrics: WorkerMetrics | None = None) -> None:
        self.settings, self.sessions, self.storage, self.name = settings, sessions, storage, name
        self.runtime = runtime or WorkerRuntime()
        er = engine_runner(runner)
        self.metrics = metrics or WorkerMetrics(worker=name, max_rows=er.engine.max_rows if er and er.engine else 1)
        self.claims: dict[str, str] = {}  # job id -> claim token, renewed by the heartbeat
        self.lock = threading.Lock()  # `claims`
        # Recording a slice's results (S3 PUTs, one UPDATE) overlaps decoding of the next slice.
        self._recorder = self.runtime.thread_pool("yue2-record", 1)
        self.uploader = Uploader(settings, storage, runtime=self.runtime)
        self.report_now = threading.Event()  # wakes the status report: a swap's transition is written at once
        # Set when a warm shutdown begins: a micro-batch finishes what it started and starts nothing
        # more; `requeue` puts what it did not start back on the queue before the micro-batch's ack
        # (without one, e.g. in a test, those jobs stay queued until the reconciler republishes them).
        self.draining = threading.Event()
        self.requeue: Callable[[list[str]], None] = lambda job_ids: None
        self.swap = HotSwap(runner, load=load, spawn=self.runtime.spawn, on_change=self.report_now.set,
                            on_adopt=self._adopted)

    @property
    def runner(self) -> Runner:
        """The runner serving now (a hot swap replaces it between groups of jobs)."""
        return self.swap.serving

    @property
    def recorder(self) -> Executor:
        return self._recorder.executor

    def _adopted(self, runner: Runner) -> None:
        self.metrics.checkpoint_event("swap", runner.checkpoint)
        self.metrics.runner_loaded(runner)

    def hold(self, rows: list[ClaimedJob]) -> None:
        """Claims the heartbeat renews from now on."""
        with self.lock:
            self.claims.update({r.id: r.claim_token for r in rows})

    def let_go(self, job_ids: Iterable[str]) -> None:
        """Stop renewing these claims: recorded, or given back (the lease expires and the reconciler
        reruns the job)."""
        with self.lock:
            for job_id in job_ids:
                self.claims.pop(job_id, None)
