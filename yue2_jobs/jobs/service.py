"""Producer side: create jobs, files and batches for a tenant, read them back, cancel them.

Everything a tenant reads is filtered by tenant, so another tenant's id is a plain 404.
Rows are committed before anything is enqueued: Postgres is the record, and the reconciler
enqueues whatever a crash between the two left behind.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.core.ids import new_id
from yue2_jobs.core.safe import require_id
from yue2_jobs.db.models import Batch, BatchStatus, Job, JobStatus
from yue2_jobs.db.queries import get_owned
from yue2_jobs.db.session import affected, utcnow
from yue2_jobs.errors import ConflictError, InvalidRequestError, LimitExceededError, NotFoundError
from yue2_jobs.jobs.assignment import get_experiment, variants_for
from yue2_jobs.jobs.capacity import no_worker_warnings
from yue2_jobs.jobs.files import get_file
from yue2_jobs.jobs.keys import line_ref, own_input_key
from yue2_jobs.jobs.lines import ParsedLine, iter_batch_lines, max_line_bytes, stream_lines
from yue2_jobs.jobs.params import ENDPOINTS, ValidatedJob, validate_job
from yue2_jobs.jobs.state import cancel_jobs
from yue2_jobs.storage import Storage


def _job_row(job: ValidatedJob, *, tenant: str, batch_id: str | None, settings: Settings, now: Any,
             source: str | None = None) -> dict[str, Any]:
    """A job's row; an input over the inline limit is referenced by `input_key`: `source` (its batch
    line) or, for a single job, its own object, which the caller writes before committing."""
    job_id = new_id("job_")
    row: dict[str, Any] = dict(id=job_id, tenant=tenant, batch_id=batch_id, custom_id=job.custom_id, kind=job.kind,
                               status=JobStatus.QUEUED, variant=job.variant, params=job.params, attempts=0,
                               created_at=now, input_text=job.text, input_key=None)
    if len(job.text.encode()) > settings.inline_input_bytes:
        row["input_key"] = source or own_input_key(tenant=tenant, job_id=job_id)
        row["input_text"] = None
    return row


def create_job(session: Session, *, tenant: str, body: Any, settings: Settings, storage: Storage) -> Job:
    job = validate_job(body, kind=None, settings=settings)
    row = _job_row(job, tenant=tenant, batch_id=None, settings=settings, now=utcnow())
    session.execute(insert(Job), [row])  # the row can be written: only now may its input object be
    if row["input_key"] is not None:
        try:
            storage.put(row["input_key"], job.text.encode(), content_type="text/plain; charset=utf-8")
        except BaseException:
            session.rollback()
            raise
    session.commit()
    return session.get_one(Job, row["id"])


def submit_job(session: Session, *, tenant: str, body: Any, settings: Settings, storage: Storage
               ) -> tuple[Job, list[str]]:
    """POST /v1/jobs: the job (committed; the caller publishes it) and warnings for its caller."""
    job = create_job(session, tenant=tenant, body=body, settings=settings, storage=storage)
    return job, no_worker_warnings(session, [job.variant])


def get_job(session: Session, *, tenant: str, job_id: str) -> Job:
    return get_owned(session, Job, tenant=tenant, row_id=job_id, what="job")


def get_job_row(session: Session, *, tenant: str, job_id: str) -> Any:
    """`get_job` as a Core row (attribute access like the ORM object), without the ORM's overhead."""
    require_id(job_id, what="job")
    table = cast(Table, Job.__table__)
    row = session.execute(select(table).where(table.c.id == job_id, table.c.tenant == tenant)).one_or_none()
    if row is None:
        raise NotFoundError(f"no job {job_id!r}")
    return row


def cancel_job(session: Session, *, tenant: str, job_id: str) -> Job:
    job = get_job(session, tenant=tenant, job_id=job_id)
    cancel_jobs(session, where=(Job.id == job.id))
    session.refresh(job)
    return job


