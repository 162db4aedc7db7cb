"""Producer side: create jobs, files and batches for a tenant, read them back, cancel them.

Everything a tenant reads is filtered by tenant, so another tenant's id is a plain 404.
Rows are committed before anything is enqueued: Postgres is the record, and the reconciler
enqueues whatever a crash between the two left behind.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Batch, BatchStatus, File, Job, JobStatus
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import ConflictError, InvalidRequestError, LimitExceededError, NotFoundError
from yue2_jobs.jobs.params import ENDPOINTS, ValidatedJob, validate_job
from yue2_jobs.jobs.state import cancel_jobs
from yue2_jobs.storage import Storage


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def output_key(*, tenant: str, batch_id: str | None, job_id: str) -> str:
    return f"{tenant}/{batch_id or 'jobs'}/{job_id}.json"


def file_key(json_key: str, suffix: str) -> str:
    """Where a job's extra output file (a render's `svg` or `png`) lives, beside its JSON."""
    return f"{json_key.removesuffix('.json')}.{suffix}"


def _job_row(job: ValidatedJob, *, tenant: str, batch_id: str | None, settings: Settings, storage: Storage,
             now: Any) -> dict[str, Any]:
    job_id = new_id("job_")
    row: dict[str, Any] = dict(id=job_id, tenant=tenant, batch_id=batch_id, custom_id=job.custom_id, kind=job.kind,
                               status=JobStatus.QUEUED, variant=job.variant, params=job.params, attempts=0,
                               created_at=now, input_text=job.text, input_key=None)
    if len(job.text.encode()) > settings.inline_input_bytes:
        row["input_key"] = f"{tenant}/{batch_id or 'jobs'}/{job_id}.input.txt"
        storage.put(row["input_key"], job.text.encode(), content_type="text/plain; charset=utf-8")
        row["input_text"] = None
    return row


def create_job(session: Session, *, tenant: str, body: Any, settings: Settings, storage: Storage) -> Job:
    job = validate_job(body, kind=None, settings=settings)
    row = _job_row(job, tenant=tenant, batch_id=None, settings=settings, storage=storage, now=utcnow())
    session.execute(insert(Job), [row])
    session.commit()
    return session.get_one(Job, row["id"])


def get_job(session: Session, *, tenant: str, job_id: str) -> Job:
    job = session.execute(select(Job).where(Job.id == job_id, Job.tenant == tenant)).scalar_one_or_none()
    if job is None:
        raise NotFoundError(f"no job {job_id!r}")
    return job


def get_job_row(session: Session, *, tenant: str, job_id: str) -> Any:
    """`get_job` as a Core row (attribute access like the ORM object), without the ORM's overhead."""
    table = Job.__table__
    row = session.execute(select(table).where(table.c.id == job_id, table.c.tenant == tenant)).one_or_none()
    if row is None:
        raise NotFoundError(f"no job {job_id!r}")
    return row


def cancel_job(session: Session, *, tenant: str, job_id: str) -> Job:
    job = get_job(session, tenant=tenant, job_id=job_id)
    cancel_jobs(session, where=(Job.id == job.id))
    session.refresh(job)
    return job


def create_file(session: Session, *, tenant: str, filename: str, purpose: str, data: bytes,
                storage: Storage) -> File:
    if purpose != "batch":
        raise InvalidRequestError(f"purpose {purpose!r} is not supported; use 'batch'", field="purpose", status=400)
    file_id = new_id("file-")
    key = f"{tenant}/files/{file_id}.jsonl"
    storage.put(key, data, content_type="application/jsonl")
    f = File(id=file_id, tenant=tenant, purpose=purpose, filename=filename, bytes=len(data), storage_key=key,
             created_at=utcnow())
    session.add(f)
    session.commit()
    return f


def get_file(session: Session, *, tenant: str, file_id: str) -> File:
    f = session.execute(select(File).where(File.id == file_id, File.tenant == tenant)).scalar_one_or_none()
    if f is None:
        raise NotFoundError(f"no file {file_id!r}")
    return f


