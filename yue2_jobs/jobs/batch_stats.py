"""What the batch console shows of one batch: counts by status, by variant and by checkpoint
version, its throughput and ETA, and its first failed lines (one grouped query, one time query and
one small error query); and its jobs, a page at a time, for the console's line browser.

Throughput is the batch's own average: the jobs that ran, over the time from the first job's
start to now while it runs, or to the last job's finish once nothing is left (a final figure that
no longer changes). The ETA is the jobs left at that rate; a batch none of whose jobs has started
is `waiting` and has neither."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from yue2_jobs.core.safe import ID_SHAPE
from yue2_jobs.db.listing import Page, check_limit
from yue2_jobs.db.models import Job, JobStatus
from yue2_jobs.db.session import as_utc, utcnow
from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.jobs.batches import line_error
from yue2_jobs.jobs.service import get_batch

ERRORS_SHOWN = 5  # failed lines the stats preview (the console browses them all: batch_jobs)


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
    total = sum(by_status.values())
    remaining = by_status.get(JobStatus.QUEUED, 0) + by_status.get(JobStatus.RUNNING, 0)
    first_start, last_finish, ran = session.execute(select(
        func.min(Job.started_at), func.max(Job.finished_at),
        func.count().filter(Job.finished_at.is_not(None))).where(
        Job.batch_id == batch.id, Job.started_at.is_not(None),
        Job.status.in_((JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.RUNNING)))).one()
    rate: dict[str, Any] = {"throughput_per_s": None, "eta_s": None, "rate": "waiting"}
    if first_start is not None:
        end = utcnow() if remaining or last_finish is None else last_finish
        seconds = max((as_utc(end) - as_utc(first_start)).total_seconds(), 1e-3)
        per_s = ran / seconds
        rate = {"throughput_per_s": round(per_s, 3), "rate": "running" if remaining else "final",
                "eta_s": (round(remaining / per_s, 1) if per_s > 0 else None) if remaining else 0}
    return {"object": "yue2.batch.stats", "id": batch.id, "status": batch.status, "total": total,
            "done": total - remaining, "by_status": dict(by_status),
            "by_variant": {v: dict(c) for v, c in sorted(by_variant.items())},
            "by_checkpoint": dict(sorted(by_checkpoint.items())), **rate,
            "errors_preview": _errors_preview(session, batch.id)}


def _errors_preview(session: Session, batch_id: str) -> list[dict[str, Any]]:
    """The first failed or cancelled lines by custom_id (a string order), with their error code and
    message."""
    rows = session.execute(select(Job.custom_id, Job.status, Job.error).where(
        Job.batch_id == batch_id, Job.status.in_((JobStatus.FAILED, JobStatus.CANCELLED)))
        .order_by(Job.custom_id).limit(ERRORS_SHOWN)).all()
    errors = [(c, status, line_error(err)) for c, status, err in rows]
    return [{"custom_id": c, "status": status, "code": e.get("code"), "message": e.get("message")}
            for c, status, e in errors]


def batch_jobs(session: Session, *, tenant: str, batch_id: str, status: JobStatus | None, limit: int,
               after: str | None) -> Page[Job]:
    """A page of the batch's jobs (of `status`, if given) in (custom_id, variant) order, the order
    of the batch's unique index, so a page is one index range however the jobs' statuses move
    meanwhile. `after` is the last job id of the previous page; one that is not a job of this
    batch is a 404 naming it, as in every other list."""
    check_limit(limit)
    batch = get_batch(session, tenant=tenant, batch_id=batch_id)
    stmt = select(Job).where(Job.batch_id == batch.id, *(() if status is None else (Job.status == status,)))
    if after:
        cursor = None if ID_SHAPE.fullmatch(after) is None else session.execute(
            select(Job.custom_id, Job.variant).where(Job.id == after, Job.batch_id == batch.id)).one_or_none()
        if cursor is None:
            raise InvalidRequestError(f"after: no job {after!r} of batch {batch.id!r} to page after", field="after",
                                      status=404, code="unknown_cursor")
        custom_id, variant = cursor
        stmt = stmt.where(or_(Job.custom_id > custom_id, and_(Job.custom_id == custom_id, Job.variant > variant)))
    rows = list(session.execute(stmt.order_by(Job.custom_id, Job.variant).limit(limit + 1)).scalars())
    return Page(rows=rows[:limit], has_more=len(rows) > limit)
