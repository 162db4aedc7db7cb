"""`yue2 watchdog`: brings the workers to the registry's active versions.

Each pass, for every configured variant:

0. **seed**: the directory the variant starts from is registered as its first version
   (`registry.ensure_seed`), so a rollback after the first swap has somewhere to go;
1. **discover**: versions in the store whose manifest is complete (a half-uploaded one has none
   yet) and that the registry lacks are registered `staged`;
2. **validate** staged versions, oldest first, against the serving version (`validate.py`,
   `gates.py`); each that passes becomes active, each that fails stays `failed` with its reason
   (logged, in `yue2 checkpoints list`, and counted in the API's /metrics);
3. **converge**: every live worker of the variant (its row in `worker_processes`, which a thread
   of the worker refreshes even while it decodes) that serves another version is told to swap
   (`workers/swap.py`), one worker at a time, each confirmed by its row before the next. If a worker
   cannot load the version, it keeps serving the old one, the version is marked `failed` and the
   previous version is re-activated, so the next pass brings any swapped worker back.

`yue2 checkpoints activate` / `rollback` only change the registry: the next pass converges.
Several watchdogs (on several hosts, for availability) take turns by a Postgres advisory lock: one
runs the passes, the others stand by (`watchdog_lock`).
Passes run every `YUE2_WATCHDOG_INTERVAL_S` seconds; a local store is also watched with the
`watchdog` library (inotify), so a finished upload starts a pass at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from yue2_jobs.checkpoints import registry
from yue2_jobs.checkpoints.validate import validate_version
from yue2_jobs.db.leader import LeaderLock, lock_holder
from yue2_jobs.db.models import CheckpointState, CheckpointVersion, WorkerProcess
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import WorkerGoneError
from yue2_jobs.jobs.capacity import LIVE_WITHIN_S, STARTING
from yue2_jobs.model.checkpoint import manifest_version

log = logging.getLogger("yue2.watchdog")
LOCK_KEY = 0x59554533  # one watchdog at a time across hosts (next to the reconciler's 0x59554532)


def discover(session: Any, *, store: Any, store_url: str, variant: str) -> list[str]:
    found = []
    for version, manifest in registry.complete_versions(store, variant).items():
        if registry.find(session, variant=variant, version=version) is None:
            registry.register(session, variant=variant, version=version, sha=manifest_version(manifest)[1],
                              uri=store_url.rstrip("/") + "/" + registry.version_prefix(variant, version))
            found.append(version)
    return found


def live_workers(session: Any, variant: str, *, within_s: float = LIVE_WITHIN_S) -> list[WorkerProcess]:
    """Workers of `variant` whose status report is recent (their reporter thread runs while they
    decode) and that serve (a worker down for a checkpoint it cannot load retries by itself when
    the active version changes)."""
    since = utcnow() - timedelta(seconds=within_s)
    return list(session.execute(select(WorkerProcess).where(
        WorkerProcess.variant == variant, WorkerProcess.heartbeat_at >= since, WorkerProcess.load_error.is_(None))
        .order_by(WorkerProcess.name)).scalars())


def swap_worker(session: Any, app: Any, name: str, *, variant: str, version: str, timeout_s: float) -> str | None:
    """Ask one worker to serve `variant@version` and wait for its report. None when it serves
    it, else the reason it does not. The request is written into the worker's row, which its
    report thread polls every second even mid-batch; a remote-control message goes too, for a
    worker that answers it sooner."""
    want, deadline = f"{variant}@{version}", time.monotonic() + timeout_s
    session.execute(update(WorkerProcess).where(WorkerProcess.name == name).values(swap_request=version))
    session.commit()
    app.control.broadcast("yue2_swap", arguments={"variant": variant, "version": version}, destination=[name])
    while time.monotonic() < deadline:
        session.expire_all()
        since = utcnow() - timedelta(seconds=LIVE_WITHIN_S)
        row = session.execute(select(WorkerProcess).where(WorkerProcess.name == name,
                                                          WorkerProcess.heartbeat_at >= since)).scalar_one_or_none()
        if row is None:  # stopped or died: nothing to swap (a restart loads the active version)
            raise WorkerGoneError(f"{name} stopped reporting")
        if row.checkpoint == want:
            return None
        if row.swap_version == version and row.swap_state == "failed":
            return row.swap_error or "load failed"
        time.sleep(0.2)  # the worker reports a finished swap at once; poll its row
    return f"{name} did not serve {want} within {timeout_s:.0f}s"


def converge(session: Any, app: Any, *, variant: str, swap_timeout_s: float,
             still_leader: Callable[[], bool] = lambda: True) -> list[str]:
    """Swap the live workers of `variant` to its active version, one at a time; returns the swapped
    ones. Stops when `still_leader()` turns false: another watchdog has taken over."""
    target = registry.active(session, variant)
    if target is None:
        return []
    want = f"{variant}@{target.version}"
    swapped: list[str] = []
    for worker in live_workers(session, variant):
        if worker.checkpoint in (want, f"{variant}@{STARTING}"):  # a starting worker loads the active version
            continue
        if not still_leader():
            log.warning("lost the watchdog lock; the watchdog that holds it now converges the rest")
            return swapped
        name, t0 = worker.name, time.monotonic()
        try:
            error = swap_worker(session, app, name, variant=variant, version=target.version,
                                timeout_s=swap_timeout_s)
        except WorkerGoneError:
            log.warning("%s is gone; skipping it", name)
            continue
        if error is not None:
            log.error("%s could not load %s: %s; marking it failed and rolling back", name, want, error)
            registry.finish_validation(session, target, error=f"worker load failed on {name}: {error}")
            earlier = _previous(session, variant)
            if earlier is not None:
                registry.activate(session, earlier, how="load-failed rollback")
            return swapped
        log.info("%s now serves %s (%.1fs)", name, want, time.monotonic() - t0)
        swapped.append(name)
    return swapped


def _previous(session: Any, variant: str) -> CheckpointVersion | None:
    return session.execute(select(CheckpointVersion).where(
        CheckpointVersion.variant == variant, CheckpointVersion.state == CheckpointState.RETIRED)
        .order_by(CheckpointVersion.activated_at.desc()).limit(1)).scalar_one_or_none()


def run_pass(settings: Any, sessions: Any, store: Any, app: Any,
             still_leader: Callable[[], bool] = lambda: True) -> dict[str, Any]:
    """One pass over every variant; returns what it did."""
    done: dict[str, Any] = {}
    for variant in settings.checkpoints:
        with sessions() as session:
            registry.ensure_seed(session, store=store, store_url=settings.resolved_checkpoint_store_url,
                                 variant=variant, directory=Path(settings.checkpoints[variant]))
            found = discover(session, store=store, store_url=settings.resolved_checkpoint_store_url, variant=variant)
            staged = session.execute(select(CheckpointVersion).where(
                CheckpointVersion.variant == variant, CheckpointVersion.state == CheckpointState.STAGED)
                .order_by(CheckpointVersion.created_at)).scalars().all()
            activated = []
            t_validate = time.monotonic()
            for row in staged:
                if validate_version(session, row, store=store, settings=settings):
                    registry.activate(session, row)
                    activated.append(row.version)
                    log.info("%s@%s passed validation: %s", variant, row.version, row.report)
                else:
                    current = registry.active(session, variant)
                    log.warning("%s@%s failed validation, %s keeps serving: %s", variant, row.version,
                                f"{variant}@{current.version}" if current else "the starting checkpoint", row.error)
            t_converge = time.monotonic()
            swapped = converge(session, app, variant=variant, swap_timeout_s=settings.watchdog_swap_timeout_s,
                               still_leader=still_leader)
            t_end = time.monotonic()
        if found or activated or swapped:
            done[variant] = {"discovered": found, "activated": activated, "swapped": swapped,
                             "validate_s": round(t_converge - t_validate, 2),
                             "converge_s": round(t_end - t_converge, 2)}
            log.info("%s: %s", variant, done[variant])
    return done


def run(settings: Any, *, once: bool = False) -> None:
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.queue import make_celery
    from yue2_jobs.storage import storage_from_url

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sessions = session_factory(settings.resolved_database_url)
    store = storage_from_url(settings.resolved_checkpoint_store_url, endpoint_url=settings.s3_endpoint_url,
                             region=settings.s3_region)
    app = make_celery(settings)
    app.conf.broker_pool_limit = 8
    wake = threading.Event()
    observer = _watch_local_store(settings.resolved_checkpoint_store_url, wake)
    lock = watchdog_lock(settings.resolved_database_url)
    standing_by = False
    try:
        while True:
            if lock.held():
                standing_by = False
                run_pass(settings, sessions, store, app, still_leader=lock.held)
            elif not standing_by or once:  # said once per stretch of standing by
                standing_by = True
                with sessions() as session:
                    log.info("standing by: the watchdog %s runs the passes", watchdog_holder(session))
            if once:
                return
            wake.wait(settings.watchdog_interval_s)
            wake.clear()
    finally:
        lock.release()
        if observer is not None:
            observer.stop()


def watchdog_lock(database_url: str) -> LeaderLock:
    """One watchdog runs passes at a time, on whichever host: two would ask workers for swaps at once.
    A second one stands by and takes over when the first dies or its host is cut off."""
    import os
    import socket

    return LeaderLock(database_url, key=LOCK_KEY, role="watchdog", node=f"{os.getpid()}@{socket.gethostname()}")


def watchdog_holder(session: Any) -> str | None:
    return lock_holder(session, key=LOCK_KEY, role="watchdog")


def _watch_local_store(url: str, wake: threading.Event) -> Any:
    """inotify on a file:// store: a manifest landing wakes the loop (S3 is polled)."""
    if not url.startswith("file://"):
        return None
    from urllib.parse import unquote, urlparse

    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    root = Path(unquote(urlparse(url).path))
    root.mkdir(parents=True, exist_ok=True)

    class OnManifest(FileSystemEventHandler):
        def on_any_event(self, event: Any) -> None:
            path = str(getattr(event, "dest_path", "") or event.src_path)
            if path.endswith("manifest.json"):
                wake.set()

    observer = Observer()
    observer.schedule(OnManifest(), str(root), recursive=True)
    observer.start()
    return observer
