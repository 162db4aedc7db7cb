"""What the batch console shows of one batch: counts by status, by variant and by checkpoint
version, throughput and an ETA. One grouped query and one small time query."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from yue2_jobs.db.models import Job, JobStatus
from yue2_jobs.db.session import utcnow
from yue2_jobs.jobs.service import get_batch

RATE_WINDOW_S = 60.0  # throughput is measured over the last minute


def batch_stats(session: Session, *, tenant: str, batch_id: str) -> dict[str, Any]:
    batch = get_batch(session, tenant=tenant, batch_id=batch_id)
    by_status: dict[str, int] = defaultdict(int)
    by_variant: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    by_checkpoint: dict[str, int] = defaultdict(int)
    for variant, checkpoint, status, n in session.execute(
            select(Job.variant, Job.checkpoint, Job.status, func.count()).where(Job.batch_id == batch.id)
            .group_by(Job.variant, Job.checkpoint, Job.status)).all():
        by_status[status] += n
        by_variant[variant][status] += n
        if checkpoint is not None:
            by_checkpoint[checkpoint] += n
    since = utcnow() - timedelta(seconds=RATE_WINDOW_S)
    recent = session.execute(select(func.count()).where(
        Job.batch_id == batch.id, Job.finished_at >= since,
        Job.status.in_((JobStatus.SUCCEEDED, JobStatus.FAILED)))).scalar_one()
    total = sum(by_status.values())
    remaining = by_status.get(JobStatus.QUEUED, 0) + by_status.get(JobStatus.RUNNING, 0)
    per_s = recent / RATE_WINDOW_S
    return {"object": "yue2.batch.stats", "id": batch.id, "status": batch.status, "total": total,
            "done": total - remaining, "by_status": dict(by_status),
            "by_variant": {v: dict(c) for v, c in sorted(by_variant.items())},
            "by_checkpoint": dict(sorted(by_checkpoint.items())),
            "throughput_per_s": round(per_s, 3),
            "eta_s": round(remaining / per_s, 1) if remaining and per_s > 0 else (0 if not remaining else None)}
