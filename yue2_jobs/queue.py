"""The Celery app on Redis (or kombu's filesystem transport), publishing, and looking into the broker.

A task message carries only a job id: Postgres holds the job. One queue per variant
(`yue2.<variant>`), because a worker process holds one model. The task id is
`<job id>:<random>`, so the reconciler can tell which jobs the broker still holds.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable

from celery import Celery
from sqlalchemy import update
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import utcnow

TASK_NAME = "yue2.run_jobs"


def queue_for(variant: str) -> str:
    return f"yue2.{variant}"


def make_celery(settings: Settings) -> Celery:
    app = Celery("yue2", broker=settings.broker_url, set_as_current=False)
    transport: dict[str, object] = {}
    if settings.broker_url.startswith("filesystem"):
        folder = settings.queue_dir
        (folder / "out").mkdir(parents=True, exist_ok=True)
        transport = {"data_folder_in": str(folder / "out"), "data_folder_out": str(folder / "out"),
                     "store_processed": False, "polling_interval": 0.05}
    else:
        transport = {"visibility_timeout": settings.visibility_timeout_s}
    app.conf.update(
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # celery-batches buffers requests itself; a finite multiplier makes every batch wait out
        # its flush interval.
        worker_prefetch_multiplier=0,
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        worker_send_task_events=True,
        task_send_sent_event=False,
        broker_pool_limit=4,
    )
    return app


def task_id_for(job_id: str) -> str:
    return f"{job_id}:{secrets.token_hex(4)}"


def publish(app: Celery, session: Session, jobs: Iterable[tuple[str, str]]) -> int:
    """Send one task per (job id, variant) on one producer connection, then stamp `enqueued_at`."""
    sent: list[str] = []
    with app.producer_or_acquire() as producer:
        for job_id, variant in jobs:
            app.send_task(TASK_NAME, args=[job_id], queue=queue_for(variant), task_id=task_id_for(job_id),
                          producer=producer)
            sent.append(job_id)
    now = utcnow()
    for start in range(0, len(sent), 5000):
        session.execute(update(Job).where(Job.id.in_(sent[start:start + 5000])).values(enqueued_at=now))
    session.commit()
    return len(sent)


def _job_id_of_message(raw: str | bytes) -> str | None:
    try:
        payload = json.loads(raw)
        if isinstance(payload, list):  # the unacked hash stores [message, exchange, routing_key]
            payload = payload[0]
        task_id = payload.get("headers", {}).get("id")
    except (ValueError, AttributeError, IndexError):
        return None
    return task_id.split(":", 1)[0] if isinstance(task_id, str) else None


def jobs_in_broker(settings: Settings, variants: Iterable[str], *, delivered_within_s: float) -> set[str]:
    """Ids of the jobs the broker holds: waiting in a queue, or delivered less than
    `delivered_within_s` ago and not yet acknowledged.

    An older unacknowledged delivery may belong to a worker that was killed: Redis would hand it
    out again only after the visibility timeout (hours), so the reconciler does not count it.
    """
    held: set[str] = set()
    if settings.broker_url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(settings.broker_url)
        try:
            for variant in variants:
                for raw in client.lrange(queue_for(variant), 0, -1):
                    held.add(_job_id_of_message(raw) or "")
            recent = client.zrangebyscore("unacked_index", time.time() - delivered_within_s, "+inf")
            if recent:
                for raw in client.hmget("unacked", recent):
                    if raw is not None:
                        held.add(_job_id_of_message(raw) or "")
        finally:
            client.close()
    elif settings.broker_url.startswith("filesystem"):
        # The filesystem transport deletes a message when it is delivered: only waiting ones are here.
        for path in (settings.queue_dir / "out").glob("*.msg"):
            try:
                held.add(_job_id_of_message(path.read_bytes()) or "")
            except FileNotFoundError:  # consumed while we looked
                continue
    else:
        raise ValueError(f"cannot inspect broker {settings.broker_url!r}; use redis:// or filesystem://")
    held.discard("")
    return held


__all__ = ["TASK_NAME", "jobs_in_broker", "make_celery", "publish", "queue_for"]
