"""`yue2-worker --child`: one Celery worker process holding one variant's model.

Celery's threads pool, one thread, runs the micro-batches (a prefork pool breaks CUDA, celery#3402),
so the main thread stays free to send heartbeats and answer remote control mid-batch. Two daemon
threads run beside it: the lease heartbeat, which keeps this worker's claims alive while a long
batch runs, and the reconciler (one at a time across workers, by an advisory lock).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from workers.deliveries import HeldDeliveries
from workers.protocol import Runner
from yue2_jobs.core.config import Settings
from yue2_jobs.db.session import session_factory
from yue2_jobs.errors import CheckpointError
from yue2_jobs.fonts.params import FONTS_VARIANT
from yue2_jobs.jobs import dead_workers
from yue2_jobs.jobs.reconciler import reconcile_once, reconciler_lock, sweep_abandoned_uploads
from yue2_jobs.jobs.state import renew_leases
from yue2_jobs.queue import broker_epoch, make_celery, queue_depth, queue_for
from yue2_jobs.storage import storage_from_url
from yue2_jobs.webhooks.delivery import deliver_due

log = logging.getLogger("yue2.worker")
REPORT_INTERVAL_S = 5.0  # a worker's row in worker_processes is at most this old (a swap reports at once)
SWAP_POLL_S = 1.0  # how often the report thread looks for the watchdog's swap request
BROKER_WATCH_S = 1.0  # how often the reconciling worker checks that Redis still holds its epoch key


def load_runner(settings: Settings, variant: str, directory: Path | None = None) -> Runner:
    if variant == FONTS_VARIANT:  # render jobs: the CPU font runner, no checkpoint
        from workers.font_runner import FontRunner

        return FontRunner(variant=variant, settings=settings)
    module, _, factory = settings.runner.partition(":")
    return getattr(importlib.import_module(module), factory)(variant=variant, settings=settings, directory=directory)


def version_directories(settings: Settings, variant: str) -> Any:
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


def active_version(sessions: Any, variant: str) -> str | None:
    """The registry's active version of `variant` (None: serve the configured starting directory)."""
    from yue2_jobs.checkpoints import registry

    with sessions() as session:
        row = registry.active(session, variant)
    return row.version if row is not None else None


def load_first_runner(settings: Settings, sessions: Any, *, variant: str, node: str) -> Runner | None:
    """The runner this worker starts with: the active version (else the starting directory), loaded
    with backoff; when every attempt fails the worker stays down (`workers/loading.py`) until the
    active version changes. None: asked to stop before anything loaded."""
    from workers.loading import LoadState, keep_reporting, load_with_backoff, stay_down, stop_on_signals

    if variant == FONTS_VARIANT:  # nothing to fetch or fail: render jobs need no checkpoint
        return load_runner(settings, variant)
    directory_for = version_directories(settings, variant)

    def load_active() -> tuple[str | None, Any]:
        version = active_version(sessions, variant)

        def load() -> Runner:
            if version is None:
                return load_runner(settings, variant)
            directory = directory_for(version)
            try:
                return load_runner(settings, variant, directory)
            except CheckpointError:
                if directory != Path(settings.checkpoints[variant]):
                    raise
                # the starting directory names this version but its files are not it: the store's copy
                return load_runner(settings, variant, directory_for(version, local=False))

        return version, load

    state, loaded = LoadState(), threading.Event()
    restore = stop_on_signals(state)
    reporter = keep_reporting(sessions, name=node, variant=variant, state=state, interval_s=REPORT_INTERVAL_S,
                              until=loaded)
    what = f"variant {variant!r}"
    try:
        runner = load_with_backoff(load_active, what=what, attempts=settings.worker_load_attempts,
                                   backoff_s=settings.worker_load_backoff_s, cap_s=settings.worker_restart_max_s,
                                   state=state)
        if runner is None and not state.stop.is_set():
            runner = stay_down(load_active, what=what, state=state)
    finally:
        loaded.set()
        restore()
    reporter.join(timeout=10)  # its last write lands before the serving worker's report thread writes the row
    return None if state.stop.is_set() else runner  # a stop asked for during a load that then succeeded


def _every(interval_s: float, stop: threading.Event, fn: Any, what: str) -> threading.Thread:
    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                fn()
            except Exception:
                log.exception("%s failed; retrying in %.1fs", what, interval_s)

    thread = threading.Thread(target=loop, name=what, daemon=True)
    thread.start()
    return thread


