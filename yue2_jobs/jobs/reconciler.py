"""The reconciler: makes the broker agree with Postgres, which is the record.

- A job Postgres calls `queued` that the broker no longer holds (Redis restarted or was flushed,
  the API died between commit and publish) is published again: after `reconcile_grace_s`, or at
  once when it was published before the broker's data began (`queue.broker_epoch`: a wiped or
  replaced Redis is noticed by the next pass, which the workers' broker watch starts within a
  second).
- A worker silent for longer than `capacity.LIVE_WITHIN_S` is taken for dead: its claims end and
  its unacknowledged messages go back to their queues at once (`dead_workers`).
- A `running` job whose lease ran out (its worker died) is published again, or failed once it has
  used its `max_attempts`: unless its last delivery is younger than a lease and was made into
  the broker that holds the data now.
- A batch past its `expires_at` is expired (`yue2_jobs.jobs.expiry`).
- A batch whose jobs are all finished is finalized; a finalization whose writer died is redone.
- Idempotency keys past their 24 h are dropped.
- Writes to storage that a killed writer left unfinished (S3 multipart uploads, whose parts are
  billed until aborted; a directory's temporary files) are aborted once older than
  `upload_abandoned_after_s` (`sweep_abandoned_uploads`, every `upload_sweep_interval_s`).

Publishing twice is harmless: a worker only runs a job it can claim (see `state`).

Every worker runs the reconciler thread; one process in the whole deployment does the passes:
the holder of a Postgres advisory lock (`db.leader.LeaderLock`), held on a connection of its own
and named after its worker in `pg_stat_activity` (`holder`). When that process dies its session ends
and the lock goes to the next worker that asks. When its host is cut off the server notices the
dead connection by TCP keepalive (`db.session.PEER_TIMEOUTS`, about 11 s) and ends the session.
While a worker holds it, `yue2 reconcile` by hand does nothing but say which worker does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from celery import Celery
from redis.exceptions import RedisError
from sqlalchemy import delete, false, or_, select, text
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.core.retry import transient
from yue2_jobs.db.leader import LeaderLock, lock_holder
from yue2_jobs.db.models import Batch, BatchStatus, Job, JobStatus
from yue2_jobs.db.models_api import IdempotencyKey
from yue2_jobs.db.session import utcnow
from yue2_jobs.fonts.params import FONTS_VARIANT
from yue2_jobs.jobs import dead_workers
from yue2_jobs.jobs.batches import try_finalize
from yue2_jobs.jobs.expiry import expire_due
from yue2_jobs.jobs.state import claim_jobs
from yue2_jobs.queue import broker_epoch, jobs_in_broker, publish
from yue2_jobs.storage import Storage

log = logging.getLogger(__name__)
LOCK_KEY = 0x59554532  # "YUE2": one reconciler at a time across workers and hosts (Postgres only)


def reconciler_lock(database_url: str, *, node: str) -> LeaderLock:
    """This worker's claim to run the deployment's reconciler passes."""
    return LeaderLock(database_url, key=LOCK_KEY, role="reconciler", node=node)


def holder(session: Session) -> str | None:
    """The worker that runs the reconciler passes now (None: none, or not Postgres)."""
    return lock_holder(session, key=LOCK_KEY, role="reconciler")


@dataclass
class ReconcileReport:
    republished_queued: list[str] = field(default_factory=list)
    republished_expired: list[str] = field(default_factory=list)
    failed_exhausted: list[str] = field(default_factory=list)
    finalized_batches: list[str] = field(default_factory=list)
    expired_batches: list[str] = field(default_factory=list)
    released_workers: list[dead_workers.Released] = field(default_factory=list)
    skipped: bool = False


def reconcile_once(session: Session, *, settings: Settings, celery_app: Celery, storage: Storage,
                   reap_dead: bool = False, locked: bool = False) -> ReconcileReport:
    """One pass. `reap_dead` also releases silent workers; a caller passes it only when it reached
    the database on its previous pass too (after an outage every worker's status row is stale).
    `locked`: the caller holds `reconciler_lock`; otherwise the pass runs only if it can take the
    lock for its first transaction (`yue2 reconcile`)."""
    report = ReconcileReport()
    if not locked and session.bind is not None and session.bind.dialect.name == "postgresql":
        if not session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": LOCK_KEY}).scalar():
            report.skipped = True
            return report
    now = utcnow()
    cutoff = now - timedelta(seconds=settings.reconcile_grace_s)
    # Published before the broker's data began: its message went with the old data, whatever its age.
    try:
        began = broker_epoch(settings)
    except RedisError as exc:  # the rest of the pass (expiry, finalizing, key clean-up) needs no broker
        log.warning("reconciler: the broker is unreachable (%s); its checks wait for the next pass", type(exc).__name__)
        began = None
    before_epoch = Job.enqueued_at < datetime.fromtimestamp(began, UTC) if began is not None else false()
    # Read Postgres before the broker: a job published after this read is not a candidate.
    queued = session.execute(select(Job.id, Job.variant).where(
        Job.status == JobStatus.QUEUED,
        or_(Job.enqueued_at < cutoff, before_epoch, Job.enqueued_at.is_(None) & (Job.created_at < cutoff)))).all()
    # A job republished within the last lease is left to that delivery (if the broker still has it).
    expired = session.execute(select(Job.id, Job.variant, Job.attempts).where(
        Job.status == JobStatus.RUNNING, Job.lease_expires_at < now,
        or_(Job.enqueued_at.is_(None), Job.enqueued_at < now - timedelta(seconds=settings.lease_s),
            before_epoch))).all()
    session.commit()  # ends the transaction (and the advisory lock) before the broker round trip
    if reap_dead:  # each dead worker is released by one reconciler (reap deletes its row first)
        report.released_workers = dead_workers.reap(session, settings=settings, celery_app=celery_app)
    if queued or expired:
        held = jobs_in_broker(settings, [*settings.checkpoints, FONTS_VARIANT], delivered_within_s=settings.lease_s)
        lost = [(j, v) for j, v in queued if j not in held]
        if lost:
            publish(celery_app, session, lost, chunk=settings.batch_max_jobs)
            report.republished_queued = [j for j, _ in lost]
        exhausted = [j for j, _, attempts in expired if attempts >= settings.max_attempts]
        if exhausted:
            # claim_jobs fails exactly the claimable jobs that have used their attempts.
            _, report.failed_exhausted = claim_jobs(session, job_ids=exhausted, worker="reconciler",
                                                    lease_s=settings.lease_s, max_attempts=settings.max_attempts)
        retry = [(j, v) for j, v, attempts in expired if attempts < settings.max_attempts and j not in held]
        if retry:
            publish(celery_app, session, retry)
            report.republished_expired = [j for j, _ in retry]
    report.expired_batches = expire_due(session)
    session.execute(delete(IdempotencyKey).where(IdempotencyKey.expires_at < now))
    session.commit()
    stale = now - timedelta(seconds=settings.lease_s)
    open_batches = session.execute(select(Batch.id, Batch.finalizing_at.is_not(None) & (Batch.finalizing_at < stale))
                                   .where(Batch.status.in_((BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING,
                                                            BatchStatus.FINALIZING)))).all()
    session.commit()
    for batch_id, force in open_batches:
        try:
            if try_finalize(session, batch_id=batch_id, storage=storage, force=force):
                report.finalized_batches.append(batch_id)
        except Exception as exc:  # storage down: this batch waits for the next pass, the others go on
            if not transient(exc):
                raise
            session.rollback()
            log.warning("reconciler: finalizing batch %s: %s; next pass", batch_id, type(exc).__name__)
    if report.republished_queued or report.republished_expired or report.failed_exhausted:
        log.warning("reconciler: republished %d queued and %d expired jobs, failed %d exhausted",
                    len(report.republished_queued), len(report.republished_expired), len(report.failed_exhausted))
    return report


def sweep_abandoned_uploads(stores: dict[str, Storage], *, settings: Settings) -> dict[str, list[str]]:
    """Abort every unfinished write older than `settings.upload_abandoned_after_s` in each store
    (named for the log); returns the keys per store. A store that fails is logged and left to
    the next sweep, the others still swept. s3transfer aborts a failed upload itself; this is for
    the writer that was killed, and for an abort that failed with S3 down."""
    swept: dict[str, list[str]] = {}
    for name, store in stores.items():
        try:
            swept[name] = store.abort_stale_uploads(older_than_s=settings.upload_abandoned_after_s)
        except Exception as exc:
            if not transient(exc):
                raise
            log.warning("upload sweep: %s unreachable (%s); next sweep", name, type(exc).__name__)
            continue
        if swept[name]:
            log.warning("upload sweep: aborted %d abandoned writes in %s: %s", len(swept[name]), name,
                        ", ".join(swept[name][:5]))
    return swept
