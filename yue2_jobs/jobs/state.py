"""Job state changes, each one conditional UPDATE: status never moves backwards.

A worker *claims* a job before running it: the claim bumps `attempts`, records a fresh
`claim_token` and a lease. Only the holder of the current token can finish the job, so a
redelivered task (Redis visibility timeout, the reconciler, a restarted worker) never redoes or
overwrites a finished job. A claim whose lease ran out (its worker died) can be taken again; a job
claimed `max_attempts` times without finishing ends `failed`, so a poison job cannot loop.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, or_, select, update
from sqlalchemy.orm import Session

from yue2_jobs.db.models import Job, JobStatus
from yue2_jobs.db.session import affected, utcnow

CLAIM_COLUMNS = (Job.id, Job.tenant, Job.batch_id, Job.custom_id, Job.kind, Job.variant, Job.params, Job.input_text,
                 Job.input_key, Job.attempts, Job.claim_token)


@dataclass(frozen=True)
class ClaimedJob:
    """A job a worker holds a claim on: the columns running and recording it read (`CLAIM_COLUMNS`)."""

    id: str
    tenant: str
    batch_id: str | None
    custom_id: str | None
    kind: str
    variant: str
    params: dict[str, Any]
    input_text: str | None
    input_key: str | None
    attempts: int
    claim_token: str


def _claimable(now: Any) -> Any:
    return or_(Job.status == JobStatus.QUEUED,
               and_(Job.status == JobStatus.RUNNING, Job.lease_expires_at < now))


def claim_jobs(session: Session, *, job_ids: list[str], worker: str, lease_s: float,
               max_attempts: int, fresh: bool = False) -> tuple[list[ClaimedJob], list[str]]:
    """Claim the claimable ones of `job_ids`; returns (claimed rows, ids failed for too many attempts).
    `fresh`: the caller read every one as never started, so none is looked at for attempts used up
    (one statement, not two; one started since by a worker that died, many times over, is left
    unclaimed here and failed by a later claim)."""
    if not job_ids:
        return [], []
    now = utcnow()
    exhausted = [] if fresh else session.execute(
        update(Job)
        .where(Job.id.in_(job_ids), _claimable(now), Job.attempts >= max_attempts)
        .values(status=JobStatus.FAILED, finished_at=now, claim_token=None, lease_expires_at=None,
                error={"code": "max_attempts_exceeded",
                       "message": f"the job was started {max_attempts} times and never finished "
                                  f"(its worker died each time); it is not retried again"})
        .returning(Job.id)
    ).scalars().all()
    token = secrets.token_hex(8)
    claimed = session.execute(
        update(Job)
        .where(Job.id.in_(job_ids), _claimable(now), Job.attempts < max_attempts)
        .values(status=JobStatus.RUNNING, attempts=Job.attempts + 1, claim_token=token, worker=worker,
                started_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(*CLAIM_COLUMNS)
    ).all()
    session.commit()
    return [ClaimedJob(**row._mapping) for row in claimed], list(exhausted)


def renew_leases(session: Session, *, claims: dict[str, str], lease_s: float) -> int:
    """Extend the leases this worker still holds; returns how many it still holds."""
    if not claims:
        return 0
    until = utcnow() + timedelta(seconds=lease_s)
    n = 0
    for token in sorted(set(claims.values())):
        ids = sorted(j for j, t in claims.items() if t == token)
        # A row locked right now is being finished (or cancelled): it needs no lease, and waiting
        # for it could deadlock with the recorder's transaction, which locks rows in id order.
        held = (select(Job.id).where(Job.id.in_(ids), Job.claim_token == token, Job.status == JobStatus.RUNNING)
                .order_by(Job.id).with_for_update(skip_locked=True))
        n += affected(session.execute(update(Job).where(Job.id.in_(held.scalar_subquery()))
                                      .values(lease_expires_at=until)))
        session.commit()
    return n


def release_claims(session: Session, *, worker: str) -> list[str]:
    """End the leases of the running jobs `worker` holds, now: its process is gone, so they may be
    claimed again at once. Their claim tokens stay, so nothing else changes for a worker wrongly
    taken for dead: its heartbeat renews the lease and it finishes the job, unless another worker
    claimed it first (then the job runs twice and is recorded once). Returns their ids."""
    now = utcnow()
    released = session.execute(
        update(Job).where(Job.worker == worker, Job.status == JobStatus.RUNNING, Job.lease_expires_at >= now)
        .values(lease_expires_at=now).returning(Job.id)).scalars().all()
    session.commit()
    return list(released)


FINISH_COLUMNS = ("status", "checkpoint", "weights_sha256", "output_key", "output_text", "error", "input_tokens",
                  "output_tokens", "decoder_steps", "nar_tokens", "decoded_mode", "input_tokens_used",
                  "input_truncated", "chunks")


def finish_jobs(session: Session, results: Iterable[dict[str, Any]]) -> int:
    """Mark jobs succeeded or failed, in one executemany; each dict holds `id`, `claim_token` and
    FINISH_COLUMNS (missing ones are set to None).

    An update takes only where the claim is still this worker's and the job was not cancelled
    meanwhile; returns how many took.
    """
    table = cast(Table, Job.__table__)
    stmt = (table.update()
            .where(table.c.id == bindparam("b_id"), table.c.claim_token == bindparam("b_token"),
                   table.c.status == JobStatus.RUNNING)
            .values(finished_at=bindparam("b_finished_at"), lease_expires_at=None,
                    **{c: bindparam(f"b_{c}") for c in FINISH_COLUMNS}))
    now = utcnow()
    # In id order, and the heartbeat skips rows locked here, so this never waits on a lock
    # holder that waits on it (the claim of the next slice touches other rows).
    params = [{"b_id": r["id"], "b_token": r["claim_token"], "b_finished_at": now,
               **{f"b_{c}": r.get(c) for c in FINISH_COLUMNS}} for r in sorted(results, key=lambda r: r["id"])]
    if not params:
        return 0
    n = session.connection().execute(stmt, params).rowcount
    session.commit()
    return n


def cancel_jobs(session: Session, *, where: Any, error: dict[str, Any] | None = None) -> int:
    """Cancel the unfinished jobs matching `where`; a running one's result will be discarded.
    `error` is what the batch's error file says of them (default: cancelled)."""
    n = affected(session.execute(
        update(Job).where(where, Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
        .values(status=JobStatus.CANCELLED, finished_at=utcnow(), lease_expires_at=None,
                **({"error": error} if error is not None else {}))
    ))
    session.commit()
    return n
