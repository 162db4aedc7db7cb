"""`yue2-worker --child`: one Celery worker process holding one variant's model.

Celery's threads pool, one thread, runs the micro-batches (a prefork pool breaks CUDA, celery#3402),
so the main thread stays free to send heartbeats and answer remote control mid-batch. Every other
thread of the process belongs to its `WorkerRuntime` (`workers.runtime`): the duties of
`workers.duties` (lease heartbeat, status report, reconciler, ...), the recorder and upload pools,
a hot swap's load. `run_worker` starts it and, however the worker ends, stops it in one place
(`_stop`).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from workers.protocol import Runner
from workers.runtime import MetricsServer, WorkerRuntime
from yue2_jobs.core.config import Settings
from yue2_jobs.core.procs import WORKER_WARM_S
from yue2_jobs.db.session import session_factory
from yue2_jobs.errors import CheckpointError
from yue2_jobs.fonts.params import FONTS_VARIANT
from yue2_jobs.queue import make_celery, queue_for
from yue2_jobs.storage import storage_from_url

if TYPE_CHECKING:
    from workers.context import WorkerContext
    from workers.deliveries import HeldDeliveries

log = logging.getLogger("yue2.worker")
LOAD_REPORT_S = 5.0  # how often a loading (or down) worker refreshes its status row
# How long a stopping worker waits for its duties and pools once Celery's own warm shutdown is done
# (its micro-batch recorded and acked): the last uploads and records are in the pools by then.
RUNTIME_STOP_S = 10.0


class DirectoryFor(Protocol):
    def __call__(self, version: str, *, local: bool = True) -> Path:
        """`version` of the worker's variant as a local directory (`local`: the starting directory may
        be it)."""
        ...


def load_runner(settings: Settings, variant: str, directory: Path | None = None) -> Runner:
    if variant == FONTS_VARIANT:  # render jobs: the CPU font runner, no checkpoint
        from workers.font_runner import FontRunner

        return FontRunner(variant=variant, settings=settings)
    module, _, factory = settings.runner.partition(":")
    runner: Runner = getattr(importlib.import_module(module), factory)(variant=variant, settings=settings,
                                                                       directory=directory)
    return runner


def version_directories(settings: Settings, variant: str) -> DirectoryFor:
    """A function giving any published version of `variant` as a local directory: the configured
    starting directory when the version is that one (registered as the variant's first version; a
    host need not fetch what it has), else fetched from the store once."""
    from yue2_jobs.checkpoints.validate import download
    from yue2_jobs.model.checkpoint import MANIFEST, directory_version

    store = storage_from_url(settings.resolved_checkpoint_store_url, endpoint_url=settings.s3_endpoint_url,
                             region=settings.s3_region)
    seed = Path(settings.checkpoints[variant])

    def directory_for(version: str, *, local: bool = True) -> Path:
        if local and (seed / MANIFEST).is_file() and directory_version(seed) == version:
            return seed
        return download(store, variant=variant, version=version, cache_dir=settings.resolved_checkpoint_cache_dir)

    return directory_for


def load_version(settings: Settings, variant: str, directory_for: DirectoryFor, version: str) -> Runner:
    """A runner for `variant@version`: the starting directory when it is that version, else the store's."""
    directory = directory_for(version)
    try:
        return load_runner(settings, variant, directory)
    except CheckpointError:
        if directory != Path(settings.checkpoints[variant]):
            raise
        # the starting directory names this version but its files are not it: the store's copy
        return load_runner(settings, variant, directory_for(version, local=False))


def active_version(sessions: sessionmaker[Session], variant: str) -> str | None:
    """The registry's active version of `variant` (None: serve the configured starting directory)."""
    from yue2_jobs.checkpoints import registry

    with sessions() as session:
        row = registry.active(session, variant)
    return row.version if row is not None else None


def load_first_runner(settings: Settings, sessions: sessionmaker[Session], *, variant: str, node: str,
                      runtime: WorkerRuntime) -> Runner | None:
    """The runner this worker starts with: the active version (else the starting directory), loaded
    with backoff; when every attempt fails the worker stays down (`workers/loading.py`) until the
    active version changes. None: asked to stop before anything loaded."""
    from workers.loading import LoadState, load_with_backoff, report_while_loading, stay_down, stop_on_signals

    if variant == FONTS_VARIANT:  # nothing to fetch or fail: render jobs need no checkpoint
        return load_runner(settings, variant)
    directory_for = version_directories(settings, variant)

    def load_active() -> tuple[str | None, Callable[[], Runner]]:
        version = active_version(sessions, variant)
        if version is None:
            return None, lambda: load_runner(settings, variant)
        return version, lambda: load_version(settings, variant, directory_for, version)

    state = LoadState()
    restore = stop_on_signals(state)
    reporter = runtime.every("load-report", LOAD_REPORT_S,
                             report_while_loading(sessions, name=node, variant=variant, state=state),
                             quiet=(Exception,))  # the database away: the row goes stale, as a dead worker's would
    runtime.start()
    what = f"variant {variant!r}"
    try:
        runner = load_with_backoff(load_active, what=what, attempts=settings.worker_load_attempts,
                                   backoff_s=settings.worker_load_backoff_s, cap_s=settings.worker_restart_max_s,
                                   state=state)
        if runner is None and not state.stop.is_set():
            runner = stay_down(load_active, what=what, state=state)
    finally:
        restore()
        reporter.signal_stop()
    reporter.join(10)  # its last write lands before the serving worker's status report writes the row
    return None if state.stop.is_set() else runner  # a stop asked for during a load that then succeeded