@dataclass
class ParsedLine:
    custom_id: str
    job: ValidatedJob | None
    error: InvalidRequestError | None
    reference: str | None = None


def _line_reference(line: dict[str, Any], *, n: int, settings: Settings, in_experiment: bool) -> str | None:
    """A line's optional `reference` (the expected output, for ROUGE in experiment reports)."""
    if in_experiment and isinstance(line.get("body"), dict) and line["body"].get("variant") is not None:
        raise InvalidRequestError(f"line {n}: body.variant is not allowed in a batch under an experiment; "
                                  "the experiment assigns the variants", field="body.variant")
    ref = line.get("reference")
    if ref is None:
        return None
    if not isinstance(ref, str):
        raise InvalidRequestError(f"line {n}: reference must be a string", field="reference")
    if len(ref) > settings.max_input_chars:
        raise LimitExceededError(field="reference", limit=settings.max_input_chars, actual=len(ref),
                                 unit="characters")
    return ref


def parse_batch_file(data: bytes, *, endpoint: str, settings: Settings, in_experiment: bool = False
                     ) -> list[ParsedLine]:
    """Structural errors (bad JSON, missing or duplicate custom_id, wrong url, too many lines) reject
    the whole batch at create time; a line whose body (or reference) breaks a rule becomes that
    line's error."""
    kind = ENDPOINTS[endpoint]
    lines = [ln for ln in data.splitlines() if ln.strip()]
    if not lines:
        raise InvalidRequestError("input file has no requests", field="input_file_id", status=400)
    if len(lines) > settings.max_batch_items:
        raise LimitExceededError(field="input_file_id", limit=settings.max_batch_items, actual=len(lines),
                                 unit="requests", status=400)
    seen: set[str] = set()
    out: list[ParsedLine] = []
    for n, raw in enumerate(lines, start=1):
        try:
            line = json.loads(raw)
        except ValueError:
            raise InvalidRequestError(f"line {n} is not valid JSON", field=f"line {n}", status=400) from None
        if not isinstance(line, dict):
            raise InvalidRequestError(f"line {n} must be a JSON object", field=f"line {n}", status=400)
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
            raise InvalidRequestError(f"line {n}: custom_id must be a non-empty string of at most 512 characters",
                                      field=f"line {n}.custom_id", status=400)
        if custom_id in seen:
            raise InvalidRequestError(f"line {n}: custom_id {custom_id!r} is used twice; each must be unique",
                                      field=f"line {n}.custom_id", status=400)
        seen.add(custom_id)
        if line.get("url", endpoint) != endpoint or line.get("method", "POST") != "POST":
            raise InvalidRequestError(f"line {n}: every request must be POST {endpoint}, the batch's endpoint",
                                      field=f"line {n}.url", status=400)
        try:
            reference = _line_reference(line, n=n, settings=settings, in_experiment=in_experiment)
            job = validate_job(line.get("body"), kind=kind, settings=settings, field_prefix="body.")
            job.custom_id = custom_id
            out.append(ParsedLine(custom_id, job, None, reference))
        except InvalidRequestError as exc:
            out.append(ParsedLine(custom_id, None, exc))
    return out


