"""Fair share between tenants: one tenant's big batch does not hold up another's job.

The broker keeps one queue per variant, first in first out, and a batch is published all at once:
tenant B's single job, sent while tenant A's 20,000 lines wait, would sit behind all of them. So
the order in which a worker runs work is decided here, from Postgres (the record), not by the
broker's order:

1. **Within a micro-batch** the jobs a worker was handed are started round-robin over their
   tenants (`interleave`), not in message order.
2. **Across the queue**, a worker busy with a micro-batch looks in Postgres every
   `fair_share_poll_s` for tenants it is not serving that have jobs of its variant `queued` and
   fewer than `fair_share_rows` running anywhere (`jobs_to_share`). It claims their oldest queued
   jobs (the tenants waiting longest first, one job each per round) and starts them before the rest
   of its micro-batch, while it holds fewer than `fair_share_rows` such jobs: so other tenants
   get up to that many of its rows, and its own micro-batch keeps the rest (however many tenants
   wait, a micro-batch ends). The stolen jobs' messages are still in the broker; whoever receives
   them later finds the jobs claimed or done and skips them (a job runs only for the worker that
   claims it, `state.claim_jobs`).

So a tenant with nothing running gets a row of a busy worker within a poll and the rows ahead of
it, whatever waits in the broker ahead of it; a big batch alone still runs in full micro-batches.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from yue2_jobs.db.models import Job, JobStatus


def interleave(jobs: Iterable[tuple[str, str]]) -> list[str]:
    """Job ids of (id, tenant) pairs, round-robin over tenants, each tenant's in the given order."""
    by_tenant: dict[str, list[str]] = defaultdict(list)
    for job_id, tenant in jobs:
        by_tenant[tenant].append(job_id)
    queues = list(by_tenant.values())
    out: list[str] = []
    for i in range(max((len(q) for q in queues), default=0)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


# The tenants with queued jobs of a variant, one index probe per tenant (a "loose index scan" on
# ix_jobs_fair_share): a DISTINCT would read every queued row, 20,000 for one big batch, each poll.
_QUEUED_TENANTS_PG = text("""
WITH RECURSIVE t(tenant) AS (
    (SELECT tenant FROM jobs WHERE status = 'queued' AND variant = :variant ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT j.tenant FROM jobs j WHERE j.status = 'queued' AND j.variant = :variant
            AND j.tenant > t.tenant ORDER BY j.tenant LIMIT 1)
    FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL LIMIT :most
""")
MOST_TENANTS = 1000  # read per poll; beyond that many waiting tenants, the rest wait for the broker
MOST_SHARED = 100  # of those, looked into (a query each) per poll


def queued_tenants(session: Session, *, variant: str) -> list[str]:
    """Tenants with jobs of `variant` queued, in tenant order."""
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        return list(session.execute(_QUEUED_TENANTS_PG, {"variant": variant, "most": MOST_TENANTS}).scalars())
    return list(session.execute(select(Job.tenant).distinct().where(
        Job.status == JobStatus.QUEUED, Job.variant == variant).order_by(Job.tenant).limit(MOST_TENANTS)).scalars())


def jobs_to_share(session: Session, *, variant: str, serving: set[str], share: int, limit: int) -> list[str]:
    """Ids of up to `limit` queued jobs of `variant` a busy worker should start next, for tenants
    not in `serving` with fewer than `share` of the variant's jobs running anywhere: the tenants
    whose oldest queued job is oldest first, one job each per round, each its oldest jobs, up to
    `share` running in all (past `MOST_SHARED` waiting tenants, a random sample of them each poll).
    Ends its transaction (the caller claims the ids, which may race)."""
    try:
        tenants = [t for t in queued_tenants(session, variant=variant) if t not in serving]
        if len(tenants) > MOST_SHARED:  # a different sample each poll, so no tenant is always left out
            tenants = random.sample(tenants, MOST_SHARED)
        if not tenants or limit <= 0:
            session.commit()
            return []
        running = {t: n for t, n in session.execute(
            select(Job.tenant, func.count()).where(Job.status == JobStatus.RUNNING, Job.variant == variant,
                                                  Job.tenant.in_(tenants)).group_by(Job.tenant))}
        waiting: list[tuple[Any, str, list[str]]] = []
        for tenant in tenants:
            room = min(share - running.get(tenant, 0), limit)
            if room <= 0:
                continue
            rows = session.execute(
                select(Job.id, Job.created_at).where(Job.status == JobStatus.QUEUED, Job.variant == variant,
                                                     Job.tenant == tenant,
                                                     Job.attempts == 0)  # a job that killed a worker runs alone
                .order_by(Job.created_at, Job.id).limit(room)).all()
            if rows:
                waiting.append((rows[0][1], tenant, [r[0] for r in rows]))
        waiting.sort(key=lambda w: (w[0], w[1]))  # the longest wait first
        session.commit()
    except BaseException:
        session.rollback()  # a lost connection: the caller sees the outage, not a pending rollback
        raise
    return interleave((job_id, tenant) for _, tenant, ids in waiting for job_id in ids)[:limit]
