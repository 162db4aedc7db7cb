"""Publishing after the response: the rows are committed, so a crash before this runs loses nothing
(the reconciler publishes queued jobs the broker does not hold)."""

from __future__ import annotations

import logging

from fastapi import BackgroundTasks

from yue2_jobs.api.deps import AppState
from yue2_jobs.queue import publish

log = logging.getLogger(__name__)


def _publish(state: AppState, jobs: list[tuple[str, str]]) -> None:
    try:
        with state.sessions() as session:
            publish(state.celery, session, jobs, chunk=state.settings.batch_max_jobs)
    except Exception:
        log.exception("publishing %d jobs failed; the reconciler will publish them", len(jobs))


def enqueue_later(background: BackgroundTasks, state: AppState, jobs: list[tuple[str, str]]) -> None:
    if jobs:
        background.add_task(_publish, state, jobs)
