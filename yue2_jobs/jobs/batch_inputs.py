"""A finished batch's input texts, read back from storage: what `yue2 train-drafter --batch` trains
a drafter on, so the pipeline learns to draft its own traffic.

The lines are read with the parser that admitted them (`lines.iter_batch_lines`), so a text is
exactly what a worker decoded; lines that failed validation, and render jobs, are left out.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.core.safe import require_id
from yue2_jobs.db.models import Batch, BatchStatus, File
from yue2_jobs.errors import ConflictError, NotFoundError
from yue2_jobs.jobs.lines import iter_batch_lines, max_line_bytes, stream_lines
from yue2_jobs.storage import Storage

ENDED = (BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
TEXT_KINDS = ("summarize", "generate")


def iter_batch_texts(session: Session, *, storage: Storage, settings: Settings, batch_id: str) -> Iterator[str]:
    """The input text of each valid text line of batch `batch_id`, in file order. The batch must have
    ended (completed, expired or cancelled) and its input file must still exist."""
    require_id(batch_id, what="batch")
    batch = session.get(Batch, batch_id)
    if batch is None:
        raise NotFoundError(f"no batch {batch_id!r}")
    if batch.status not in ENDED:
        raise ConflictError(f"batch {batch_id} is {batch.status}; train on a batch that has ended "
                            f"({', '.join(ENDED)})")
    file = session.get(File, batch.input_file_id)
    if file is None or file.deleted_at is not None:
        raise NotFoundError(f"the input file {batch.input_file_id} of batch {batch_id} was deleted")
    reader = storage.open(file.storage_key)
    try:
        lines = stream_lines(reader, max_bytes=max_line_bytes(settings))
        for parsed in iter_batch_lines(lines, endpoint=batch.endpoint, settings=settings):
            if parsed.job is not None and parsed.job.kind in TEXT_KINDS:
                yield parsed.job.text
    finally:
        reader.close()
