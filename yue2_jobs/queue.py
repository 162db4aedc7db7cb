"""The Celery app on Redis (or kombu's filesystem transport), publishing, and looking into the broker.

A task message carries only job ids (one, or a chunk of a batch's, so that publishing 10,000
jobs costs a few hundred broker round trips); Postgres holds the jobs. One queue per variant
(`yue2.<variant>`), because a worker process holds one model.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import cast

from celery import Celery
from sqlalchemy import update
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import utcnow

TASK_NAME = "yue2.run_jobs"
# kombu's Redis transport keeps each delivered, unacknowledged message here (delivery tag ->
# [message, exchange, routing key]), with the delivery time in UNACKED_INDEX.
UNACKED, UNACKED_INDEX = "unacked", "unacked_index"


def queue_for(variant: str) -> str:
    return f"yue2.{variant}"


def make_celery(settings: Settings) -> Celery:
    app = Celery("yue2", broker=settings.broker_url, set_as_current=False)
    transport: dict[str, object] = {}
    if settings.broker_url.startswith("filesystem"):
        folder = settings.queue_dir
        (folder / "out").mkdir(parents=True, exist_ok=True)
        (folder / "control").mkdir(parents=True, exist_ok=True)
        # control_folder defaults to ./control: the exchange tables would land wherever the process runs.
        transport = {"data_folder_in": str(folder / "out"), "data_folder_out": str(folder / "out"),
                     "control_folder": str(folder / "control"), "store_processed": False, "polling_interval": 0.05}
    else:
        transport = {"visibility_timeout": settings.visibility_timeout_s}
    app.conf.update(
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # celery-batches flushes when its buffer holds `flush_every` (= batch_max_jobs) requests: a
        # window of exactly that many flushes at once instead of waiting out the flush interval.
        # More only lets one process take more of the backlog than its next micro-batch (unlimited,
        # 0, would let it hoard the whole backlog unacked, celery#5935); a dead process's deliveries
        # go back to their queue at once (`restore_held`).
        worker_prefetch_multiplier=settings.batch_max_jobs,
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


def publish(app: Celery, session: Session, jobs: Iterable[tuple[str, str]], *, chunk: int = 1) -> int:
    """Send (job id, variant) pairs as tasks of up to `chunk` ids each on one producer connection,
    then stamp `enqueued_at`."""
    by_variant: dict[str, list[str]] = defaultdict(list)
    for job_id, variant in jobs:
        by_variant[variant].append(job_id)
    sent: list[str] = []
    with app.producer_or_acquire() as producer:
        for variant, ids in by_variant.items():
            for start in range(0, len(ids), chunk):
                part = ids[start:start + chunk]
                app.send_task(TASK_NAME, args=[part], queue=queue_for(variant),
                              task_id=f"{part[0]}+{len(part)}:{secrets.token_hex(4)}", producer=producer)
                sent.extend(part)
    now = utcnow()
    for start in range(0, len(sent), 5000):
        session.execute(update(Job).where(Job.id.in_(sent[start:start + 5000])).values(enqueued_at=now))
    session.commit()
    return len(sent)


def job_ids_of_message(raw: str | bytes) -> list[str]:
    """The job ids a raw kombu message (as Redis or the filesystem transport store it) carries."""
    try:
        payload = json.loads(raw)
        if isinstance(payload, list):  # the unacked hash stores [message, exchange, routing_key]
            payload = payload[0]
        body = payload["body"]
        if payload.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        ids = args[0]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return []
    return [ids] if isinstance(ids, str) else [i for i in ids if isinstance(i, str)]


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
                    held.update(job_ids_of_message(raw))
            # Without scores, a sorted-set range is a list of members.
            recent = cast("list[bytes]", client.zrangebyscore(UNACKED_INDEX, time.time() - delivered_within_s, "+inf"))
            if recent:
                for message in client.hmget(UNACKED, recent):
                    if message is not None:
                        held.update(job_ids_of_message(message))
        finally:
            client.close()
    elif settings.broker_url.startswith("filesystem"):
        # The filesystem transport deletes a message when it is delivered: only waiting ones are here.
        for path in (settings.queue_dir / "out").glob("*.msg"):
            try:
                held.update(job_ids_of_message(path.read_bytes()))
            except FileNotFoundError:  # consumed while we looked
                continue
    else:
        raise ValueError(f"cannot inspect broker {settings.broker_url!r}; use redis:// or filesystem://")
    return held


EPOCH_KEY = "yue2:broker-epoch"


def broker_epoch(settings: Settings, *, create: bool = True) -> float | None:
    """When the broker's data began (Unix time): a key in the broker's own Redis database, set by the
    first process to ask after it was missing. A `FLUSHDB` or a fresh server without the old data
    (a restart without persistence, a failover to an empty replica) takes the key with the
    messages, so a job published before the epoch has no message unless it was published again
    since (`reconciler`: such jobs are republished at once, not after the grace or a lease).
    `create=False` only looks (None: missing); the filesystem broker has no epoch (None)."""
    if not settings.broker_url.startswith("redis"):
        return None
    import redis

    client = redis.Redis.from_url(settings.broker_url)
    try:
        if create:
            client.set(EPOCH_KEY, repr(time.time()), nx=True)
        raw = client.get(EPOCH_KEY)
    finally:
        client.close()
    return None if raw is None else float(raw)


def held_key(node: str) -> str:
    """Redis set of the delivery tags worker `node` received and has not acknowledged (as far as it
    knows: an acknowledged tag leaves the set at the worker's next prune)."""
    return f"yue2:held:{node}"


def restore_held(app: Celery, settings: Settings, node: str) -> int:
    """Put the messages worker `node` received and never acknowledged back into their queues, next in
    line, and forget its set; returns how many went back. For a worker known to be dead: Redis itself
    would hand them out again only after the visibility timeout (hours)."""
    if not settings.broker_url.startswith("redis"):
        return 0  # the filesystem transport deletes a message on delivery; the reconciler republishes
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        client = channel.client
        restored = 0
        tags = list(client.smembers(held_key(node)))
        for raw in tags:
            tag = raw.decode() if isinstance(raw, bytes) else raw
            if client.hexists(channel.unacked_key, tag):
                # kombu's own restore (one transaction: off the unacked hash, onto the queue's consuming
                # end, flagged redelivered); a tag acknowledged meanwhile is only dropped from the index.
                channel.qos.restore_by_tag(tag, client=client, leftmost=False)
                restored += 1
        if tags:  # only what was read: a tag a live holder of the name added meanwhile stays
            client.srem(held_key(node), *tags)
    return restored


def queue_depth(settings: Settings, variant: str) -> int:
    """Messages waiting in a variant's queue (one message carries one to `batch_max_jobs` job ids)."""
    if settings.broker_url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(settings.broker_url)
        try:
            return int(client.llen(queue_for(variant)))
        finally:
            client.close()
    if settings.broker_url.startswith("filesystem"):
        return sum(1 for _ in (settings.queue_dir / "out").glob("*.msg"))
    return 0


__all__ = ["TASK_NAME", "UNACKED", "held_key", "jobs_in_broker", "make_celery", "publish", "queue_depth", "queue_for",
           "restore_held"]
