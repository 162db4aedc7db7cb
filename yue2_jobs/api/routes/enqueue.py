"""Publishing after the response: the rows are committed, so a crash before this runs loses nothing
(the reconciler publishes queued jobs the broker does not hold)."""

from __future__ import annotations

import logging

from fastapi import BackgroundTasks
from sqlalchemy import select
from sqlalchemy.orm import Session

from yue2_jobs.api.deps import AppState
from yue2_jobs.db.models import Job, JobStatus
from yue2_jobs.queue import publish

log = logging.getLogger(__name__)


def _publish(state: AppState, jobs: list[tuple[str, str]]) -> None:
    try:
        with state.sessions() as session:
            publish(state.celery, session, jobs, chunk=state.settings.batch_max_jobs)
    except Exception:
        log.exception("publishing %d jobs failed; the reconciler will publish them", len(jobs))


def enqueue_later(background: BackgroundTasks, state: AppState, jobs: list[tuple[str, str]]) -> None:
    if jobs:
        background.add_task(_publish, state, jobs)


def enqueue_unpublished(background: BackgroundTasks, state: AppState, session: Session, *,
                        batch_id: str | None = None, job_id: str | None = None) -> None:
    """Publish the batch's (or the job's) queued jobs that were never published: an API process
    that died after committing them did not (`api.idempotency`: the retry that takes its key over)."""
    where = Job.batch_id == batch_id if batch_id is not None else Job.id == job_id
    jobs = session.execute(select(Job.id, Job.variant).where(where, Job.status == JobStatus.QUEUED,
                                                             Job.enqueued_at.is_(None))).all()
    session.commit()
    enqueue_later(background, state, [(j, v) for j, v in jobs])