def create_batch(session: Session, *, tenant: str, input_file_id: str, endpoint: str, completion_window: str,
                 metadata: dict[str, Any] | None, settings: Settings, storage: Storage,
                 experiment_id: str | None = None) -> tuple[Batch, list[tuple[str, str]]]:
    """Insert the batch and its jobs in one transaction; returns the batch and the (job, variant) to enqueue.

    The input file is read from storage a piece at a time and its jobs inserted a few thousand rows
    at a time, so memory does not grow with the file. Under an experiment, each line becomes one job
    (`split`) or one job per variant (`paired`), on the variants it assigns (`jobs.assignment`).
    """
    if endpoint not in ENDPOINTS:
        raise InvalidRequestError(f"endpoint {endpoint!r} is not supported; use one of {sorted(ENDPOINTS)}",
                                  field="endpoint", status=400)
    if completion_window != "24h":
        raise InvalidRequestError("completion_window must be '24h'", field="completion_window", status=400)
    exp = get_experiment(session, tenant=tenant, experiment_id=experiment_id) if experiment_id else None
    if exp is not None and ENDPOINTS[endpoint] == "render_font":
        raise InvalidRequestError("experiments compare model variants; a /v1/render_font batch cannot run under one",
                                  field="experiment_id", status=400)
    f = get_file(session, tenant=tenant, file_id=input_file_id, lock="share")  # not deleted while we read it
    per_line = len(variants_for(exp, "")) if exp else 1
    if f.lines is not None:  # counted at upload: refused before a byte is read
        if f.lines == 0:
            raise InvalidRequestError("input file has no requests", field="input_file_id", status=400)
        _check_size(f.lines, per_line=per_line, settings=settings)
    now = utcnow()
    batch = Batch(id=new_id("batch_"), tenant=tenant, input_file_id=f.id, endpoint=endpoint,
                  completion_window=completion_window, status=BatchStatus.IN_PROGRESS, metadata_=metadata,
                  created_at=now, in_progress_at=now, expires_at=now + timedelta(hours=24),
                  experiment_id=exp.id if exp else None)
    session.add(batch)
    session.flush()
    to_enqueue: list[tuple[str, str]] = []
    rows: list[dict[str, Any]] = []
    total = 0
    reader = storage.open(f.storage_key)
    try:
        for line in iter_batch_lines(stream_lines(reader, max_bytes=max_line_bytes(settings)), endpoint=endpoint,
                                     settings=settings, in_experiment=exp is not None):
            for variant in variants_for(exp, line.custom_id) if exp else [None]:
                row = _line_row(line, variant, batch=batch, source_key=f.storage_key, settings=settings, now=now)
                rows.append(row)
                if row["status"] == JobStatus.QUEUED:
                    to_enqueue.append((row["id"], row["variant"]))
            total += per_line
            if total > settings.max_batch_items:  # a file uploaded before lines were counted
                _check_size(total // per_line, per_line=per_line, settings=settings, at_least=True)
            if len(rows) >= INSERT_ROWS:
                session.execute(insert(Job), rows)
                rows = []
    finally:
        reader.close()
    if rows:
        session.execute(insert(Job), rows)
    batch.total = total
    session.commit()
    return batch, to_enqueue


INSERT_ROWS = 2000  # job rows per INSERT: few round trips, a few MB of rows in memory at a time


def _check_size(lines: int, *, per_line: int, settings: Settings, at_least: bool = False) -> None:
    """Refuse a batch of `lines` requests (`at_least`: counted so far) over the limit."""
    if lines > settings.max_batch_items:
        raise LimitExceededError(field="input_file_id", limit=settings.max_batch_items, actual=lines,
                                 unit="requests", status=400, at_least=at_least)
    if lines * per_line > settings.max_batch_items:
        raise LimitExceededError(field="input_file_id", limit=settings.max_batch_items, actual=lines * per_line,
                                 unit="jobs (requests x variants)", status=400,
                                 at_least=at_least)


def _line_row(line: ParsedLine, variant: str | None, *, batch: Batch, source_key: str, settings: Settings,
              now: Any) -> dict[str, Any]:
    """The job row of one batch line (on `variant`, under an experiment); a line with an error is
    a job failed from the start, its error kept for the error file."""
    if line.job is not None:
        row = _job_row(line.job, tenant=batch.tenant, batch_id=batch.id, settings=settings, now=now,
                       source=line_ref(source_key, *line.span))
    else:
        assert line.error is not None
        row = dict(id=new_id("job_"), tenant=batch.tenant, batch_id=batch.id, custom_id=line.custom_id,
                   kind=ENDPOINTS[batch.endpoint], status=JobStatus.FAILED, variant=settings.default_variant,
                   params={}, attempts=0, created_at=now, finished_at=now,
                   error={"code": line.error.code, "message": str(line.error),
                          "param": line.error.field, "status_code": line.error.status})
    row.update(experiment_id=batch.experiment_id, reference=line.reference)
    if variant is not None:
        row["variant"] = variant
    return row


def get_batch(session: Session, *, tenant: str, batch_id: str) -> Batch:
    return get_owned(session, Batch, tenant=tenant, row_id=batch_id, what="batch")


def request_counts(session: Session, batch_id: str) -> dict[str, int]:
    return request_counts_of(session, [batch_id])[batch_id]


def request_counts_of(session: Session, batch_ids: list[str]) -> dict[str, dict[str, int]]:
    """Each batch's job counts by status, in one query (a list page's worth)."""
    by_batch: dict[str, dict[str, int]] = {b: {} for b in batch_ids}
    if batch_ids:
        for batch_id, status, n in session.execute(
                select(Job.batch_id, Job.status, func.count()).where(Job.batch_id.in_(batch_ids))
                .group_by(Job.batch_id, Job.status)).all():
            if batch_id is not None:  # the IN above matches batches only; the column is nullable
                by_batch[batch_id][status] = n
    return {b: {"total": sum(c.values()), "completed": c.get(JobStatus.SUCCEEDED, 0),
                "failed": c.get(JobStatus.FAILED, 0), "cancelled": c.get(JobStatus.CANCELLED, 0),
                "queued": c.get(JobStatus.QUEUED, 0), "running": c.get(JobStatus.RUNNING, 0)}
            for b, c in by_batch.items()}


def cancel_batch(session: Session, *, tenant: str, batch_id: str) -> Batch:
    b = get_batch(session, tenant=tenant, batch_id=batch_id)
    now = utcnow()
    moved = affected(session.execute(
        update(Batch).where(Batch.id == b.id, Batch.status.in_((BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)))
        .values(status=BatchStatus.CANCELLING, cancelling_at=now)))
    session.commit()
    if not moved and b.status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        raise ConflictError(f"batch {batch_id!r} is {b.status}; only a validating or in-progress batch can be "
                            f"cancelled")
    # Queued jobs end cancelled now; running ones finish and keep their result.
    cancel_jobs(session, where=(Job.batch_id == b.id) & (Job.status == JobStatus.QUEUED))
    session.refresh(b)
    return b
