"""Files of the OpenAI Files API: upload, read, list, delete.

A deleted file keeps its row (batches name it) with `deleted_at` set, and its object is removed;
every read treats it as gone. A file that a live batch reads from cannot be deleted: the row lock
taken here and the share lock `create_batch` takes make "delete" and "start a batch on it" one
after the other, never interleaved.
"""

from __future__ import annotations

import hashlib
import io
import logging
from dataclasses import dataclass
from typing import BinaryIO

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from yue2_jobs.core.ids import new_id
from yue2_jobs.core.safe import check_text, require_id
from yue2_jobs.db.listing import Order, Page, page
from yue2_jobs.db.models import Batch, BatchStatus, File
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import ConflictError, InvalidRequestError, LimitExceededError, NotFoundError
from yue2_jobs.jobs.keys import upload_key
from yue2_jobs.jobs.lines import MAX_FILENAME_CHARS, stream_lines
from yue2_jobs.storage import Storage

log = logging.getLogger(__name__)
PURPOSES = ("batch", "batch_output", "batch_error")
LIVE_BATCH = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING)


@dataclass(frozen=True)
class Measured:
    """An upload's size, SHA-256 (the idempotency fingerprint's) and non-blank line count."""

    size: int
    sha256: str
    lines: int


class _Counting:
    """A reader that hashes and counts what passes through it, and stops past `max_bytes`."""

    def __init__(self, stream: BinaryIO, max_bytes: int) -> None:
        self.stream, self.max_bytes, self.size, self.digest = stream, max_bytes, 0, hashlib.sha256()

    def read(self, n: int) -> bytes:
        chunk = self.stream.read(n)
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise LimitExceededError(field="file", limit=self.max_bytes, actual=self.size, unit="bytes",
                                     at_least=True)
        self.digest.update(chunk)
        return chunk

    def close(self) -> None:
        pass


def measure(stream: BinaryIO, *, max_bytes: int) -> Measured:
    """One pass over an upload, a piece at a time, then back to its start; a file over `max_bytes`
    is refused as soon as it is read past them."""
    counting = _Counting(stream, max_bytes)
    lines = sum(1 for _ in stream_lines(counting, max_bytes=1))  # counted, not kept
    stream.seek(0)
    return Measured(size=counting.size, sha256=counting.digest.hexdigest(), lines=lines)


def create_file(session: Session, *, tenant: str, filename: str, purpose: str, data: bytes | BinaryIO,
                storage: Storage, file_id: str | None = None, measured: Measured | None = None) -> File:
    """A new file from `data` (bytes, or a stream at its start: it is copied to storage a part at a
    time); `measured`: what `measure` found, when the caller has it already."""
    if purpose != "batch":
        raise InvalidRequestError(f"purpose {purpose!r} is not supported; use 'batch'", field="purpose", status=400)
    check_text(filename, field="filename", max_chars=MAX_FILENAME_CHARS, status=400)
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    measured = measured or measure(stream, max_bytes=2**62)
    file_id = file_id or new_id("file-")
    key = upload_key(tenant=tenant, file_id=file_id)
    f = File(id=file_id, tenant=tenant, purpose=purpose, filename=filename, bytes=measured.size,
             lines=measured.lines, storage_key=key, created_at=utcnow())
    session.add(f)
    session.flush()  # the row can be written: only now may its object be
    try:
        storage.put_stream(key, stream, content_type="application/jsonl")
    except BaseException:
        session.rollback()
        raise
    session.commit()
    return f


def get_file(session: Session, *, tenant: str, file_id: str, lock: str | None = None) -> File:
    """The tenant's file, not deleted; `lock` `share` or `update` locks its row until the commit."""
    require_id(file_id, what="file")
    stmt = select(File).where(File.id == file_id, File.tenant == tenant, File.deleted_at.is_(None))
    if lock is not None:
        stmt = stmt.with_for_update(read=lock == "share")
    f = session.execute(stmt).scalar_one_or_none()
    if f is None:
        raise NotFoundError(f"no file {file_id!r}")
    return f


def list_files(session: Session, *, tenant: str, limit: int, after: str | None, order: Order,
               purpose: str | None) -> Page[File]:
    if purpose is not None and purpose not in PURPOSES:
        raise InvalidRequestError(f"purpose must be one of {list(PURPOSES)}; got {purpose!r}", field="purpose",
                                  status=400)
    where = (File.deleted_at.is_(None), *((File.purpose == purpose,) if purpose else ()))
    return page(session, File, tenant=tenant, limit=limit, after=after, order=order, where=where)


def delete_file(session: Session, *, tenant: str, file_id: str, storage: Storage) -> File:
    """Delete the file's object and mark its row deleted; 409 while a live batch reads it."""
    f = get_file(session, tenant=tenant, file_id=file_id, lock="update")
    live = session.execute(select(Batch.id).where(Batch.input_file_id == f.id, Batch.status.in_(LIVE_BATCH))
                           .limit(1)).scalar_one_or_none()
    if live is not None:
        session.rollback()
        raise ConflictError(f"file {file_id!r} is the input of batch {live!r}, which is still running; cancel it "
                            f"or wait for it to end")
    session.execute(update(File).where(File.id == f.id).values(deleted_at=utcnow()))
    session.commit()
    # The row says deleted before the object goes: a failure here leaves an orphan object, never a
    # file that lists but cannot be read.
    try:
        storage.delete(f.storage_key)
    except Exception:
        log.exception("deleted file %s: its object %s could not be removed", f.id, f.storage_key)
    session.refresh(f)
    return f

