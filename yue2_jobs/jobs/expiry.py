"""Batch expiry, as OpenAI defines it: a batch not finished by `expires_at` (24 h after it was
created) becomes `expired`. Its requests that had not finished are cancelled with the error code
`batch_expired` and go to the error file; the finished ones keep their outputs in the output file.

A request running at that moment is expired too (its result, if it comes, is discarded, as for a
cancelled job): the batch then ends at once instead of waiting on the slowest worker.
"""

from __future__ import annotations

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from yue2_jobs.db.models import Batch, BatchStatus, Job, JobStatus
from yue2_jobs.db.session import affected, utcnow
from yue2_jobs.jobs.state import cancel_jobs

EXPIRED_ERROR = {"code": "batch_expired", "status_code": 408,
                 "message": "this request did not run before the batch's completion window ended"}


def expire_due(session: Session) -> list[str]:
    """Mark the batches past `expires_at` expired and cancel their unfinished jobs; returns their ids.
    The caller finalizes them (writes their files; the final status is then `expired`)."""
    now = utcnow()
    due = session.execute(select(Batch.id).where(
        Batch.status.in_((BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)), Batch.expired_at.is_(None),
        Batch.expires_at < now,
        # one whose last job just finished is completing, not expiring
        exists().where(Job.batch_id == Batch.id, Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
    )).scalars().all()
    session.commit()
    expired = []
    for batch_id in due:
        # Conditional: a batch that finished or was cancelled meanwhile is left alone.
        moved = affected(session.execute(update(Batch).where(
            Batch.id == batch_id, Batch.status.in_((BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)),
            Batch.expired_at.is_(None)).values(expired_at=now)))
        session.commit()
        if moved:
            cancel_jobs(session, where=(Job.batch_id == batch_id), error=EXPIRED_ERROR)
            expired.append(batch_id)
    return expired
