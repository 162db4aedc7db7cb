"""Claiming jobs for a micro-batch, through a database outage, and waiting on its recordings."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from workers.context import WorkerContext
from yue2_jobs.core.retry import retrying
from yue2_jobs.db.models import Job
from yue2_jobs.jobs.state import claim_jobs

log = logging.getLogger(__name__)


def wait_all(pending: list[Future[None]]) -> None:
    try:
        for future in pending:
            future.result()
    finally:
        pending.clear()


def in_db(ctx: WorkerContext, session: Session, what: str, fn: Any) -> Any:
    """`fn()` on `session`, retried through a database outage (the session is rolled back between tries)."""
    return retrying(fn, deadline=time.monotonic() + ctx.settings.outage_retry_s, what=what,
                    on_retry=session.rollback)


def claim_group(ctx: WorkerContext, session: Session, group: list[str], batch_ids: set[str], claimed: set[str]
                ) -> list[Any]:
    """Claim `group` (the rows this worker may now run); their batches join `batch_ids`, their ids `claimed`."""
    s = ctx.settings

    def once() -> tuple[list[Any], list[str]]:
        return claim_jobs(session, job_ids=group, worker=ctx.name, lease_s=s.lease_s, max_attempts=s.max_attempts)

    rows, exhausted = in_db(ctx, session, f"claiming {len(group)} jobs", once)
    if exhausted:
        log.warning("failed after %d attempts: %s", s.max_attempts, exhausted)
        batch_ids.update(session.execute(select(Job.batch_id).where(Job.id.in_(exhausted))).scalars())
    ctx.hold(rows)
    claimed.update(r.id for r in rows)
    batch_ids.update(r.batch_id for r in rows)
    return rows
