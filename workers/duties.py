"""The duties a serving worker runs beside its decoding, declared on its runtime (`workers.runtime`).

Each line of `add_duties` is one duty: its name (the thread's), its interval and its failure
policy. `quiet` names the outages a duty outlives with one log line a tick (the database, Redis,
the store away); anything else logs its traceback. Every duty runs again at its next tick.

| duty | every | what |
|---|---|---|
| lease-heartbeat | lease_s / 3 | renews the claims of the jobs in hand, so a long batch keeps them |
| status-report | 1 s (5 s write) | writes the status row; starts a swap the watchdog asks for |
| metrics-sampler | 5 s | broker queue depth, GPU memory, the `auto` chooser's table |
| held-deliveries | 5 s | drops acknowledged delivery tags from this worker's set |
| reconciler | reconcile_interval_s | one process in the deployment (an advisory lock) |
| broker-watch | 1 s | a wiped Redis: reconcile now (the lock holder, Redis brokers only) |
| upload-sweep | upload_sweep_interval_s | abandoned multipart uploads (the lock holder) |
| webhooks | webhook_poll_s | due webhook deliveries |
"""

from __future__ import annotations

import logging
import threading
import time

from celery import Celery
from redis.exceptions import RedisError
from sqlalchemy.exc import OperationalError

from workers.context import WorkerContext
from workers.deliveries import HeldDeliveries
from workers.status_row import report, swap_request
from yue2_jobs.jobs.reconciler import reconcile_once, reconciler_lock, sweep_abandoned_uploads
from yue2_jobs.jobs.state import renew_leases
from yue2_jobs.queue import broker_epoch, queue_depth
from yue2_jobs.storage import Storage, storage_from_url
from yue2_jobs.webhooks.delivery import deliver_due

log = logging.getLogger("yue2.worker")
REPORT_INTERVAL_S = 5.0  # a worker's row in worker_processes is at most this old (a swap reports at once)
SWAP_POLL_S = 1.0  # how often the status report looks for the watchdog's swap request
BROKER_WATCH_S = 1.0  # how often the reconciling worker checks that Redis still holds its epoch key
SAMPLE_S = 5.0
OUTAGES = (OperationalError, RedisError, OSError)  # what a duty outlives with one line a tick


def add_duties(ctx: WorkerContext, *, app: Celery, held: HeldDeliveries, reconcile: bool) -> None:
    """Declare every duty of a serving worker on `ctx.runtime` (started by the caller)."""
    rt, s = ctx.runtime, ctx.settings
    rt.every("lease-heartbeat", s.lease_s / 3, lambda: heartbeat(ctx), quiet=OUTAGES)
    rt.loop("status-report", lambda stopping: status_report(ctx, stopping), wake=ctx.report_now)
    rt.every("metrics-sampler", SAMPLE_S, lambda: sample(ctx), quiet=OUTAGES)
    rt.every("held-deliveries", REPORT_INTERVAL_S, held.prune, quiet=OUTAGES)  # drops the acknowledged ones
    if reconcile:
        Housekeeping(ctx, app=app).add_to(ctx)


def heartbeat(ctx: WorkerContext) -> None:
    with ctx.lock:
        claims = dict(ctx.claims)
    with ctx.sessions() as session:
        renew_leases(session, claims=claims, lease_s=ctx.settings.lease_s)


def sample(ctx: WorkerContext) -> None:
    variant = ctx.runner.variant
    ctx.metrics.queue_depth.labels(ctx.name, "broker").set(queue_depth(ctx.settings, variant))
    ctx.metrics.sample_gpu()
    ctx.metrics.sample_modes(ctx.runner)


