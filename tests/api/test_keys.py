"""API keys (`yue2_jobs.auth`): only a hash is stored, a key names its tenant until it is revoked
or expires, and listing shows prefixes, never secrets. Also the Idempotency-Key rules."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from yue2_jobs.api.idempotency import MAX_KEY_CHARS, check_key, fingerprint
from yue2_jobs.auth import KEY_PREFIX, create_api_key, hash_key, list_api_keys, revoke_api_key, tenant_for_key
from yue2_jobs.db.models import ApiKey
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import AuthError, InvalidRequestError, NotFoundError


def test_only_the_hash_is_stored_and_the_key_names_its_tenant(session: Session) -> None:
    secret = create_api_key(session, tenant="acme", name="ci")
    assert secret.startswith(KEY_PREFIX)
    stored = session.execute(select(ApiKey).where(ApiKey.tenant == "acme")).scalar_one()
    assert stored.key_hash == hash_key(secret) and secret not in {stored.key_hash, stored.prefix, stored.name}
    assert tenant_for_key(session, secret) == "acme"
    listed = list_api_keys(session, tenant="acme")
    assert [(k.id, k.name, k.prefix) for k in listed] == [(stored.id, "ci", secret[:10] + "...")]


def test_revoked_expired_and_unknown_keys_are_refused(session: Session) -> None:
    secret = create_api_key(session, tenant="beta")
    expired = create_api_key(session, tenant="beta", expires_at=utcnow() - timedelta(seconds=1))
    key_id = next(k.id for k in list_api_keys(session, tenant="beta") if k.expires_at is None)
    assert tenant_for_key(session, secret) == "beta"  # now cached in this process ...
    assert revoke_api_key(session, key_id=key_id) == hash_key(secret)  # ... and forgotten by the revocation
    assert revoke_api_key(session, key_id=key_id) == hash_key(secret)  # again: harmless
    for bad in (secret, expired, KEY_PREFIX + "never-issued"):
        with pytest.raises(AuthError, match="unknown, expired or revoked"):
            tenant_for_key(session, bad)
    with pytest.raises(AuthError, match="no API key"):
        tenant_for_key(session, "")
    with pytest.raises(NotFoundError):
        revoke_api_key(session, key_id="key_nothing")
    with pytest.raises(ValueError, match="1 to 64"):
        create_api_key(session, tenant="t" * 65)


def test_idempotency_keys_are_printable_ascii_within_the_limit() -> None:
    assert check_key("order-42/retry") == "order-42/retry"
    for bad in ("", "has space", "é", "x" * (MAX_KEY_CHARS + 1), "tab\t"):
        with pytest.raises(InvalidRequestError) as caught:
            check_key(bad)
        assert caught.value.field == "Idempotency-Key" and caught.value.status == 400


def test_a_fingerprint_is_the_request_not_its_key_order() -> None:
    a = fingerprint("POST", "/v1/jobs", {"input": "x", "mode": "ar"})
    assert a == fingerprint("POST", "/v1/jobs", {"mode": "ar", "input": "x"})
    assert a != fingerprint("POST", "/v1/batches", {"input": "x", "mode": "ar"})
    assert a != fingerprint("POST", "/v1/jobs", {"input": "x", "mode": "hybrid"})
    assert fingerprint("POST", "/v1/files", b"raw") != fingerprint("POST", "/v1/files", b"raw2")
