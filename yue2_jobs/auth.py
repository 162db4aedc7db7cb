"""API keys: one tenant each, stored as a sha256 of the secret (the secret is shown once)."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from yue2_jobs.db.models import ApiKey
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import AuthError

KEY_PREFIX = "yk-"
CACHE_TTL_S = 30.0  # a revoked key stops working within this long on every API process
_cache: dict[str, tuple[str, float]] = {}


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_api_key(session: Session, *, tenant: str, name: str = "") -> str:
    """Create a key for `tenant`; returns the secret, which is not stored anywhere."""
    if not tenant or len(tenant) > 64:
        raise ValueError("tenant must be 1 to 64 characters")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(id=f"key_{secrets.token_hex(8)}", tenant=tenant, key_hash=hash_key(secret), name=name,
                       created_at=utcnow()))
    session.commit()
    return secret


def cached_tenant(secret: str | None) -> str | None:
    """The tenant of a key looked up less than CACHE_TTL_S ago, without touching the database."""
    if not secret:
        return None
    hit = _cache.get(hash_key(secret))
    return hit[0] if hit is not None and hit[1] > time.monotonic() else None


def tenant_for_key(session: Session, secret: str | None) -> str:
    if not secret:
        raise AuthError("no API key: send `Authorization: Bearer <key>`")
    digest = hash_key(secret)
    cached = cached_tenant(secret)
    if cached is not None:
        return cached
    tenant = session.execute(select(ApiKey.tenant).where(ApiKey.key_hash == digest,
                                                         ApiKey.revoked_at.is_(None))).scalar_one_or_none()
    if tenant is None:
        raise AuthError("unknown or revoked API key")
    _cache[digest] = (tenant, time.monotonic() + CACHE_TTL_S)
    return tenant
