"""Sending queued events: each worker runs `deliver_due` every few seconds (and `yue2 reconcile`
once). A delivery is claimed with a conditional UPDATE, so two workers never send the same attempt;
a worker that dies mid-send leaves a claim that runs out, and the attempt is made again (at least
once: receivers dedupe on `webhook-id`).

A 2xx ends a delivery. Anything else (another status, a timeout, a refused connection, a target
that now resolves to an internal address, any exception at all while sending) schedules the next
attempt on the Standard Webhooks backoff, until the event is `webhook_max_age_s` old; then the
delivery is `failed`, whatever went wrong, even if it was never attempted. One delivery's trouble
never stops the pass: the others due are still sent.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.core.config import Settings
from yue2_jobs.core.retry import transient
from yue2_jobs.db.models_api import WebhookDelivery, WebhookEndpoint
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.webhooks.signing import headers
from yue2_jobs.webhooks.targets import approved_addresses, pinned_request

log = logging.getLogger(__name__)
MAX_LOG = 20  # attempts kept in a delivery's log (the first ones and the latest)


def _claimable(now: Any) -> Any:
    return ((WebhookDelivery.status == "pending") & (WebhookDelivery.next_attempt_at <= now)
            & or_(WebhookDelivery.claimed_until.is_(None), WebhookDelivery.claimed_until < now))


def _send(endpoint: WebhookEndpoint, payload: dict[str, Any], event_id: str,
          settings: Settings) -> tuple[int | None, str | None]:
    """(status code, error) of one attempt; nothing raised."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    try:
        # A client of its own: pooled connections are keyed by address, not by name, so a shared one
        # would send one host's events over a TLS connection set up (and certificate-checked) for
        # another host on the same address.
        with httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False) as client:
            response = post_pinned(client, endpoint.url, body=body, allow_private=settings.webhook_allow_private,
                                   headers=headers(endpoint.secret, msg_id=event_id, body=body))
    except InvalidRequestError as exc:
        return None, str(exc)
    except Exception as exc:  # httpx.HTTPError, httpx.InvalidURL (not an HTTPError), anything else
        return None, f"{type(exc).__name__}: {exc}"[:500]
    return response.status_code, None if response.is_success else f"HTTP {response.status_code}"


def post_pinned(client: httpx.Client, url: str, *, body: bytes, allow_private: bool,
                 headers: dict[str, str]) -> httpx.Response:
    """POST to the addresses the SSRF check approved, in turn until one accepts the connection (as
    a client tries each address of a name: one refused or silent, an IPv6 route that drops
    packets, say); the name is never resolved again in between."""
    addresses = approved_addresses(url, allow_private=allow_private)
    for i, address in enumerate(addresses):
        pinned, host, extensions = pinned_request(url, address)
        try:
            return client.post(pinned, content=body, headers={**headers, **host}, extensions=extensions)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            if i == len(addresses) - 1:
                raise
    raise AssertionError("unreachable: a name that resolves has an address")


def _give_up_at(row: WebhookDelivery, now: Any, settings: Settings) -> Any:
    """When the delivery ends `failed`: `webhook_max_age_s` after its event."""
    created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=now.tzinfo)  # SQLite
    return created + timedelta(seconds=settings.webhook_max_age_s)


def _record(session: Session, row: WebhookDelivery, *, status_code: int | None, error: str | None, ms: float,
            settings: Settings) -> None:
    now = utcnow()
    attempts = row.attempts + 1
    entry = {"at": int(now.timestamp()), "status_code": status_code, "error": error, "ms": round(ms, 1)}
    log_ = [*row.attempt_log, entry]
    log_ = log_ if len(log_) <= MAX_LOG else [*log_[:5], *log_[-(MAX_LOG - 5):]]
    values: dict[str, Any] = {"attempts": attempts, "attempt_log": log_, "claimed_until": None}
    if error is None:
        values.update(status="delivered", delivered_at=now, next_attempt_at=None)
    else:
        schedule = settings.webhook_retry_s
        wait = schedule[min(attempts - 1, len(schedule) - 1)]
        next_at = now + timedelta(seconds=wait)
        if next_at > _give_up_at(row, now, settings):
            values.update(status="failed", next_attempt_at=None)
        else:
            values.update(next_attempt_at=next_at)
    session.execute(update(WebhookDelivery).where(WebhookDelivery.id == row.id).values(**values))
    session.commit()


