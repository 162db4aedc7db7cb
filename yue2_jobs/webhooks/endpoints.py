"""A tenant's webhook endpoints: register (the secret is returned this once), list, delete, and
read an endpoint's delivery log."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.core.ids import new_id
from yue2_jobs.db.listing import Page, page
from yue2_jobs.db.models_api import WebhookDelivery, WebhookEndpoint
from yue2_jobs.db.queries import get_owned
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import InvalidRequestError, LimitExceededError
from yue2_jobs.webhooks.events import EVENT_TYPES
from yue2_jobs.webhooks.signing import new_secret
from yue2_jobs.webhooks.targets import check_url


def create_endpoint(session: Session, *, tenant: str, url: str, events: list[str], description: str,
                    settings: Settings) -> WebhookEndpoint:
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if not events or unknown:
        raise InvalidRequestError(f"events must name at least one of {list(EVENT_TYPES)}"
                                  + (f"; unknown: {unknown}" if unknown else ""), field="events", status=400)
    check_url(url, allow_private=settings.webhook_allow_private)
    count = session.execute(select(func.count()).select_from(WebhookEndpoint)
                            .where(WebhookEndpoint.tenant == tenant)).scalar_one()
    if count >= settings.webhook_max_endpoints:
        raise LimitExceededError(field="webhooks", limit=settings.webhook_max_endpoints, actual=count + 1,
                                 unit="endpoints per tenant", status=409)
    endpoint = WebhookEndpoint(id=new_id("wh_"), tenant=tenant, url=url, events=sorted(set(events)),
                               secret=new_secret(), description=description, created_at=utcnow())
    session.add(endpoint)
    session.commit()
    return endpoint


def get_endpoint(session: Session, *, tenant: str, endpoint_id: str) -> WebhookEndpoint:
    return get_owned(session, WebhookEndpoint, tenant=tenant, row_id=endpoint_id, what="webhook endpoint")


def list_endpoints(session: Session, *, tenant: str, limit: int, after: str | None) -> Page[WebhookEndpoint]:
    return page(session, WebhookEndpoint, tenant=tenant, limit=limit, after=after)


def delete_endpoint(session: Session, *, tenant: str, endpoint_id: str) -> str:
    """Delete the endpoint and its deliveries (pending ones are not sent)."""
    endpoint = get_endpoint(session, tenant=tenant, endpoint_id=endpoint_id)
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id))
    session.execute(delete(WebhookEndpoint).where(WebhookEndpoint.id == endpoint.id))
    session.commit()
    return endpoint.id


def list_deliveries(session: Session, *, tenant: str, endpoint_id: str, limit: int,
                    after: str | None) -> Page[WebhookDelivery]:
    endpoint = get_endpoint(session, tenant=tenant, endpoint_id=endpoint_id)
    return page(session, WebhookDelivery, tenant=tenant, limit=limit, after=after,
                where=(WebhookDelivery.endpoint_id == endpoint.id,))
