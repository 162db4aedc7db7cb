"""Finishing a batch: once no job of it is queued or running, write its output and error files.

The files are JSONL in the OpenAI Batch shape (one line per request, matched on `custom_id`):
succeeded jobs go to the output file, failed and cancelled ones to the error file. Only one
caller wins the conditional UPDATE that starts finalizing; the file keys are deterministic, so a
finalization redone after a crash rewrites the same objects.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any, BinaryIO, cast

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from yue2_jobs.db.models import Batch, BatchStatus, File, Job, JobStatus
from yue2_jobs.db.session import utcnow
from yue2_jobs.jobs.keys import batch_result_file_id, batch_result_key
from yue2_jobs.jobs.outputs import facts_of, output_body, read_body, read_text
from yue2_jobs.storage import SPOOL_BYTES, Storage
from yue2_jobs.webhooks.events import emit


def line_error(error: dict[str, Any] | None) -> dict[str, Any]:
    """A line's error as its error-file line gives it; a line cancelled before it ran has none stored."""
    return error or {"code": "cancelled", "message": "the batch was cancelled before this request ran"}


def _result_line(job: Any, storage: Storage) -> tuple[bool, dict[str, Any]]:
    """One request's line in the output or error file, from its job's row (the `RESULT_COLUMNS`)."""
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


RESULT_COLUMNS = ("id", "custom_id", "kind", "status", "variant", "checkpoint", "params", "output_key",
                  "output_text", "error", "input_tokens", "input_tokens_used", "output_tokens", "decoder_steps",
                  "nar_tokens", "decoded_mode", "chunks", "input_truncated")  # not the inputs: they can be large


def _write_files(session: Session, *, batch_id: str, tenant: str, final: BatchStatus, storage: Storage) -> None:
    """The batch's output and error files, written a line at a time to spooled files (on disk past
    a few MB) from rows read a thousand at a time, then streamed to storage: memory does not grow
    with the batch."""
    table = Job.__table__.c
    rows = session.execute(select(*(table[c] for c in RESULT_COLUMNS)).where(table.batch_id == batch_id)
                           .order_by(table.created_at, table.id).execution_options(yield_per=1000))
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as ok_file, tempfile.SpooledTemporaryFile(SPOOL_BYTES) as err_file:
        for job in rows:
            ok, line = _result_line(job, storage)
            (ok_file if ok else err_file).write(json.dumps(line, ensure_ascii=False).encode() + b"\n")
        session.commit()  # ends the read (a server-side cursor on Postgres)
        files: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
        for column, spooled, name in (("output_file_id", ok_file, "output"), ("error_file_id", err_file, "error")):
            size = spooled.tell()
            if not size:
                continue
            spooled.seek(0)
            file_id = batch_result_file_id(batch_id, name)
            key = batch_result_key(tenant=tenant, batch_id=batch_id, name=name)
            storage.put_stream(key, cast(BinaryIO, spooled), content_type="application/jsonl")
            if session.get(File, file_id) is None:
                session.add(File(id=file_id, tenant=tenant, purpose="batch_output" if name == "output" else
                                 "batch_error", filename=f"{batch_id}_{name}.jsonl", bytes=size, storage_key=key,
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
