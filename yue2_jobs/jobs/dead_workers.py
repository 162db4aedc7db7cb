"""Dead workers: their jobs run again within seconds, not after a lease (minutes) or Redis'
visibility timeout (hours).

A worker process that is gone leaves two things behind: claims on the jobs it was running (their
leases would run out only after `lease_s`) and the broker messages it had received and not
acknowledged (Redis hands those out again only after `visibility_timeout_s`; until then the jobs
they carry wait, even those never claimed). `release` gives both back at once:

1. its claims end now (`state.release_claims`), first, so that a job whose message comes back is
   claimable by whoever takes it;
2. its unacknowledged messages go back to the front of their queues (`queue.restore_held`).

Two callers know a worker is gone:
- a process starting under a name (the launcher restarts a child under the same node name, one
  process per name at a time) releases what the previous holder of the name left, before it
  loads its model;
- the reconciler releases every worker whose status row (`worker_processes`, refreshed every few
  seconds by a thread that runs even while it decodes) is older than `capacity.LIVE_WITHIN_S`,
  for a host that died with its launcher.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from celery import Celery
from sqlalchemy import delete, select, true
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job, WorkerProcess
from yue2_jobs.db.session import utcnow
from yue2_jobs.jobs.capacity import LIVE_WITHIN_S
from yue2_jobs.jobs.state import release_claims
from yue2_jobs.queue import broker_epoch, publish, restore_held

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Released:
    worker: str
    jobs: list[str]  # running jobs whose claims ended
    messages: int  # broker messages put back into their queues, and jobs published again


def release(session: Session, *, settings: Settings, celery_app: Celery, worker: str) -> Released:
    """Give back what the dead `worker` held: its claims, then its unacknowledged messages. A
    released job published before the broker's data began (Redis was flushed or replaced since)
    has no message left to put back, and its record of held messages went with the data: it is
    published again now, not when the reconciler finds its lease run out. (The epoch key is only
    read here: while it is missing every released job counts as lost, and the reconciler's next
    pass, which the broker watch starts, recreates it and republishes the queued jobs too.)"""
    jobs = release_claims(session, worker=worker)
    messages = restore_held(celery_app, settings, worker)
    if jobs and settings.broker_url.startswith("redis"):
        began = broker_epoch(settings, create=False)
        lost_before = Job.enqueued_at < datetime.fromtimestamp(began, UTC) if began is not None else true()
        lost = session.execute(select(Job.id, Job.variant).where(Job.id.in_(jobs), lost_before)).all()
        session.commit()
        if lost:
            messages += publish(celery_app, session, [(j, v) for j, v in lost])
    if jobs or messages:
        log.warning("worker %s is gone: released %d running jobs and put %d messages back in their queues",
                    worker, len(jobs), messages)
    return Released(worker=worker, jobs=jobs, messages=messages)


def reap(session: Session, *, settings: Settings, celery_app: Celery, silent_for_s: float = LIVE_WITHIN_S
         ) -> list[Released]:
    """Release every worker whose status row is older than `silent_for_s`. The rows go first, in one
    DELETE … RETURNING, so of two reconcilers each worker is released by one, and a worker (or its
    replacement under the same name) that reported meanwhile is not touched. Status rows are
    written with each host's clock: hosts must agree on the time within seconds (NTP)."""
    since = utcnow() - timedelta(seconds=silent_for_s)
    names = session.execute(delete(WorkerProcess).where(WorkerProcess.heartbeat_at < since)
                            .returning(WorkerProcess.name)).scalars().all()
    session.commit()
    out = []
    for name in names:
        try:
            out.append(release(session, settings=settings, celery_app=celery_app, worker=name))
        except Exception:  # Redis or Postgres blinked: its leases and Redis' visibility timeout remain
            session.rollback()
            log.exception("could not release the dead worker %s; its leases and messages time out instead", name)
    return out