def run_worker(settings: Settings, *, variant: str, name: str | None = None, reconcile: bool = True,
               warm_s: float | None = None) -> None:
    """One worker process, until it is stopped; `warm_s`: how long its warm shutdown may take
    (default `procs.WORKER_WARM_S`), after which it exits on its own."""
    from workers.deliveries import HeldDeliveries
    from workers.status_row import claim_node_name
    from yue2_jobs.jobs import dead_workers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # "Found credentials in ..." on every start
    node = name or f"{variant}-{os.getpid()}@{socket.gethostname()}"
    _warn_if_host_local(settings)
    sessions = session_factory(settings.resolved_database_url)
    app = make_celery(settings)
    # One process per node name at a time (the launcher restarts a dead child under its name): what
    # an earlier holder of this name left is released now, before the model loads.
    with sessions() as session:
        claim_node_name(session, node, variant=variant)
        dead_workers.release(session, settings=settings, celery_app=app, worker=node)
    held = HeldDeliveries(settings.broker_url, node)
    held.connect()
    runtime = WorkerRuntime()
    try:
        runner = load_first_runner(settings, sessions, variant=variant, node=node, runtime=runtime)
        if runner is not None:  # else stopped while it could not load: nothing was consumed
            _serve(settings, runner, app=app, sessions=sessions, node=node, held=held, runtime=runtime,
                   reconcile=reconcile, warm_s=WORKER_WARM_S if warm_s is None else warm_s)
    finally:
        _stop(runtime, sessions=sessions, node=node, held=held)


def _serve(settings: Settings, runner: Runner, *, app: Celery, sessions: sessionmaker[Session], node: str,
           held: HeldDeliveries, runtime: WorkerRuntime, reconcile: bool, warm_s: float) -> None:
    """Consume until Celery's warm shutdown is done (SIGTERM, SIGINT, `celery control shutdown`)."""
    from workers.context import WorkerContext
    from workers.control import drain_on_shutdown, install_swap_commands, take_nothing_while_busy, write_when_ready
    from workers.duties import add_duties
    from workers.tasks import register

    variant = runner.variant
    load = None
    if variant != FONTS_VARIANT:
        directory_for = version_directories(settings, variant)

        def load(version: str) -> Runner:
            return load_version(settings, variant, directory_for, version)

    storage = storage_from_url(settings.resolved_storage_url, endpoint_url=settings.s3_endpoint_url,
                               region=settings.s3_region)
    ctx = WorkerContext(settings=settings, sessions=sessions, storage=storage, runner=runner, name=node,
                        runtime=runtime, load=load)
    _announce(ctx)
    _record_placement(ctx)
    ctx.requeue = lambda job_ids: _requeue(ctx, app, job_ids)
    register(app, lambda: ctx, settings)
    install_swap_commands(lambda: ctx.swap)
    drain_on_shutdown(ctx.draining)
    runtime.loop("warm-shutdown-bound", lambda stopping: bound_warm_shutdown(ctx.draining, stopping, warm_s))
    if settings.worker_ready_file is not None:
        write_when_ready(settings.worker_ready_file, node)
    add_duties(ctx, app=app, held=held, reconcile=reconcile)
    runtime.start()
    # The threads pool, not solo: a micro-batch runs in the pool's thread, and the main thread's
    # event loop keeps sending heartbeats and answering inspect and the swap commands (a busy solo
    # worker did neither, and Flower showed it Offline). --concurrency 1: one micro-batch at a
    # time, and the prefetch window is multiplier x concurrency.
    take_nothing_while_busy(app)
    app.worker_main(["worker", "--pool", "threads", "--concurrency", "1", "--queues", queue_for(variant),
                     "--hostname", node, "--loglevel", "INFO", "--without-gossip", "--without-mingle",
                     "--task-events"])


