"""API keys: one tenant each, stored as a sha256 of the secret (the secret is shown once).

A key looked up is cached in the process, so most requests cost no database trip. Revocation
must reach every API process within a second, so the cache only runs while the process listens
for revocations (`yue2_jobs.api.revocations`, on Redis pub/sub); while it does not (no Redis,
or the connection dropped), entries live `UNLISTENED_TTL_S`, below that second.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from yue2_jobs.db.models import ApiKey
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import AuthError, NotFoundError

KEY_PREFIX = "yk-"
LISTENED_TTL_S = 30.0  # revocations arrive by message; this only bounds memory and key expiry skew
UNLISTENED_TTL_S = 0.5


class KeyCache:
    """key hash -> (tenant, monotonic deadline)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self.listening = False  # set by the revocation listener while it is subscribed

    def get(self, digest: str) -> str | None:
        hit = self._entries.get(digest)
        return hit[0] if hit is not None and hit[1] > self._clock() else None

    def put(self, digest: str, tenant: str, *, expires_at: datetime | None) -> None:
        ttl = LISTENED_TTL_S if self.listening else UNLISTENED_TTL_S
        if expires_at is not None:  # an expiring key leaves the cache when it expires
            aware = expires_at if expires_at.tzinfo else expires_at.replace(tzinfo=UTC)  # SQLite drops the zone
            ttl = min(ttl, (aware - utcnow()).total_seconds())
        with self._lock:
            self._entries[digest] = (tenant, self._clock() + ttl)

    def forget(self, digest: str) -> None:
        with self._lock:
            self._entries.pop(digest, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


CACHE = KeyCache()


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_api_key(session: Session, *, tenant: str, name: str = "", expires_at: datetime | None = None) -> str:
    """Create a key for `tenant`; returns the secret, which is not stored anywhere."""
    if not tenant or len(tenant) > 64:
        raise ValueError("tenant must be 1 to 64 characters")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(id=f"key_{secrets.token_hex(8)}", tenant=tenant, key_hash=hash_key(secret), name=name,
                       created_at=utcnow(), expires_at=expires_at, prefix=secret[:10]))
    session.commit()
    return secret


@dataclass
class KeyInfo:
    id: str
    tenant: str
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


def list_api_keys(session: Session, *, tenant: str | None = None) -> list[KeyInfo]:
    """Every key (or one tenant's), oldest first; the secrets are not stored, only their prefixes."""
    stmt = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if tenant is not None:
        stmt = stmt.where(ApiKey.tenant == tenant)
    return [KeyInfo(id=k.id, tenant=k.tenant, name=k.name, prefix=(k.prefix or KEY_PREFIX) + "...",
                    created_at=k.created_at, expires_at=k.expires_at, revoked_at=k.revoked_at)
            for k in session.execute(stmt).scalars()]


def revoke_api_key(session: Session, *, key_id: str) -> str:
    """Revoke the key; returns its hash, which the caller announces (`api.revocations.announce`)."""
    digest = session.execute(update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
                             .values(revoked_at=utcnow()).returning(ApiKey.key_hash)).scalar_one_or_none()
    session.commit()
    if digest is None:
        known = session.execute(select(ApiKey.key_hash).where(ApiKey.id == key_id)).scalar_one_or_none()
        if known is None:
            raise NotFoundError(f"no API key {key_id!r}")
        return known  # already revoked: announcing it again is harmless
    CACHE.forget(digest)
    return digest


def cached_tenant(secret: str | None) -> str | None:
    """The tenant of a key this process looked up lately, without touching the database."""
    return CACHE.get(hash_key(secret)) if secret else None


def tenant_for_key(session: Session, secret: str | None) -> str:
    if not secret:
        raise AuthError("no API key: send `Authorization: Bearer <key>`")
    digest = hash_key(secret)
    cached = CACHE.get(digest)
    if cached is not None:
        return cached
    now = utcnow()
    row = session.execute(select(ApiKey.tenant, ApiKey.expires_at).where(
        ApiKey.key_hash == digest, ApiKey.revoked_at.is_(None),
        or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now))).one_or_none()
    if row is None:
        raise AuthError("unknown, expired or revoked API key")
    CACHE.put(digest, row.tenant, expires_at=row.expires_at)
    return str(row.tenant)
