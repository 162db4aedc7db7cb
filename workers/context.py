"""What a worker process holds while it runs: settings, connections, its runner, its live claims."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from workers.metrics import WorkerMetrics
from workers.protocol import Runner, engine_runner
from workers.uploader import Uploader
from yue2_jobs.core.config import Settings
from yue2_jobs.jobs.state import ClaimedJob
from yue2_jobs.storage import Storage


@dataclass
class WorkerContext:
    settings: Settings
    sessions: sessionmaker[Session]
    storage: Storage
    runner: Runner
    name: str
    claims: dict[str, str] = field(default_factory=dict)  # job id -> claim token, renewed by the heartbeat
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Recording a slice's results (S3 PUTs, one UPDATE) overlaps decoding of the next slice.
    recorder: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "yue2-record"))
    uploader: Uploader | None = None
    metrics: WorkerMetrics | None = None
    # Held by each micro-batch from its first claim to its last record; a hot swap takes it to
    # replace `runner`, so the switch falls between micro-batches (workers.swap).
    swap_lock: threading.Lock = field(default_factory=threading.Lock)
    swap_status: dict[str, Any] = field(default_factory=dict)
    # Taken to decide whether to start a load: the status-report thread (the watchdog's request in the
    # worker's row) and Celery's remote control (`yue2_swap`, answered mid-batch too) ask at once.
    swap_start_lock: threading.Lock = field(default_factory=threading.Lock)
    pending_runner: Runner | None = None  # a hot swap's loaded runner, until the decode loop adopts it (workers.swap)
    report_now: threading.Event = field(default_factory=threading.Event)  # wakes the status reporter

    def __post_init__(self) -> None:
        if self.uploader is None:
            self.uploader = Uploader(self.settings, self.storage)
        if self.metrics is None:
            er = engine_runner(self.runner)
            self.metrics = WorkerMetrics(worker=self.name, max_rows=er.engine.max_rows if er and er.engine else 1)

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