def _requeue(ctx: WorkerContext, app: Celery, job_ids: list[str]) -> None:
    """Put jobs a stopping micro-batch did not start back on the queue (before its ack drops their
    messages); if that fails they stay queued and the reconciler republishes them."""
    from yue2_jobs.queue import publish

    try:
        with ctx.sessions() as session:
            sent = publish(app, session, [(j, ctx.runner.variant) for j in job_ids], chunk=ctx.settings.batch_max_jobs)
        log.info("stopping: %d jobs not started here are back on the queue", sent)
    except Exception as exc:  # the broker or the database away: the reconciler's grace, then republished
        log.warning("stopping: %d jobs not started here are left for the reconciler (%s: %s)", len(job_ids),
                    type(exc).__name__, exc)


def bound_warm_shutdown(draining: threading.Event, stopped: threading.Event, warm_s: float) -> None:
    """Once a warm shutdown has begun (`draining`), exit `warm_s` later unless the worker has
    stopped by then (a worker whose launcher is gone, or a `--child` run alone, has no one else to
    bound it). Nothing is lost: the claims it holds lapse and the reconciler reruns those jobs. A
    runtime duty from the start: Celery's signal handler only sets `draining`."""
    while not draining.wait(1.0):  # woken within a second of either: a stop without a drain ends it too
        if stopped.is_set():
            return
    if not stopped.wait(warm_s):
        # Straight to stderr, not through logging: a handler's lock held elsewhere must not hold the exit.
        os.write(2, f"yue2-worker: the warm shutdown has not ended {warm_s:.0f}s after it began: exiting now; the "
                    f"jobs in hand run again once their leases lapse\n".encode())
        os._exit(75)  # EX_TEMPFAIL


def _stop(runtime: WorkerRuntime, *, sessions: sessionmaker[Session], node: str, held: HeldDeliveries) -> None:
    """The end of every worker process, however it ends: its duties and pools stopped (within
    RUNTIME_STOP_S), its status row withdrawn, its set of held deliveries cleared (a warm shutdown
    put back every message it had not acknowledged)."""
    from workers.status_row import withdraw

    runtime.stop(RUNTIME_STOP_S)
    try:
        with sessions() as session:
            withdraw(session, name=node)
        held.clear()
    except Exception:  # the row goes stale on its own (capacity.LIVE_WITHIN_S), then is reaped
        log.exception("could not withdraw this worker's status row")


def _announce(ctx: WorkerContext) -> None:
    """The ready log line (with the CUDA graph capture or the compiled CPU step) and the metrics endpoint."""
    runner, settings = ctx.runner, ctx.settings
    compile_s = getattr(runner, "compile_s", None)
    device = getattr(getattr(runner, "session", None), "device", None)
    step = f", compiled CPU step ready in {compile_s:.1f}s" if compile_s is not None else (
        ", eager CPU step" if getattr(device, "type", None) == "cpu" else "")
    log.info("worker %s serving %s on queue %s (%s batching, CPUs %s, %d CUDA graphs captured in %.1fs%s)",
             ctx.name, runner.checkpoint, queue_for(runner.variant), settings.batching,
             sorted(os.sched_getaffinity(0)), getattr(runner, "graph_count", 0),
             getattr(runner, "graph_capture_s", 0.0), step)
    ctx.metrics.checkpoint_event("load", runner.checkpoint)
    ctx.metrics.runner_loaded(runner)
    if settings.metrics_port:
        ctx.runtime.add(MetricsServer(ctx.metrics.registry, port=settings.metrics_port, host=settings.metrics_host))
        log.info("metrics on %s:%d/metrics", settings.metrics_host, settings.metrics_port)


def _record_placement(ctx: WorkerContext) -> None:
    """Where this process runs, for the A/B report's latency verdict (every worker, font workers
    too: one row each, and a report never meets a worker it cannot place for want of a kind)."""
    from workers.status_row import record_placement

    try:
        with ctx.sessions() as session:
            record_placement(session, name=ctx.name, runner=ctx.runner)
    except Exception as exc:  # serve anyway: without the record a report only withholds its latency verdict
        log.warning("could not record this worker's placement (%s: %s); A/B reports will not compare the "
                    "latencies of jobs it runs", type(exc).__name__, exc)


def _warn_if_host_local(settings: Settings) -> None:
    """On Redis a worker may be one of several hosts; a directory is only this host's."""
    if settings.broker_url.startswith("filesystem"):
        return  # the embedded mode: one host by design
    for what, url in (("YUE2_STORAGE_URL (job outputs)", settings.resolved_storage_url),
                      ("YUE2_CHECKPOINT_STORE_URL (published versions)", settings.resolved_checkpoint_store_url)):
        if url.startswith("file:"):
            log.warning("%s is a directory on this host (%s): the API and workers on other hosts cannot read "
                        "it; use s3:// when the pipeline runs on more than one host", what, url)
