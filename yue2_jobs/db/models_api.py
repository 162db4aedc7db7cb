"""Tables of the API's own bookkeeping: idempotency keys and webhooks (endpoints, deliveries).

They hang off the same `Base` as `models`; importing this module registers them (Alembic's
`env.py` and the services that use them do).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from yue2_jobs.db.models import Base


class IdempotencyKey(Base):
    """The first response to a request sent with `Idempotency-Key`, replayed for 24 h to the same
    tenant's retries with the same body; `state` is `running` until that response exists."""

    __tablename__ = "idempotency_keys"

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))  # sha256 of method, path and body
    state: Mapped[str] = mapped_column(String(16))  # running | done
    response_status: Mapped[int | None] = mapped_column(Integer)
    response_body: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime]
    locked_until: Mapped[datetime]  # a `running` row past this, with no live `owner`, was left by a crashed request
    # The API process running the request: its Postgres advisory lock (`api.idempotency.Owner`)
    # is free once that process is dead. None: nobody can vouch for it (SQLite), so `locked_until`.
    owner: Mapped[int | None] = mapped_column(BigInteger)
    claim: Mapped[str | None] = mapped_column(String(32))  # the running request's token: it fences its commit
    resource: Mapped[str | None] = mapped_column(String(80))  # "batch:<id>" etc., written in the resource's commit
    expires_at: Mapped[datetime] = mapped_column(index=True)


class WebhookEndpoint(Base):
    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)
    secret: Mapped[str] = mapped_column(String(100))  # whsec_<base64>: the sender signs with it, so it is kept
    description: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime]


class WebhookDelivery(Base):
    """One event for one endpoint: sent until it gets a 2xx or is 24 h old. `event_id` is the
    `webhook-id` header, the same on every attempt, so a receiver dedupes on it."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_id", name="uq_webhook_deliveries_endpoint_event"),
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), index=True)
    tenant: Mapped[str] = mapped_column(String(64))
    event_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None]
    claimed_until: Mapped[datetime | None]  # a sender holds it until then
    attempt_log: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{at, status_code, error, ms}]
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]
