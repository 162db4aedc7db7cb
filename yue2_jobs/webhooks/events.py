"""Queuing an event: one delivery row per endpoint of the tenant that subscribed to its type.

`emit` writes in the caller's transaction, the one that moves the batch to its final status, so
an event exists exactly when the status change does (an outbox): a crash right after the commit
loses no event, and a rolled-back change sends none.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from yue2_jobs.core.ids import new_id
from yue2_jobs.db.models_api import WebhookDelivery, WebhookEndpoint
from yue2_jobs.db.session import utcnow

EVENT_TYPES = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")


def event_id(event_type: str, object_id: str) -> str:
    """Deterministic: the same batch ending the same way is the same event."""
    return "evt_" + hashlib.sha256(f"{event_type}\x00{object_id}".encode()).hexdigest()[:32]


def emit(session: Session, *, tenant: str, event_type: str, object_id: str) -> int:
    """Queue `event_type` about `object_id` for the tenant's subscribed endpoints (not committed)."""
    assert event_type in EVENT_TYPES, event_type
    endpoints = [e for e, events in session.execute(
        select(WebhookEndpoint.id, WebhookEndpoint.events).where(WebhookEndpoint.tenant == tenant)).all()
        if event_type in events]
    if not endpoints:
        return 0
    now = utcnow()
    evt = event_id(event_type, object_id)
    payload: dict[str, Any] = {"id": evt, "object": "event", "created_at": int(now.timestamp()), "type": event_type,
                               "data": {"id": object_id}}
    already = set(session.execute(select(WebhookDelivery.endpoint_id).where(
        WebhookDelivery.event_id == evt, WebhookDelivery.endpoint_id.in_(endpoints))).scalars())
    rows = [dict(id=new_id("whd_"), endpoint_id=e, tenant=tenant, event_id=evt, event_type=event_type,
                 payload=payload, status="pending", attempts=0, next_attempt_at=now, attempt_log=[], created_at=now)
            for e in endpoints if e not in already]
    if rows:
        session.execute(insert(WebhookDelivery), rows)
    return len(rows)
