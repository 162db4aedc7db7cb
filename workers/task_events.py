"""Celery task events for a micro-batch, so Flower sees what celery-batches runs outside Celery's
request path."""

from __future__ import annotations

import logging

from celery import Celery
from celery.worker import state as worker_state
from celery_batches import SimpleRequest

from yue2_jobs.queue import TASK_NAME

log = logging.getLogger(__name__)


def announce(app: Celery, node: str, requests: list[SimpleRequest], *, started: bool, runtime: float = 0.0,
              error: BaseException | None = None) -> None:
    """Task events and the worker's task counter for a micro-batch: celery-batches runs its
    requests outside Celery's request path, so without this Flower would see neither."""
    try:
        with app.events.default_dispatcher(hostname=node) as events:
            for r in requests:
                if started:
                    events.send("task-received", uuid=r.id, name=TASK_NAME, args=repr(r.args)[:200], kwargs="{}",
                                retries=0, eta=None, root_id=r.id, parent_id=None)
                    events.send("task-started", uuid=r.id)
                elif error is None:
                    events.send("task-succeeded", uuid=r.id, result="None", runtime=runtime)
                else:
                    events.send("task-failed", uuid=r.id, exception=repr(error), traceback="")
        if not started:
            worker_state.total_count[TASK_NAME] += len(requests)
            worker_state.all_total_count[0] += len(requests)
    except Exception:  # monitoring must never fail a batch
        log.warning("could not send task events", exc_info=True)