def _give_up(session: Session, delivery_id: str, reason: str) -> None:
    """End a delivery as `failed` without another attempt, noting why in its log."""
    row = session.get(WebhookDelivery, delivery_id)
    entry = {"at": int(utcnow().timestamp()), "status_code": None, "error": reason[:500], "ms": 0.0}
    log_ = [*(row.attempt_log if row is not None else []), entry][-MAX_LOG:]
    session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(
        status="failed", next_attempt_at=None, claimed_until=None, attempt_log=log_))
    session.commit()


def _attempt(session: Session, delivery_id: str, settings: Settings) -> bool:
    """Claim and make one attempt at `delivery_id`; False when it was not this worker's to make."""
    now = utcnow()
    hold = timedelta(seconds=settings.webhook_timeout_s * 2 + 10)
    claimed = session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id, _claimable(now))
                              .values(claimed_until=now + hold).returning(WebhookDelivery.id)).scalar()
    session.commit()
    if claimed is None:  # another worker took it
        return False
    row = session.get(WebhookDelivery, delivery_id)
    endpoint = session.get(WebhookEndpoint, row.endpoint_id) if row is not None else None
    if row is None or endpoint is None:  # the endpoint was deleted meanwhile, with its deliveries
        session.rollback()
        return False
    if now >= _give_up_at(row, now, settings):
        _give_up(session, delivery_id, f"not delivered within {settings.webhook_max_age_s:.0f} s of the event")
        return True
    started = time.perf_counter()
    status_code, error = _send(endpoint, row.payload, row.event_id, settings)
    try:
        _record(session, row, status_code=status_code, error=error, ms=(time.perf_counter() - started) * 1000,
                settings=settings)
    except Exception as exc:
        if error is not None or transient(exc):  # a failed attempt, or the database is down: as usual
            raise
        # The receiver has the event: whatever went wrong in the attempt's log, the delivery is done.
        session.rollback()
        log.exception("webhook %s was delivered but its attempt could not be logged", row.event_id)
        session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(
            status="delivered", delivered_at=utcnow(), next_attempt_at=None, claimed_until=None))
        session.commit()
        return True
    if error is not None:
        log.info("webhook %s to %s: %s (attempt %d)", row.event_id, endpoint.url, error, row.attempts + 1)
    return True


def deliver_due(sessions: sessionmaker[Session], *, settings: Settings, limit: int = 32) -> int:
    """Make the due attempts, one at a time; returns how many this call made. A delivery that raises
    for good (a value the database refuses, say) is logged and given up on, one that meets a database
    outage waits for a later pass; either way the pass goes on to the next."""
    made = 0
    with sessions() as session:
        due = session.execute(select(WebhookDelivery.id).where(_claimable(utcnow()))
                              .order_by(WebhookDelivery.next_attempt_at).limit(limit)).scalars().all()
        session.commit()
        for delivery_id in due:
            try:
                made += _attempt(session, delivery_id, settings)
            except Exception as exc:
                session.rollback()
                if transient(exc):  # the database blinked: the claim runs out and a later pass retries
                    log.warning("webhook delivery %s: %s; retried on a later pass", delivery_id, type(exc).__name__)
                    continue
                log.exception("webhook delivery %s failed outside its attempt; it is given up", delivery_id)
                try:
                    _give_up(session, delivery_id, f"{type(exc).__name__}: {exc}")
                except Exception:  # the database itself is down: the claim runs out, the next pass retries
                    session.rollback()
                    log.warning("could not record webhook delivery %s as failed", delivery_id)
    return made
