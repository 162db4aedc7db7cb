"""Which variants have a live worker: a batch for one that has none would sit `in_progress` silently.

A worker's row in `worker_processes` is refreshed every few seconds by a thread that runs even
while it decodes, so a row older than LIVE_WITHIN_S means the worker is gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from yue2_jobs.db.models import WorkerProcess
from yue2_jobs.db.session import utcnow

LIVE_WITHIN_S = 30.0  # a worker whose last status report is older is taken for gone
STARTING = "starting"  # a worker row's version (`<variant>@starting`) from its start until its model has loaded


def live_variants(session: Session, *, within_s: float = LIVE_WITHIN_S) -> set[str]:
    since = utcnow() - timedelta(seconds=within_s)
    return set(session.execute(select(WorkerProcess.variant).where(WorkerProcess.heartbeat_at >= since)
                               .distinct()).scalars())


def unserved(session: Session, variants: Iterable[str]) -> list[str]:
    """The ones of `variants` no live worker serves, sorted."""
    wanted = set(variants)
    return sorted(wanted - live_variants(session)) if wanted else []


def no_worker_warnings(session: Session, variants: Iterable[str]) -> list[str]:
    """What a submit answers under `warnings` when its jobs have no worker to run them yet."""
    return [f"no live worker serves variant {v!r}: its jobs stay queued until one starts" for v in
            unserved(session, variants)]
