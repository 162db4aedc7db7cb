"""Finishing a batch: once no job of it is queued or running, write its output and error files.

The files are JSONL in the OpenAI Batch shape (one line per request, matched on `custom_id`):
succeeded jobs go to the output file, failed and cancelled ones to the error file. Only one
caller wins the conditional UPDATE that starts finalizing; the file keys are deterministic, so a
finalization redone after a crash rewrites the same objects.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from yue2_jobs.db.models import Batch, BatchStatus, File, Job, JobStatus
from yue2_jobs.db.session import utcnow
from yue2_jobs.jobs.keys import batch_result_file_id, batch_result_key
from yue2_jobs.jobs.outputs import facts_of, output_body, read_body, read_text
from yue2_jobs.storage import Storage
from yue2_jobs.webhooks.events import emit


def line_error(error: dict[str, Any] | None) -> dict[str, Any]:
    """A line's error as its error-file line gives it; a line cancelled before it ran has none stored."""
    return error or {"code": "cancelled", "message": "the batch was cancelled before this request ran"}


def _result_line(job: Job, storage: Storage) -> tuple[bool, dict[str, Any]]:
    request_id = f"batch_req_{job.id.removeprefix('job_')}"
    if job.status == JobStatus.SUCCEEDED:
        if job.kind == "render_font":  # its stored JSON names the image files and the layout
            body = read_body(storage, job.output_key or "")
        else:
            body = output_body(facts_of(job), read_text(storage, output_text=job.output_text,
                                                       output_key=job.output_key))
        return True, {"id": request_id, "custom_id": job.custom_id, "error": None,
                      "response": {"status_code": 200, "request_id": job.id, "body": body}}
    error = line_error(job.error)
    status_code = int(error.get("status_code", 500 if job.status == JobStatus.FAILED else 499))
    return False, {"id": request_id, "custom_id": job.custom_id,
                   "response": {"status_code": status_code, "request_id": job.id, "body": {"error": error}},
                   "error": {"code": error.get("code"), "message": error.get("message")}}


def _unfinished(batch_id: str) -> Any:
    return exists().where(Job.batch_id == batch_id, Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))


def try_finalize(session: Session, *, batch_id: str, storage: Storage, force: bool = False) -> bool:
    """Finalize the batch if all its jobs are terminal; returns whether this call did it.

    `force` redoes a finalization whose writer died half-way (the reconciler uses it).
    """
    now = utcnow()
    # `finalizing` with no finalizing_at: a finalization that gave up on an outage, free to redo.
    starting = (Batch.status.in_((BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, BatchStatus.FINALIZING))
                & Batch.finalizing_at.is_(None))
    if force:
        starting = starting | (Batch.status == BatchStatus.FINALIZING) | (
            (Batch.status == BatchStatus.CANCELLING) & Batch.finalizing_at.is_not(None))
    claimed = session.execute(
        update(Batch).where(Batch.id == batch_id, starting, ~_unfinished(batch_id))
        .values(finalizing_at=now,
                status=_case_status())
        .returning(Batch.id, Batch.tenant, Batch.status, Batch.expired_at)
    ).one_or_none()
    session.commit()
    if claimed is None:
        return False
    _, tenant, status, expired_at = claimed
    final = (BatchStatus.EXPIRED if expired_at is not None
             else BatchStatus.CANCELLED if status == BatchStatus.CANCELLING else BatchStatus.COMPLETED)
    try:
        _write_files(session, batch_id=batch_id, tenant=tenant, final=final, storage=storage)
    except BaseException:
        # Storage or the database failed part-way: hand the finalization back at once (the next
        # reconciler pass redoes it) rather than leave it to go stale. The files are rewritten whole.
        session.rollback()
        try:
            session.execute(update(Batch).where(Batch.id == batch_id, Batch.finalizing_at == now)
                            .values(finalizing_at=None))
            session.commit()
        except Exception:  # the database is down too: the reconciler forces it once it is stale
            session.rollback()
        raise
    return True


def _write_files(session: Session, *, batch_id: str, tenant: str, final: BatchStatus, storage: Storage) -> None:
    ok_lines: list[str] = []
    err_lines: list[str] = []
    for job in session.execute(select(Job).where(Job.batch_id == batch_id).order_by(Job.created_at, Job.id)).scalars():
        ok, line = _result_line(job, storage)
        (ok_lines if ok else err_lines).append(json.dumps(line, ensure_ascii=False))
    files: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
    for column, lines, name in (("output_file_id", ok_lines, "output"), ("error_file_id", err_lines, "error")):
        if not lines:
            continue
        file_id = batch_result_file_id(batch_id, name)
        key = batch_result_key(tenant=tenant, batch_id=batch_id, name=name)
        data = ("\n".join(lines) + "\n").encode()
        storage.put(key, data, content_type="application/jsonl")
        if session.get(File, file_id) is None:
            session.add(File(id=file_id, tenant=tenant, purpose="batch_output" if name == "output" else
                             "batch_error", filename=f"{batch_id}_{name}.jsonl", bytes=len(data), storage_key=key,
                             created_at=utcnow()))
        files[column] = file_id
    done_at = {BatchStatus.CANCELLED: "cancelled_at", BatchStatus.COMPLETED: "completed_at"}.get(final)
    session.execute(update(Batch).where(Batch.id == batch_id).values(
        status=final, **files, **({done_at: utcnow()} if done_at else {})))
    # In the transaction of the final status: the event exists exactly when the status does.
    emit(session, tenant=tenant, event_type=f"batch.{final}", object_id=batch_id)
    session.commit()


def _case_status() -> Any:
    from sqlalchemy import case

    # A cancelling batch stays `cancelling` while its files are written, then becomes `cancelled`.
    return case((Batch.status == BatchStatus.CANCELLING, BatchStatus.CANCELLING), else_=BatchStatus.FINALIZING)
