"""The API-key cache: long only while revocations are heard, never past a key's expiry."""

from __future__ import annotations

from datetime import timedelta

from yue2_jobs.auth import LISTENED_TTL_S, UNLISTENED_TTL_S, KeyCache
from yue2_jobs.db.session import utcnow


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_unlistened_entries_live_under_a_second() -> None:
    clock = Clock()
    cache = KeyCache(clock)
    cache.put("h", "acme", expires_at=None)
    assert cache.get("h") == "acme"
    clock.now += 0.99
    assert cache.get("h") is None and UNLISTENED_TTL_S < 1.0


def test_listened_entries_stay_until_revoked_or_expired() -> None:
    clock = Clock()
    cache = KeyCache(clock)
    cache.listening = True
    cache.put("h", "acme", expires_at=None)
    cache.put("soon", "acme", expires_at=utcnow() + timedelta(seconds=5))
    cache.put("naive", "acme", expires_at=(utcnow() - timedelta(seconds=1)).replace(tzinfo=None))  # as SQLite reads
    assert cache.get("naive") is None
    clock.now += 6
    assert cache.get("h") == "acme" and cache.get("soon") is None
    cache.forget("h")
    assert cache.get("h") is None
    cache.put("h", "acme", expires_at=None)
    clock.now += LISTENED_TTL_S + 1
    assert cache.get("h") is None
