"""Which variants have a live worker: a batch for one that has none would sit `in_progress` silently.

A worker's row in `worker_processes` is refreshed every few seconds by a thread that runs even
while it decodes, so a row older than LIVE_WITHIN_S means the worker is gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from yue2_jobs.db.models import Job, JobStatus, WorkerProcess
from yue2_jobs.db.session import utcnow

LIVE_WITHIN_S = 30.0  # a worker whose last status report is older is taken for gone
STARTING = "starting"  # a worker row's version (`<variant>@starting`) from its start until its model has loaded


def live_variants(session: Session, *, within_s: float = LIVE_WITHIN_S) -> set[str]:
    """Variants with a worker that reports and has not failed to load its checkpoint."""
    since = utcnow() - timedelta(seconds=within_s)
    return set(session.execute(select(WorkerProcess.variant).where(
        WorkerProcess.heartbeat_at >= since, WorkerProcess.load_error.is_(None)).distinct()).scalars())


def unserved(session: Session, variants: Iterable[str]) -> list[str]:
    """The ones of `variants` no live worker serves, sorted."""
    wanted = set(variants)
    return sorted(wanted - live_variants(session)) if wanted else []


def stalled(session: Session, missing: list[str], *, waiting_s: float) -> dict[str, dict[str, object]]:
    """Of `missing` (variants no live worker serves: `unserved`), those with jobs queued for over
    `waiting_s`: how many wait, and why each of their workers that reports is down (a checkpoint it
    cannot load). What /healthz calls degraded (the wait: workers that are starting are not an
    outage)."""
    if not missing:
        return {}
    since = utcnow() - timedelta(seconds=waiting_s)
    queued: dict[str, int] = {v: n for v, n in session.execute(select(Job.variant, func.count()).where(
        Job.status == JobStatus.QUEUED, Job.variant.in_(missing), Job.created_at <= since)
        .group_by(Job.variant)).all()}
    if not queued:
        return {}
    since = utcnow() - timedelta(seconds=LIVE_WITHIN_S)
    down = session.execute(select(WorkerProcess.variant, WorkerProcess.name, WorkerProcess.load_error).where(
        WorkerProcess.variant.in_(list(queued)), WorkerProcess.heartbeat_at >= since,
        WorkerProcess.load_error.is_not(None))).all()
    return {v: {"queued": n, "workers_down": {name: err for var, name, err in down if var == v}}
            for v, n in sorted(queued.items())}


def no_worker_warnings(session: Session, variants: Iterable[str]) -> list[str]:
    """What a submit answers under `warnings` when its jobs have no worker to run them yet."""
    return [f"no live worker serves variant {v!r}: its jobs stay queued until one starts" for v in
            unserved(session, variants)]
