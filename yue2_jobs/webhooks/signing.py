"""Standard Webhooks signatures (https://www.standardwebhooks.com), as OpenAI's webhooks send them.

    webhook-id: evt_...            the event's id, the same on every retry: receivers dedupe on it
    webhook-timestamp: 1733400000  seconds since the epoch
    webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">

The key is the base64 part of the endpoint's `whsec_...` secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

SECRET_PREFIX = "whsec_"
TOLERANCE_S = 300


class SignatureError(ValueError):
    """Raised by `verify` when the headers are missing, too old, or no signature matches."""


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, *, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secret: str, *, msg_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    ts = int(time.time()) if timestamp is None else timestamp
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts),
            "webhook-signature": sign(secret, msg_id=msg_id, timestamp=ts, body=body),
            "content-type": "application/json"}


def verify(secret: str, received: Mapping[str, str], body: bytes, *, now: float | None = None) -> str:
    """Check a delivery the way a receiver must; returns its webhook-id."""
    lower = {k.lower(): v for k, v in received.items()}
    try:
        msg_id, ts, signatures = lower["webhook-id"], int(lower["webhook-timestamp"]), lower["webhook-signature"]
    except (KeyError, ValueError) as exc:
        raise SignatureError(f"missing or malformed webhook headers: {exc}") from None
    if abs((time.time() if now is None else now) - ts) > TOLERANCE_S:
        raise SignatureError("webhook-timestamp is outside the tolerance: a replay, or a skewed clock")
    expected = sign(secret, msg_id=msg_id, timestamp=ts, body=body)
    if not any(hmac.compare_digest(expected, s) for s in signatures.split()):  # several during key rotation
        raise SignatureError("no webhook-signature matches")
    return msg_id
