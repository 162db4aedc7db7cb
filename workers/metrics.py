"""Prometheus metrics of one worker process, served on `YUE2_METRICS_PORT` (child i of the
launcher: that port + i), every series labelled with the Celery node name.

Counters are cumulative (use `rate()`); `yue2_worker_tokens_per_second` and
`yue2_worker_nar_acceptance` are the worker's own view over its last decoding window, for a
dashboard without PromQL.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from workers.protocol import Runner
    from yue2_jobs.decode.continuous import ContinuousBatcher

OCCUPANCY_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


class WorkerMetrics:
    def __init__(self, *, worker: str, max_rows: int) -> None:
        self.registry = CollectorRegistry()
        self.worker = worker
        r, w = self.registry, ["worker"]
        self.jobs = Counter("yue2_worker_jobs", "Jobs this worker finished, by outcome.", [*w, "status"], registry=r)
        self.occupancy = Histogram("yue2_worker_batch_occupancy", "Sequences decoding in each decoder step.", w,
                                   buckets=sorted({b for b in OCCUPANCY_BUCKETS if b < max_rows} | {max_rows}),
                                   registry=r)
        self.tokens = Counter("yue2_worker_tokens", "Tokens generated.", w, registry=r)
        self.nar_tokens = Counter("yue2_worker_nar_tokens", "Generated tokens the NAR branch drafted.", w, registry=r)
        self.drafted = Counter("yue2_worker_drafted_tokens", "NAR draft tokens sent to verification.", w, registry=r)
        self.steps = Counter("yue2_worker_decoder_steps", "Decoder steps of the continuous engine.", w, registry=r)
        self.tokens_per_s = Gauge("yue2_worker_tokens_per_second", "Tokens per second over the last window.", w,
                                  registry=r)
        self.acceptance = Gauge("yue2_worker_nar_acceptance", "Verified NAR drafts accepted, last window.", w,
                                registry=r)
        self.queue_depth = Gauge("yue2_worker_queue_depth",
                                 "Waiting work: messages in the broker queue, jobs in the engine.", [*w, "where"],
                                 registry=r)
        self.checkpoint_events = Counter("yue2_worker_checkpoint_events", "Checkpoint loads and swaps.",
                                         [*w, "event", "checkpoint"], registry=r)
        self.gpu_memory = Gauge("yue2_worker_gpu_memory_bytes", "CUDA memory of this process.", [*w, "kind"],
                                registry=r)
        self.graphs = Gauge("yue2_worker_cuda_graphs", "Decode-step CUDA graphs captured for the loaded model.", w,
                            registry=r)
        self.graph_capture = Gauge("yue2_worker_graph_capture_seconds", "Time the CUDA graph capture took.", w,
                                   registry=r)
        self.mode_speed = Gauge("yue2_worker_mode_tokens_per_second",
                                "What `auto` measured: tokens/s of ar and hybrid by batch-size bucket.",
                                [*w, "bucket", "mode"], registry=r)
        self._lock = threading.Lock()
        self._window = (time.monotonic(), 0, 0, 0)  # start, tokens, nar, drafted: for the rates
        self._reported = 0  # engine drafts already added to the counter
        self._engine: ContinuousBatcher[str] | None = None

    def job_done(self, status: str, n: int = 1) -> None:
        if n:
            self.jobs.labels(self.worker, status).inc(n)

    def checkpoint_event(self, event: str, checkpoint: str) -> None:
        self.checkpoint_events.labels(self.worker, event, checkpoint).inc()

    def engine_progress(self, engine: ContinuousBatcher[str]) -> None:
        """Fold the engine's counters since the last call into the metrics."""
        c = engine.counters
        with self._lock:
            if engine is not self._engine:  # a hot swap brought a new engine: its counters start at 0
                self._engine, self._reported = engine, 0
                self._window = (time.monotonic(), c.tokens, c.nar_tokens, c.drafted)
        for live in c.occupancy:
            self.occupancy.labels(self.worker).observe(live)
        self.steps.labels(self.worker).inc(len(c.occupancy))
        c.occupancy = []
        self.queue_depth.labels(self.worker, "engine").set(len(engine.waiting) + engine.live)
        with self._lock:
            self.drafted.labels(self.worker).inc(c.drafted - self._reported)
            self._reported = c.drafted
            start, tok0, nar0, dr0 = self._window
            now = time.monotonic()
            if now - start >= 1.0:
                self.tokens_per_s.labels(self.worker).set((c.tokens - tok0) / (now - start))
                if c.drafted > dr0:
                    self.acceptance.labels(self.worker).set((c.nar_tokens - nar0) / (c.drafted - dr0))
                self._window = (now, c.tokens, c.nar_tokens, c.drafted)

    def tokens_done(self, *, tokens: int, nar_tokens: int) -> None:
        self.tokens.labels(self.worker).inc(tokens)
        self.nar_tokens.labels(self.worker).inc(nar_tokens)

    def runner_loaded(self, runner: Runner) -> None:
        """A (new) runner is serving: its graph capture, as the ready log reports it."""
        self.graphs.labels(self.worker).set(getattr(runner, "graph_count", 0))
        self.graph_capture.labels(self.worker).set(getattr(runner, "graph_capture_s", 0.0))

    def sample_modes(self, runner: Runner) -> None:
        """Copy the `auto` chooser's measurements (a model runner's decode session's; a font runner
        has no session)."""
        session = getattr(runner, "session", None)
        chooser = getattr(session, "chooser", None)
        for bucket, row in (chooser.table() if chooser is not None else {}).items():
            for mode in ("ar", "hybrid"):
                if f"{mode}_tok_s" in row:
                    self.mode_speed.labels(self.worker, str(bucket), mode).set(float(row[f"{mode}_tok_s"]))

    def sample_gpu(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.gpu_memory.labels(self.worker, "allocated").set(torch.cuda.memory_allocated())
            self.gpu_memory.labels(self.worker, "reserved").set(torch.cuda.memory_reserved())
