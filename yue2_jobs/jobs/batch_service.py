"""The batch actions of the API, one function each: submit, read, list, cancel, retry the failed
lines. Each returns the batch with its request counts (and, for a submit, what to enqueue and
any warnings), so a route only renders what it gets."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, BinaryIO, cast

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.core.safe import check_text
from yue2_jobs.db.listing import page
from yue2_jobs.db.models import Batch, BatchStatus, Job, JobStatus
from yue2_jobs.db.session import affected, utcnow
from yue2_jobs.errors import ConflictError, LimitExceededError, NotFoundError
from yue2_jobs.jobs import service
from yue2_jobs.jobs.batches import try_finalize
from yue2_jobs.jobs.capacity import no_worker_warnings
from yue2_jobs.jobs.files import create_file, get_file
from yue2_jobs.jobs.lines import iter_batch_lines, max_line_bytes, stream_lines
from yue2_jobs.storage import SPOOL_BYTES, Storage

ENDED = (BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED, BatchStatus.FAILED)
MAX_METADATA_PAIRS = 16
MAX_SEARCH_CHARS = 512  # `search` in the batch list: as long as a metadata value may be
RETRY_CLAIM = timedelta(minutes=10)  # longer than creating a retry takes; an older claim's creator died


@dataclass
class BatchState:
    batch: Batch
    counts: dict[str, int]
    to_enqueue: list[tuple[str, str]] = field(default_factory=list)  # (job id, variant), published after commit
    warnings: list[str] = field(default_factory=list)


def _state(session: Session, batch: Batch, **extra: Any) -> BatchState:
    return BatchState(batch=batch, counts=service.request_counts(session, batch.id), **extra)


def submit(session: Session, *, tenant: str, input_file_id: str, endpoint: str, completion_window: str,
           metadata: dict[str, Any] | None, experiment_id: str | None, settings: Settings,
           storage: Storage) -> BatchState:
    """Create the batch and its jobs; a batch whose every line was rejected is finished at once."""
    batch, to_enqueue = service.create_batch(
        session, tenant=tenant, input_file_id=input_file_id, endpoint=endpoint, completion_window=completion_window,
        metadata=metadata, settings=settings, storage=storage, experiment_id=experiment_id)
    if not to_enqueue:  # nothing will run
        try_finalize(session, batch_id=batch.id, storage=storage)
        session.refresh(batch)
    return _state(session, batch, to_enqueue=to_enqueue,
                  warnings=no_worker_warnings(session, {variant for _, variant in to_enqueue}))


def read(session: Session, *, tenant: str, batch_id: str) -> BatchState:
    return _state(session, service.get_batch(session, tenant=tenant, batch_id=batch_id))


def list_batches(session: Session, *, tenant: str, limit: int, after: str | None,
                 search: str | None = None) -> tuple[list[BatchState], bool]:
    """A page of the tenant's batches, newest first, and whether more follow; with `search`, only
    those whose id, `metadata.name` or `metadata.source` (the names the console shows) contains it,
    whatever the case."""
    found = page(session, Batch, tenant=tenant, limit=limit, after=after, where=_matching(search))
    counts = service.request_counts_of(session, [b.id for b in found.rows])
    return [BatchState(batch=b, counts=counts[b.id]) for b in found.rows], found.has_more


def _matching(search: str | None) -> tuple[Any, ...]:
    if not search:
        return ()
    # As every other text field: a NUL would reach Postgres as an unnamed 400 (or pass SQLite unseen).
    check_text(search, field="search", max_chars=MAX_SEARCH_CHARS, status=400)
    # `autoescape`: a % or _ typed in the box is that character, not a wildcard.
    return (or_(Batch.id.icontains(search, autoescape=True),
                Batch.metadata_["name"].as_string().icontains(search, autoescape=True),
                Batch.metadata_["source"].as_string().icontains(search, autoescape=True)),)


def cancel(session: Session, *, tenant: str, batch_id: str, storage: Storage) -> BatchState:
    """Cancel the batch's queued jobs; when none is running, its files are written now."""
    batch = service.cancel_batch(session, tenant=tenant, batch_id=batch_id)
    if try_finalize(session, batch_id=batch.id, storage=storage):
        session.refresh(batch)
    return _state(session, batch)


def _unfinished_custom_ids(session: Session, batch_id: str) -> set[str]:
    """custom_ids of the lines with no result: failed, expired or cancelled (an expired line is a
    cancelled job coded `batch_expired`)."""
    return {c for c in session.execute(select(Job.custom_id).where(
        Job.batch_id == batch_id, Job.status.in_((JobStatus.FAILED, JobStatus.CANCELLED)))).scalars() if c is not None}