def create_batch(session: Session, *, tenant: str, input_file_id: str, endpoint: str, completion_window: str,
                 metadata: dict[str, Any] | None, settings: Settings, storage: Storage,
                 experiment_id: str | None = None) -> tuple[Batch, list[tuple]]:
    """Insert the batch and its jobs in one transaction; returns the batch and the (job, variant) to enqueue.

    Under an experiment, each line becomes one job (`split`) or one job per variant (`paired`),
    on the variants the experiment assigns (`yue2_jobs.experiments.service`).
    """
    from yue2_jobs.experiments.service import get_experiment, variants_for

    if endpoint not in ENDPOINTS:
        raise InvalidRequestError(f"endpoint {endpoint!r} is not supported; use one of {sorted(ENDPOINTS)}",
                                  field="endpoint", status=400)
    if completion_window != "24h":
        raise InvalidRequestError("completion_window must be '24h'", field="completion_window", status=400)
    exp = get_experiment(session, tenant=tenant, experiment_id=experiment_id) if experiment_id else None
    if exp is not None and ENDPOINTS[endpoint] == "render_font":
        raise InvalidRequestError("experiments compare model variants; a /v1/render_font batch cannot run under one",
                                  field="experiment_id", status=400)
    f = get_file(session, tenant=tenant, file_id=input_file_id)
    parsed = parse_batch_file(storage.get(f.storage_key), endpoint=endpoint, settings=settings,
                              in_experiment=exp is not None)
    per_line = len(variants_for(exp, "")) if exp else 1
    if len(parsed) * per_line > settings.max_batch_items:
        raise LimitExceededError(field="input_file_id", limit=settings.max_batch_items,
                                 actual=len(parsed) * per_line, unit="jobs (requests x variants)", status=400)
    now = utcnow()
    batch = Batch(id=new_id("batch_"), tenant=tenant, input_file_id=f.id, endpoint=endpoint,
                  completion_window=completion_window, status=BatchStatus.IN_PROGRESS, metadata_=metadata,
                  created_at=now, in_progress_at=now, expires_at=now + timedelta(hours=24),
                  experiment_id=exp.id if exp else None)
    session.add(batch)
    session.flush()
    rows = []
    for line in parsed:
        variants = variants_for(exp, line.custom_id) if exp else [None]
        for variant in variants:
            if line.job is not None:
                row = _job_row(line.job, tenant=tenant, batch_id=batch.id, settings=settings, storage=storage,
                               now=now)
            else:
                assert line.error is not None
                row = dict(id=new_id("job_"), tenant=tenant, batch_id=batch.id, custom_id=line.custom_id,
                           kind=ENDPOINTS[endpoint], status=JobStatus.FAILED, variant=settings.default_variant,
                           params={}, attempts=0, created_at=now, finished_at=now,
                           error={"code": line.error.code, "message": str(line.error),
                                  "param": line.error.field, "status_code": line.error.status})
            row.update(experiment_id=batch.experiment_id, reference=line.reference)
            if variant is not None:
                row["variant"] = variant
            rows.append(row)
    batch.total = len(rows)
    for start in range(0, len(rows), 5000):
        session.execute(insert(Job), rows[start:start + 5000])
    session.commit()
    to_enqueue = [(r["id"], r["variant"]) for r in rows if r["status"] == JobStatus.QUEUED]
    return batch, to_enqueue


def get_batch(session: Session, *, tenant: str, batch_id: str) -> Batch:
    b = session.execute(select(Batch).where(Batch.id == batch_id, Batch.tenant == tenant)).scalar_one_or_none()
    if b is None:
        raise NotFoundError(f"no batch {batch_id!r}")
    return b


def request_counts(session: Session, batch_id: str) -> dict[str, int]:
    by_status = dict(session.execute(
        select(Job.status, func.count()).where(Job.batch_id == batch_id).group_by(Job.status)).all())
    return {"total": sum(by_status.values()), "completed": by_status.get(JobStatus.SUCCEEDED, 0),
            "failed": by_status.get(JobStatus.FAILED, 0), "cancelled": by_status.get(JobStatus.CANCELLED, 0)}


def cancel_batch(session: Session, *, tenant: str, batch_id: str) -> Batch:
    b = get_batch(session, tenant=tenant, batch_id=batch_id)
    now = utcnow()
    moved = session.execute(
        update(Batch).where(Batch.id == b.id, Batch.status.in_((BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)))
        .values(status=BatchStatus.CANCELLING, cancelling_at=now)).rowcount
    session.commit()
    if not moved and b.status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        raise ConflictError(f"batch {batch_id!r} is {b.status}; only a validating or in-progress batch can be "
                            f"cancelled")
    # Queued jobs end cancelled now; running ones finish and keep their result.
    cancel_jobs(session, where=(Job.batch_id == b.id) & (Job.status == JobStatus.QUEUED))
    session.refresh(b)
    return b