def _housekeeping(settings: Settings, *, node: str, sessions: Any, storage: Any, app: Any,
                  stop: threading.Event) -> None:
    """The reconciler and the upload sweep (run by the one worker that holds the reconciler's lock)
    and the webhook sender, each a thread."""
    last_pass: list[float] = []  # when this process's last pass went through
    lock = reconciler_lock(settings.resolved_database_url, node=node)
    one_pass = threading.Lock()  # the timer's passes and the broker watch's, one at a time

    def reconcile() -> None:
        with one_pass:
            reconcile_pass()

    def reconcile_pass() -> None:
        if not lock.held():
            last_pass.clear()
            return
        # Silent workers are reaped only when this process reached the database on its previous pass
        # too: after an outage (or on taking over the lock) every status row may be stale, and live
        # workers report within seconds.
        reap = bool(last_pass) and time.monotonic() - last_pass[-1] < 3 * settings.reconcile_interval_s
        with sessions() as session:
            reconcile_once(session, settings=settings, celery_app=app, storage=storage, reap_dead=reap, locked=True)
        last_pass[:] = [time.monotonic()]

    _every(settings.reconcile_interval_s, stop, reconcile, "reconciler")

    def watch_broker() -> None:
        # A wiped or replaced Redis lost its messages: a pass now republishes them (and recreates the
        # epoch key), rather than at the next timed pass and after the grace or a lease.
        try:
            gone = broker_epoch(settings, create=False) is None
        except RedisError:  # Redis down: the reconciler's own passes say so, not a traceback a second
            return
        if gone and lock.held():  # one process reconciles; the others would only repeat the warning
            log.warning("the broker's epoch key is gone (Redis flushed or replaced): reconciling now")
            reconcile()

    if settings.broker_url.startswith("redis"):
        _every(BROKER_WATCH_S, stop, watch_broker, "broker-watch")
    stores = {"outputs": storage}
    if settings.resolved_checkpoint_store_url != settings.resolved_storage_url:
        stores["checkpoint store"] = storage_from_url(settings.resolved_checkpoint_store_url,
                                                      endpoint_url=settings.s3_endpoint_url, region=settings.s3_region)

    def sweep() -> None:
        if lock.held():  # one process in the deployment
            sweep_abandoned_uploads(stores, settings=settings)

    _every(settings.upload_sweep_interval_s, stop, sweep, "upload-sweep")
    _every(settings.webhook_poll_s, stop, lambda: deliver_due(sessions, settings=settings), "webhooks")


def _announce(ctx: Any, settings: Settings, *, variant: str) -> None:
    """The ready log line (with the CUDA graph capture) and the metrics endpoint."""
    runner = ctx.runner
    log.info("worker %s serving %s on queue %s (%s batching, CPUs %s, %d CUDA graphs captured in %.1fs)", ctx.name,
             runner.checkpoint, queue_for(variant), settings.batching, sorted(os.sched_getaffinity(0)),
             getattr(runner, "graph_count", 0), getattr(runner, "graph_capture_s", 0.0))
    assert ctx.metrics is not None
    ctx.metrics.checkpoint_event("load", runner.checkpoint)
    ctx.metrics.runner_loaded(runner)
    if settings.metrics_port:
        ctx.metrics.serve(settings.metrics_port, host=settings.metrics_host)
        log.info("metrics on %s:%d/metrics", settings.metrics_host, settings.metrics_port)


def _warn_if_host_local(settings: Settings) -> None:
    """On Redis a worker may be one of several hosts; a directory is only this host's."""
    if settings.broker_url.startswith("filesystem"):
        return  # the embedded mode: one host by design
    for what, url in (("YUE2_STORAGE_URL (job outputs)", settings.resolved_storage_url),
                      ("YUE2_CHECKPOINT_STORE_URL (published versions)", settings.resolved_checkpoint_store_url)):
        if url.startswith("file:"):
            log.warning("%s is a directory on this host (%s): the API and workers on other hosts cannot read "
                        "it; use s3:// when the pipeline runs on more than one host", what, url)


