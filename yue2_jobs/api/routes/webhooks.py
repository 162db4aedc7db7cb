"""Webhook endpoints: register (the signing secret is shown once), list, delete, read deliveries.

Served at /v1/webhooks and, in the shape the `openai` client's `client.webhooks` sends
(`event_types`, `name`), at /v1/webhook_endpoints."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from yue2_jobs.api.deps import SessionDep, StateDep, TenantDep
from yue2_jobs.api.views import delivery_view, list_view, webhook_view
from yue2_jobs.core.safe import SafeStr
from yue2_jobs.db.listing import DEFAULT_LIMIT
from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.webhooks import endpoints
from yue2_jobs.webhooks.events import EVENT_TYPES
from yue2_jobs.webhooks.targets import MAX_URL_CHARS, URL_PATTERN

router = APIRouter(tags=["webhooks"])
# The event names are checked by the service (a 400 naming the unknown ones); the document lists them.
EventName = Annotated[SafeStr, Field(json_schema_extra={"enum": list(EVENT_TYPES)})]
EventList = Annotated[list[EventName], Field(min_length=1, max_length=len(EVENT_TYPES))]


class WebhookCreate(BaseModel):
    """`events` (or the openai client's `event_types`), not both; neither subscribes to every event."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"not": {"required": ["events", "event_types"]}})

    # The URL's rules as a pattern the document states and `targets.check_url_shape` applies.
    url: SafeStr = Field(max_length=MAX_URL_CHARS, json_schema_extra={"pattern": URL_PATTERN})
    events: EventList | None = None
    event_types: EventList | None = None  # the openai client's name for `events`
    description: SafeStr = Field("", max_length=200)
    name: SafeStr | None = Field(None, max_length=200)  # the openai client's name for `description`


@router.post("", status_code=201)
def create_webhook(req: WebhookCreate, state: StateDep, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    if req.events is not None and req.event_types is not None:
        raise InvalidRequestError("send the event types as `events` or as `event_types`, not both", field="events",
                                  status=400)
    events = req.events if req.events is not None else req.event_types if req.event_types is not None \
        else list(EVENT_TYPES)
    endpoint = endpoints.create_endpoint(session, tenant=tenant, url=req.url, events=events,
                                         description=req.name or req.description, settings=state.settings)
    return webhook_view(endpoint, with_secret=True)


@router.get("")
def list_webhooks(session: SessionDep, tenant: TenantDep, limit: int = DEFAULT_LIMIT,
                  after: str | None = None) -> dict[str, Any]:
    found = endpoints.list_endpoints(session, tenant=tenant, limit=limit, after=after)
    return list_view([webhook_view(e) for e in found.rows], has_more=found.has_more)


@router.get("/{webhook_id}")
def get_webhook(webhook_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return webhook_view(endpoints.get_endpoint(session, tenant=tenant, endpoint_id=webhook_id))


@router.delete("/{webhook_id}")
def delete_webhook(webhook_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    deleted = endpoints.delete_endpoint(session, tenant=tenant, endpoint_id=webhook_id)
    return {"id": deleted, "object": "webhook_endpoint.deleted", "deleted": True}


@router.get("/{webhook_id}/deliveries")
def list_deliveries(webhook_id: str, session: SessionDep, tenant: TenantDep, limit: int = DEFAULT_LIMIT,
                    after: str | None = None) -> dict[str, Any]:
    found = endpoints.list_deliveries(session, tenant=tenant, endpoint_id=webhook_id, limit=limit, after=after)
    return list_view([delivery_view(d) for d in found.rows], has_more=found.has_more)
