"""A few items of an eval set side by side: the input (an excerpt), each arm's output and the
reference, so a reader sees what the scores score.

The items are spread evenly over the set in custom_id order (digits compared as numbers), never
chosen by their scores, so they show the set as it is rather than its best or worst cases.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from yue2_jobs.db.models import Job, JobStatus
from yue2_jobs.errors import StorageError, StorageUnavailableError
from yue2_jobs.jobs.inputs import read_input
from yue2_jobs.jobs.outputs import read_text
from yue2_jobs.storage import Storage

SHOWN = 5  # items per eval set
INPUT_CHARS = 280  # of each input, the excerpt shown
OUTPUT_CHARS = 400  # an output or reference longer than this is cut (the shipped ones are far shorter)


class Item(Protocol):
    """What picking needs of a job record (`report.JobRecord`)."""

    job_id: str
    batch_id: str
    custom_id: str
    variant: str


def _natural(key: tuple[str, str]) -> tuple[str, list[tuple[int, str]]]:
    """`legal-2` before `legal-10`: runs of digits compare as numbers."""
    return key[0], [(int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"(\d+)", key[1])]


def pick(records: Sequence[Item], n: int = SHOWN) -> list[tuple[str, str]]:
    """`n` (batch_id, custom_id) keys spread evenly over the set's items (the first and the last
    included), in custom_id order."""
    keys = sorted({(r.batch_id, r.custom_id) for r in records}, key=_natural)
    if len(keys) <= n:
        return keys
    return [keys[round(i * (len(keys) - 1) / (n - 1))] for i in range(n)] if n > 1 else keys[:1]


GONE = "(no longer stored)"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit].rstrip() + "…"


def _stored(read: Callable[[], str], limit: int) -> str:
    """A text read from storage, cut; GONE for one deleted since (DELETE /v1/files removes a batch's
    input file, whose lines the jobs' inputs may be). An outage is not that: it propagates."""
    try:
        return _cut(read(), limit)
    except StorageUnavailableError:
        raise
    except StorageError:
        return GONE


def examples(session: Session, storage: Storage, records: Sequence[Item], variants: list[str],
             n: int = SHOWN) -> list[dict[str, Any]]:
    """Each picked item: its custom_id, input excerpt, reference, and each variant's output (None
    where that variant has no succeeded job for it: it failed, or a `split` experiment ran the item
    on another variant)."""
    keys = pick(records, n)
    chosen = set(keys)
    ids = {(r.batch_id, r.custom_id, r.variant): r.job_id for r in records if (r.batch_id, r.custom_id) in chosen}
    rows = {j.id: j for j in session.execute(select(Job).where(Job.id.in_(list(ids.values())))).scalars()}
    out = []
    for batch_id, custom_id in keys:
        jobs = {v: rows.get(ids.get((batch_id, custom_id, v), "")) for v in variants}
        first = next((j for j in jobs.values() if j is not None), None)
        out.append({
            "custom_id": custom_id,
            "input": _stored(partial(read_input, storage, input_text=first.input_text, input_key=first.input_key,
                                     kind=first.kind), INPUT_CHARS) if first is not None else "",
            "reference": _cut(first.reference, OUTPUT_CHARS) if first is not None and first.reference else None,
            "outputs": {v: _stored(partial(read_text, storage, output_text=j.output_text, output_key=j.output_key),
                                   OUTPUT_CHARS)
                        if j is not None and j.status == JobStatus.SUCCEEDED else None for v, j in jobs.items()}})
    return out