def _take_nothing_while_busy(app: Any) -> None:
    """While a micro-batch runs (in the pool's thread), the consumer takes no message off the queue,
    as when the batch ran in the main thread: the backlog waits for whichever worker is free, not
    behind this one's batch. An idle worker still takes up to its prefetch window."""
    from celery import bootsteps
    from celery.signals import task_postrun, task_prerun
    from celery.worker.consumer.tasks import Tasks

    from yue2_jobs.queue import TASK_NAME

    busy = threading.Event()

    @task_prerun.connect(weak=False)
    def _started(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == TASK_NAME:
            busy.set()

    @task_postrun.connect(weak=False)
    def _ended(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == TASK_NAME:
            busy.clear()

    class TakeNothingWhileBusy(bootsteps.StartStopStep):
        requires = (Tasks,)  # after the task consumer (re)starts on a (new) connection

        def start(self, c: Any) -> None:
            qos = c.task_consumer.channel.qos  # as Celery's worker_disable_prefetch does
            can_consume = qos.can_consume
            qos.can_consume = lambda: not busy.is_set() and can_consume()

    app.steps["consumer"].add(TakeNothingWhileBusy)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def claim_node_name(session: Any, node: str, *, variant: str) -> None:
    """Take `node` for this process: its row in `worker_processes` gets our pid now, before the model
    loads, so a namesake starting at the same moment (a cloned host booting beside this one) finds
    it taken. Exits if a live process already serves it: releasing its claims would rerun its jobs
    under its feet. Taking the row is a compare-and-set, so of two starters one wins."""
    from sqlalchemy import update
    from sqlalchemy.exc import IntegrityError

    from yue2_jobs.core.procs import pid_space
    from yue2_jobs.db.models import WorkerProcess
    from yue2_jobs.db.session import affected, utcnow
    from yue2_jobs.jobs.capacity import STARTING

    for _ in range(3):
        row = session.get(WorkerProcess, node, populate_existing=True)
        if row is not None:
            _refuse_if_live(row, node)
        mine = dict(variant=variant, checkpoint=f"{variant}@{STARTING}", weights_sha256=None, pid=os.getpid(),
                    pid_space=pid_space(), swap_version=None, swap_state=None, swap_error=None, swap_request=None,
                    load_error=None, heartbeat_at=utcnow())
        if row is None:
            session.add(WorkerProcess(name=node, **mine))
            try:
                session.commit()
                return
            except IntegrityError:  # another process inserted it first: look again
                session.rollback()
                continue
        took = affected(session.execute(update(WorkerProcess).where(
            WorkerProcess.name == node, WorkerProcess.pid == row.pid,
            WorkerProcess.pid_space.is_not_distinct_from(row.pid_space),
            WorkerProcess.heartbeat_at == row.heartbeat_at).values(**mine)))
        session.commit()
        if took:
            return
    raise SystemExit(f"worker node name {node!r} keeps being taken by another process starting under it")


def _refuse_if_live(row: Any, node: str) -> None:
    """Exit if the process of `row` lives. On this host (its pid is in our process table) the pid
    tells; a row another host wrote (two hosts with one hostname, e.g. cloned images) is live while
    it reports."""
    from yue2_jobs.core.procs import pid_space
    from yue2_jobs.db.session import as_utc, utcnow
    from yue2_jobs.jobs.capacity import LIVE_WITHIN_S

    if row.pid_space in (None, pid_space()):  # this host's (None: written before pid spaces were kept)
        if row.pid == os.getpid() or not _alive(row.pid):
            return  # gone: the launcher restarted this name, and what it left is released next
        raise SystemExit(f"worker node name {node!r} is already served by the live process {row.pid}; give each "
                         f"launcher on this host its own --host")
    age = (utcnow() - as_utc(row.heartbeat_at)).total_seconds()
    if age > LIVE_WITHIN_S:
        return  # its host went away; what it left is released next
    raise SystemExit(f"worker node name {node!r} is in use by a worker on another host (pid {row.pid} there, "
                     f"reported {age:.0f}s ago): node names must be unique across hosts; give this host its "
                     f"own hostname, or its launcher --host. (If this host itself restarted within the last "
                     f"{LIVE_WITHIN_S:.0f}s, the name is free once that report is {LIVE_WITHIN_S:.0f}s old.)")


def _report_loop(ctx: Any, *, sessions: Any, variant: str, directory_for: Any, stop: threading.Event) -> None:
    """The status-report thread: runs while the main thread decodes, writes this worker's status row
    and starts a swap the watchdog asks for."""
    from workers.swap import report as report_status
    from workers.swap import start_swap, swap_request

    last_report = 0.0
    while not stop.is_set():
        try:
            with sessions() as session:
                if ctx.report_now.is_set() or time.monotonic() - last_report >= REPORT_INTERVAL_S:
                    ctx.report_now.clear()
                    request = report_status(session, ctx, name=ctx.name)
                    last_report = time.monotonic()
                else:
                    request = swap_request(session, name=ctx.name)
            if request and directory_for is not None:
                start_swap(ctx, variant=variant, version=request, directory_for=directory_for)
        except Exception:
            log.exception("could not report this worker's status")
        ctx.report_now.wait(SWAP_POLL_S)


def run_worker(settings: Settings, *, variant: str, name: str | None = None, reconcile: bool = True) -> None:
    from workers.context import WorkerContext
    from workers.swap import install as install_swap_commands
    from workers.swap import withdraw
    from workers.tasks import register

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # "Found credentials in ..." on every start
    node = name or f"{variant}-{os.getpid()}@{socket.gethostname()}"
    _warn_if_host_local(settings)
    sessions = session_factory(settings.resolved_database_url)
    storage = storage_from_url(settings.resolved_storage_url, endpoint_url=settings.s3_endpoint_url,
                               region=settings.s3_region)
    app = make_celery(settings)
    # One process per node name at a time (the launcher restarts a dead child under its name): what
    # an earlier holder of this name left is released now, before the model loads.
    with sessions() as session:
        claim_node_name(session, node, variant=variant)
        dead_workers.release(session, settings=settings, celery_app=app, worker=node)
    held = HeldDeliveries(settings.broker_url, node)
    held.connect()
    runner = load_first_runner(settings, sessions, variant=variant, node=node)
    if runner is None:  # stopped while it could not load: nothing was consumed
        with sessions() as session:
            withdraw(session, name=node)
        held.clear()
        return
    directory_for = None if variant == FONTS_VARIANT else version_directories(settings, variant)
    ctx = WorkerContext(settings=settings, sessions=sessions, storage=storage, runner=runner, name=node)
    _announce(ctx, settings, variant=variant)
    register(app, lambda: ctx, settings)
    install_swap_commands(lambda: ctx, directory_for=directory_for)

    stop = threading.Event()

    def heartbeat() -> None:
        with ctx.lock:
            claims = dict(ctx.claims)
        with sessions() as session:
            renew_leases(session, claims=claims, lease_s=settings.lease_s)

    def sample() -> None:
        assert ctx.metrics is not None
        ctx.metrics.queue_depth.labels(node, "broker").set(queue_depth(settings, variant))
        ctx.metrics.sample_gpu()
        ctx.metrics.sample_modes(ctx.runner)

    if settings.worker_ready_file is not None:
        from celery.signals import worker_ready

        ready_file = settings.worker_ready_file

        @worker_ready.connect(weak=False)
        def _ready(**_: Any) -> None:
            ready_file.write_text(node)

    _every(settings.lease_s / 3, stop, heartbeat, "lease-heartbeat")
    _every(5.0, stop, sample, "metrics-sampler")
    _every(REPORT_INTERVAL_S, stop, held.prune, "held-deliveries")  # drops the acknowledged ones
    threading.Thread(target=_report_loop, args=(ctx,), kwargs={"sessions": sessions, "variant": variant,
                     "directory_for": directory_for, "stop": stop}, name="status-report", daemon=True).start()
    if reconcile:
        _housekeeping(settings, node=node, sessions=sessions, storage=storage, app=app, stop=stop)
    try:
        # The threads pool, not solo: a micro-batch runs in the pool's thread, and the main thread's
        # event loop keeps sending heartbeats and answering inspect and the swap commands (a busy solo
        # worker did neither, and Flower showed it Offline). --concurrency 1: one micro-batch at a
        # time, and the prefetch window is multiplier x concurrency.
        _take_nothing_while_busy(app)
        app.worker_main(["worker", "--pool", "threads", "--concurrency", "1", "--queues", queue_for(variant),
                         "--hostname", node, "--loglevel", "INFO", "--without-gossip", "--without-mingle",
                         "--task-events"])
    finally:
        stop.set()
        try:
            with sessions() as session:
                withdraw(session, name=node)
            held.clear()  # a warm shutdown put back every message it had not acknowledged
        except Exception:  # the row goes stale on its own (capacity.LIVE_WITHIN_S), then is reaped
            log.exception("could not withdraw this worker's status row")
