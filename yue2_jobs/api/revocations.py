"""Revoked API keys reach every API process within a second: `yue2 apikey revoke` publishes the
key's hash on Redis, and each process's listener drops it from its cache (`yue2_jobs.auth`).

The cache is trusted for long only while the listener is subscribed. When the subscription breaks,
the listener marks the cache unlistened and clears it, so a revocation sent meanwhile cannot be
missed for longer than `auth.UNLISTENED_TTL_S`.
"""

from __future__ import annotations

import logging
import threading

from yue2_jobs.auth import CACHE

log = logging.getLogger(__name__)
_started: dict[str, threading.Thread] = {}
_lock = threading.Lock()


def is_redis(url: str) -> bool:
    return url.startswith(("redis://", "rediss://"))


def channel_for(broker_url: str) -> str:
    """The deployment's revocation channel. Redis pub/sub ignores database numbers, so a channel
    shared by every deployment on one Redis would tell each of them the others' revocations; a
    deployment is its broker database (its queues live there too), so the number names the channel."""
    from redis.connection import parse_url

    return f"yue2:{int(parse_url(broker_url).get('db') or 0)}:apikeys:revoked"


def announce(broker_url: str, key_hash: str) -> int:
    """Tell every listening API process; returns how many received it (0 without Redis)."""
    if not is_redis(broker_url):
        return 0
    import redis

    with redis.Redis.from_url(broker_url, socket_connect_timeout=5, socket_timeout=5) as r:
        return int(r.publish(channel_for(broker_url), key_hash))


def _listen(broker_url: str, *, subscribed: threading.Event) -> None:
    import redis

    r = redis.Redis.from_url(broker_url, socket_connect_timeout=5, socket_timeout=10, health_check_interval=5)
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(channel_for(broker_url))
        pubsub.get_message(timeout=5)  # the subscription's confirmation
        # Whatever was cached before the subscription may have been revoked unheard.
        CACHE.clear()
        CACHE.listening = True
        subscribed.set()
        while True:
            message = pubsub.get_message(timeout=1.0)
            if message is not None and message.get("type") == "message":
                data = message["data"]
                CACHE.forget(data.decode() if isinstance(data, bytes) else str(data))
            pubsub.check_health()
    finally:
        CACHE.listening = False
        CACHE.clear()
        pubsub.close()
        r.close()


RETRY_S = 1.0  # between a broken subscription and the next attempt


class OutageLog:
    """One warning per outage, not one a second while Redis stays away (a broker being replaced,
    a test's own server after its run); the retries of an outage already reported log at debug."""

    def __init__(self) -> None:
        self.reported = False

    def failed(self, exc: BaseException, *, was_listening: bool) -> None:
        """A subscription attempt ended with `exc`; `was_listening`: it had subscribed first."""
        if was_listening:
            self.reported = False  # a new outage
        log.log(logging.DEBUG if self.reported else logging.WARNING,
                "API key revocation listener: %s; keys are cached briefly until it reconnects "
                "(retrying every %.0f s)", type(exc).__name__, RETRY_S)
        self.reported = True


def _run(broker_url: str) -> None:
    stop = threading.Event()  # never set: the listener lives as long as the process
    subscribed = threading.Event()
    outages = OutageLog()
    while True:
        subscribed.clear()
        try:
            _listen(broker_url, subscribed=subscribed)
        except Exception as exc:
            outages.failed(exc, was_listening=subscribed.is_set())
        stop.wait(RETRY_S)


def start_listener(broker_url: str) -> bool:
    """Start this process's listener for `broker_url` once; False when the broker is not Redis."""
    if not is_redis(broker_url):
        return False
    with _lock:
        if broker_url not in _started:
            thread = threading.Thread(target=_run, args=(broker_url,), name="apikey-revocations", daemon=True)
            _started[broker_url] = thread
            thread.start()
    return True
