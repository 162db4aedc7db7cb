"""The broker messages this worker holds: received, not yet acknowledged.

Redis keeps such a message in kombu's `unacked` hash, with no word of which consumer has it, and
hands it out again only after the visibility timeout. So each worker lists the delivery tags it
receives in its own set (`queue.held_key(node)`); when the worker dies, whoever notices
(`jobs.dead_workers`) puts exactly those messages back. A tag is added after kombu has put the
message in `unacked` (so the set never names a message Redis does not hold as delivered) and
pruned once it has left `unacked` (acknowledged); a stale tag only costs a lookup.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from yue2_jobs.queue import UNACKED, held_key

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)


class HeldDeliveries:
    """The set of delivery tags worker `node` holds (only on a Redis broker; a no-op otherwise)."""

    def __init__(self, broker_url: str, node: str) -> None:
        self.key = held_key(node)
        self.client: redis.Redis | None = None
        if broker_url.startswith(("redis://", "rediss://")):
            import redis

            self.client = redis.Redis.from_url(broker_url, socket_connect_timeout=5, socket_timeout=5)

    def received(self, tag: str) -> None:
        """Called on every message the worker receives (Celery's task_received signal)."""
        if self.client is None:
            return
        try:
            self.client.sadd(self.key, tag)
        except Exception as exc:  # Redis is down: the message comes back after the visibility timeout
            log.warning("could not note delivery %s as held: %s", tag, type(exc).__name__)

    def prune(self) -> int:
        """Drop the tags that were acknowledged; returns how many are still held."""
        if self.client is None:
            return 0
        tags = list(self.client.smembers(self.key))
        if not tags:
            return 0
        present = self.client.hmget(UNACKED, tags)
        gone = [t for t, raw in zip(tags, present, strict=True) if raw is None]
        if gone:
            self.client.srem(self.key, *gone)
        return len(tags) - len(gone)

    def clear(self) -> None:
        """On a warm shutdown: Celery has put back what this worker did not finish."""
        if self.client is not None:
            self.client.delete(self.key)

    def connect(self) -> None:
        """Note each message this process receives, from now on."""
        from celery.signals import task_received

        @task_received.connect(weak=False)
        def _noted(request: object = None, **_: object) -> None:  # Celery passes its Request, untyped
            tag = getattr(getattr(request, "message", None), "delivery_tag", None)
            if tag is not None:
                self.received(str(tag))