def _claim_retry(session: Session, original: Batch) -> None:
    """Mark `original` as being retried, or refuse: a batch is retried at most once at a time (while
    its retry is being created, or runs). The row lock comes first and the checks after it, each a
    statement of its own, so they see what a concurrent retry committed while this one waited."""
    now = utcnow()
    session.execute(select(Batch.id).where(Batch.id == original.id).with_for_update())
    running = session.execute(select(Batch.id).where(Batch.retry_of == original.id,
                                                     Batch.status.not_in(ENDED))).scalar()
    if running is not None:
        session.rollback()
        raise ConflictError(f"batch {original.id!r} is already being retried by batch {running!r}; retry it again "
                            f"once that batch has ended")
    took = affected(session.execute(update(Batch).where(
        Batch.id == original.id, or_(Batch.retrying_since.is_(None), Batch.retrying_since < now - RETRY_CLAIM))
        .values(retrying_since=now)))
    session.commit()
    if not took:
        raise ConflictError(f"batch {original.id!r} is already being retried; its retry batch is being created")


def retry_failed(session: Session, *, tenant: str, batch_id: str, settings: Settings, storage: Storage) -> BatchState:
    """A new batch of the ended batch's lines without a result (failed, expired, or cancelled before
    they ran): the same lines byte for byte (so the same bodies and custom_ids), under the same
    endpoint and experiment, with `metadata.retry_of`.
    Refused (409) while another retry of the batch is being created or has not ended."""
    original = service.get_batch(session, tenant=tenant, batch_id=batch_id)
    if original.status not in ENDED:
        raise ConflictError(f"batch {batch_id!r} is {original.status}; retry its failed lines once it has ended")
    wanted = _unfinished_custom_ids(session, original.id)
    if not wanted:
        raise ConflictError(f"batch {batch_id!r} has no failed, expired or cancelled lines to retry")
    _claim_retry(session, original)
    let_go = update(Batch).where(Batch.id == original.id).values(retrying_since=None)
    try:
        retried = _submit_retry(session, original, wanted, tenant=tenant, settings=settings, storage=storage)
    except BaseException:
        session.rollback()
        session.execute(let_go)
        session.commit()
        raise
    # The link and the claim's end in one commit: there is never a moment with neither.
    session.execute(update(Batch).where(Batch.id == retried.batch.id).values(retry_of=original.id))
    session.execute(let_go)
    session.commit()
    return retried


def _remember(lines: Iterator[tuple[int, int, bytes]], raw: dict[tuple[int, int], bytes]
              ) -> Iterator[tuple[int, int, bytes]]:
    """`lines`, each also kept in `raw` by its span until the parser's line for it is handled."""
    for start, end, data in lines:
        raw[(start, end)] = data
        yield start, end, data


def _submit_retry(session: Session, original: Batch, wanted: set[str], *, tenant: str, settings: Settings,
                  storage: Storage) -> BatchState:
    try:
        source = get_file(session, tenant=tenant, file_id=original.input_file_id)
    except NotFoundError:
        raise ConflictError(f"the input file {original.input_file_id!r} of batch {original.id!r} was deleted; "
                            f"upload the lines again") from None
    metadata = {**(original.metadata_ or {}), "retry_of": original.id}
    if len(metadata) > MAX_METADATA_PAIRS:
        raise LimitExceededError(field="metadata", limit=MAX_METADATA_PAIRS, actual=len(metadata),
                                 unit="pairs (the original's and retry_of)", status=400)
    # The wanted lines, byte for byte, into a spooled file (on disk past a few MB), read a piece at a time.
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as out:
        raw_lines: dict[tuple[int, int], bytes] = {}
        reader = storage.open(source.storage_key)
        try:
            numbered = _remember(stream_lines(reader, max_bytes=max_line_bytes(settings)), raw_lines)
            for ln in iter_batch_lines(numbered, endpoint=original.endpoint, settings=settings,
                                       in_experiment=original.experiment_id is not None):
                raw = raw_lines.pop(ln.span)
                if ln.custom_id in wanted:
                    out.write(raw + b"\n")
        finally:
            reader.close()
        out.seek(0)
        f = create_file(session, tenant=tenant, filename=f"{original.id}_retry.jsonl", purpose="batch",
                        data=cast(BinaryIO, out), storage=storage)
    return submit(session, tenant=tenant, input_file_id=f.id, endpoint=original.endpoint,
                  completion_window=original.completion_window, metadata=metadata,
                  experiment_id=original.experiment_id, settings=settings, storage=storage)
