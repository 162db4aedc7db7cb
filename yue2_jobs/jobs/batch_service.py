"""The batch actions of the API, one function each: submit, read, cancel. Each returns the batch
with its request counts (and, for a submit, what to enqueue and any warnings), so a route only
renders what it gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Batch
from yue2_jobs.jobs import service
from yue2_jobs.jobs.batches import try_finalize
from yue2_jobs.jobs.capacity import no_worker_warnings
from yue2_jobs.storage import Storage


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


def cancel(session: Session, *, tenant: str, batch_id: str, storage: Storage) -> BatchState:
    """Cancel the batch's queued jobs; when none is running, its files are written now."""
    batch = service.cancel_batch(session, tenant=tenant, batch_id=batch_id)
    if try_finalize(session, batch_id=batch.id, storage=storage):
        session.refresh(batch)
    return _state(session, batch)