def status_report(ctx: WorkerContext, stopping: threading.Event) -> None:
    """Until `stopping`: write this worker's status row every REPORT_INTERVAL_S (at once after a
    swap's transition: `ctx.report_now`), look for the watchdog's swap request every SWAP_POLL_S,
    and start the swap it asks for. Runs while the pool's thread decodes."""
    last_report = 0.0
    while not stopping.is_set():
        write = ctx.report_now.is_set() or time.monotonic() - last_report >= REPORT_INTERVAL_S
        try:
            status_round(ctx, write=write)
        except OUTAGES as exc:  # the database away: the row goes stale, as a dead worker's would
            log.warning("could not report this worker's status: %s: %s", type(exc).__name__, exc)
        except Exception:
            log.exception("could not report this worker's status")
        else:
            last_report = time.monotonic() if write else last_report
        if not stopping.is_set():  # a stop's wake-up may have been cleared by the round just done
            ctx.report_now.wait(SWAP_POLL_S)


def status_round(ctx: WorkerContext, *, write: bool) -> None:
    """One round of the status report: the row written (`write`) or only its swap request read;
    then the swap it asks for requested (a no-op when served, loading or failed)."""
    with ctx.sessions() as session:
        if write:
            ctx.report_now.clear()
            request = report(session, name=ctx.name, runner=ctx.runner, swap=ctx.swap.status())
        else:
            request = swap_request(session, name=ctx.name)
    if request:
        ctx.swap.request(variant=ctx.runner.variant, version=request)


class Housekeeping:
    """The reconciler, the broker watch and the upload sweep (run by the one worker that holds the
    reconciler's lock) and the webhook sender."""

    def __init__(self, ctx: WorkerContext, *, app: Celery) -> None:
        settings, storage = ctx.settings, ctx.storage
        self.settings, self.ctx, self.storage, self.app = settings, ctx, storage, app
        self.lock = reconciler_lock(settings.resolved_database_url, node=ctx.name)
        self.last_pass: float | None = None  # when this process's last pass went through
        self.one_pass = threading.Lock()  # the timer's passes and the broker watch's, one at a time
        self.stores: dict[str, Storage] = {"outputs": storage}
        if settings.resolved_checkpoint_store_url != settings.resolved_storage_url:
            self.stores["checkpoint store"] = storage_from_url(
                settings.resolved_checkpoint_store_url, endpoint_url=settings.s3_endpoint_url,
                region=settings.s3_region)

    def add_to(self, ctx: WorkerContext) -> None:
        rt, s = ctx.runtime, self.settings
        rt.every("reconciler", s.reconcile_interval_s, self.reconcile, quiet=OUTAGES)
        if s.broker_url.startswith("redis"):
            rt.every("broker-watch", BROKER_WATCH_S, self.watch_broker, quiet=OUTAGES)
        rt.every("upload-sweep", s.upload_sweep_interval_s, self.sweep, quiet=OUTAGES)
        rt.every("webhooks", s.webhook_poll_s, self._deliver, quiet=OUTAGES)

    def reconcile(self) -> None:
        with self.one_pass:
            if not self.lock.held():
                self.last_pass = None
                return
            # Silent workers are reaped only when this process reached the database on its previous
            # pass too: after an outage (or on taking over the lock) every status row may be stale,
            # and live workers report within seconds.
            reap = self.last_pass is not None and \
                time.monotonic() - self.last_pass < 3 * self.settings.reconcile_interval_s
            with self.ctx.sessions() as session:
                reconcile_once(session, settings=self.settings, celery_app=self.app, storage=self.storage,
                               reap_dead=reap, locked=True)
            self.last_pass = time.monotonic()

    def watch_broker(self) -> None:
        # A wiped or replaced Redis lost its messages: a pass now republishes them (and recreates the
        # epoch key), rather than at the next timed pass and after the grace or a lease.
        try:
            gone = broker_epoch(self.settings, create=False) is None
        except RedisError:  # Redis down: the reconciler's own passes say so, not a line a second
            return
        if gone and self.lock.held():  # one process reconciles; the others would only repeat the warning
            log.warning("the broker's epoch key is gone (Redis flushed or replaced): reconciling now")
            self.reconcile()

    def sweep(self) -> None:
        if self.lock.held():  # one process in the deployment
            sweep_abandoned_uploads(self.stores, settings=self.settings)

    def _deliver(self) -> None:
        deliver_due(self.ctx.sessions, settings=self.settings)
