"""Webhooks on the real Postgres and a receiver on 127.0.0.1: signed per Standard Webhooks,
retried with backoff under one webhook-id, delivered after the receiver comes back, sent by a
worker's own thread; and the URL rules that keep endpoints off internal addresses."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.pipeline.batch_api_helpers import Receiver, create_batch, quiet_api, summarize_lines
from tests.pipeline.conftest import make_settings, new_key, wait_for
from yue2_jobs.core.net import free_port
from yue2_jobs.webhooks.signing import verify

__all__ = ["quiet_api"]


def headers(settings: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(settings, f't-{uuid.uuid4().hex[:8]}')}"}


def register(http: TestClient, h: dict[str, str], url: str, events: list[str] | None = None) -> dict[str, Any]:
    r = http.post("/v1/webhooks", headers=h, json={"url": url, "events": events or ["batch.completed"]})
    assert r.status_code == 201, r.text
    return r.json()


def invalid_batch(http: TestClient, h: dict[str, str]) -> dict[str, Any]:
    """A batch whose only line is invalid: it completes as it is created (a `batch.completed` event)."""
    return create_batch(http, h, [{"custom_id": "x", "method": "POST", "url": "/v1/summarize", "body": {"input": ""}}])


def deliver(settings: Any) -> int:
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.webhooks.delivery import deliver_due

    return deliver_due(session_factory(settings.resolved_database_url), settings=settings)


def test_a_receiver_failing_twice_gets_one_event_three_times_under_one_id(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    receiver = Receiver(codes=[500, 500])
    try:
        endpoint = register(http, h, receiver.url)
        assert endpoint["secret"].startswith("whsec_")
        assert "secret" not in http.get(f"/v1/webhooks/{endpoint['id']}", headers=h).json()  # shown once
        batch = invalid_batch(http, h)
        wait_for(lambda: (deliver(settings), len(receiver.requests) >= 3)[1], timeout=20, what="three attempts")
        assert [code for _, _, code in receiver.requests] == [500, 500, 200]
        ids = {hdrs["webhook-id"] for hdrs, _, _ in receiver.requests}
        assert len(ids) == 1
        for hdrs, body, _ in receiver.requests:
            assert verify(endpoint["secret"], hdrs, body) == hdrs["webhook-id"]
            event = json.loads(body)
            assert event["type"] == "batch.completed" and event["data"] == {"id": batch["id"]}
            assert event["object"] == "event" and event["id"] == hdrs["webhook-id"]
        log = http.get(f"/v1/webhooks/{endpoint['id']}/deliveries", headers=h).json()["data"]
        assert len(log) == 1 and log[0]["status"] == "delivered" and log[0]["attempts"] == 3
        assert [a["status_code"] for a in log[0]["log"]] == [500, 500, 200]
        deliver(settings)
        assert len(receiver.requests) == 3  # delivered: never sent again
    finally:
        receiver.stop()


def test_a_receiver_down_at_completion_gets_the_event_when_it_is_back(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    port = free_port()
    endpoint = register(http, h, f"http://127.0.0.1:{port}/hooks/yue2", ["batch.completed", "batch.expired"])
    batch = invalid_batch(http, h)
    wait_for(lambda: deliver(settings) >= 1, timeout=10, what="an attempt on the dead receiver")
    log = http.get(f"/v1/webhooks/{endpoint['id']}/deliveries", headers=h).json()["data"][0]
    assert log["status"] == "pending" and log["log"][0]["status_code"] is None and "Connect" in log["log"][0]["error"]
    receiver = Receiver(port=port)
    try:
        wait_for(lambda: (deliver(settings), receiver.requests)[1], timeout=20, what="the event after the restart")
        hdrs, body, _ = receiver.requests[0]
        verify(endpoint["secret"], hdrs, body)
        assert json.loads(body)["data"]["id"] == batch["id"] and len(receiver.requests) == 1
    finally:
        receiver.stop()


def test_deleting_an_endpoint_stops_its_deliveries(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    endpoint = register(http, h, f"http://127.0.0.1:{free_port()}/x")
    assert [e["id"] for e in http.get("/v1/webhooks", headers=h).json()["data"]] == [endpoint["id"]]
    invalid_batch(http, h)
    r = http.delete(f"/v1/webhooks/{endpoint['id']}", headers=h)
    assert r.json() == {"id": endpoint["id"], "object": "webhook_endpoint.deleted", "deleted": True}
    assert http.get(f"/v1/webhooks/{endpoint['id']}/deliveries", headers=h).status_code == 404
    assert http.get("/v1/webhooks", headers=h).json()["data"] == []


# Only loopback and internal addresses: a test never registers a public one, even to see it refused.
@pytest.mark.parametrize(("url", "needle"), [
    ("ftp://127.0.0.1/x", "scheme 'ftp'"),
    ("http://127.0.0.1:9/x", "127.0.0.1"),
    ("http://169.254.169.254/latest/meta-data", "169.254.169.254"),
    ("http://10.1.2.3/x", "10.1.2.3"),
    ("http://[::1]:8080/x", "IPv6 literals are not supported"),
    ("http://bücher.example/x", "xn-- form"),  # never resolved: refused by its shape first
    ("http://127.0.0.1:0080/x", "without leading zeros"),
    ("http://localhost/x", "internal"),
    ("http://user:pw@127.0.0.1/x", "credentials"),
    ("http:///nohost", "no host"),
    ("http://127.0.0.1/" + "a" * 2100, "2048"),
    ("http://127.0.0.1:9/x\r\ny", "U+000A, U+000D"),  # urlsplit drops CR/LF: the check must see them
    ("http://127.0.0.1:9/a b", "U+0020"),
])
def test_webhook_urls_are_refused_by_name(pipeline_env: dict[str, str], url: str, needle: str) -> None:
    from yue2_jobs.api.app import create_app

    settings = make_settings(pipeline_env)  # the default: internal targets refused
    with TestClient(create_app(settings)) as http:
        r = http.post("/v1/webhooks", headers=headers(settings), json={"url": url, "events": ["batch.completed"]})
    assert r.status_code in (400, 422) and r.json()["error"]["param"] == "url", r.text
    assert needle in r.json()["error"]["message"], r.text


def test_endpoint_limits(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    url = f"http://127.0.0.1:{free_port()}/x"
    r = http.post("/v1/webhooks", headers=h, json={"url": url, "events": ["batch.exploded"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "events" and "batch.exploded" in r.text
    for _ in range(settings.webhook_max_endpoints):
        register(http, h, url)
    r = http.post("/v1/webhooks", headers=h, json={"url": url, "events": ["batch.completed"]})
    assert r.status_code == 409 and r.json()["error"]["param"] == "webhooks"  # a well-formed body; the count is full
    assert "limit of 3 endpoints per tenant" in r.json()["error"]["message"]
    r = http.post("/v1/webhooks", headers=h, json={"url": url, "events": ["batch.completed"],
                                                   "event_types": ["batch.failed"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "events" and "not both" in r.text


def test_a_worker_sends_the_event_of_the_batch_it_finished(pipeline_env: dict[str, str], workers: Any) -> None:
    from yue2_jobs.api.app import create_app

    env = {"YUE2_RUNNER": "tests.pipeline.echo_runner:factory", "YUE2_WEBHOOK_ALLOW_PRIVATE": "true",
           "YUE2_WEBHOOK_POLL_S": "0.2"}
    settings = make_settings(pipeline_env, webhook_allow_private=True)
    receiver = Receiver()
    try:
        with TestClient(create_app(settings)) as http:
            h = headers(settings)
            endpoint = register(http, h, receiver.url)
            worker = workers(**env)
            batch = create_batch(http, h, summarize_lines(5))
            wait_for(lambda: receiver.requests, timeout=120, what=f"the webhook; worker log:\n{worker.tail()}")
            hdrs, body, _ = receiver.requests[0]
            assert verify(endpoint["secret"], hdrs, body) == hdrs["webhook-id"]
            assert json.loads(body)["data"]["id"] == batch["id"]
            assert http.get(f"/v1/batches/{batch['id']}", headers=h).json()["status"] == "completed"
    finally:
        receiver.stop()



def test_a_url_with_a_line_break_is_refused_even_where_private_targets_are_allowed(quiet_api: Any) -> None:
    settings, http = quiet_api
    r = http.post("/v1/webhooks", headers=headers(settings),
                  json={"url": f"http://127.0.0.1:{free_port()}/x\r\nHost: evil", "events": ["batch.completed"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "url" and "U+000D" in r.text


def _deliveries(settings: Any, endpoint_id: str) -> list[Any]:
    from sqlalchemy import select

    from yue2_jobs.db.models_api import WebhookDelivery
    from yue2_jobs.db.session import session_factory

    with session_factory(settings.resolved_database_url)() as session:
        return list(session.execute(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id))
                    .scalars())


def test_a_jammed_endpoint_neither_stops_the_pass_nor_outlives_the_24_hours(quiet_api: Any) -> None:
    """An endpoint stored with a URL the HTTP client refuses (as CRLF URLs were before they were
    refused at registration) gets a failed attempt, the other endpoint of the same pass still gets
    its event, and past the 24 h the delivery ends `failed` without another send."""
    from datetime import timedelta

    from sqlalchemy import update

    from yue2_jobs.db.models_api import WebhookDelivery, WebhookEndpoint
    from yue2_jobs.db.session import session_factory

    settings, http = quiet_api
    h = headers(settings)
    receiver = Receiver()
    try:
        jammed = register(http, h, f"http://127.0.0.1:{free_port()}/x")
        good = register(http, h, receiver.url)
        with session_factory(settings.resolved_database_url)() as session:
            session.execute(update(WebhookEndpoint).where(WebhookEndpoint.id == jammed["id"])
                            .values(url=f"http://127.0.0.1:{free_port()}/x\r\ny"))
            session.commit()
        invalid_batch(http, h)
        deliver(settings)  # one pass: must not raise, must reach the good endpoint
        assert len(receiver.requests) == 1
        [row] = _deliveries(settings, jammed["id"])
        assert row.status == "pending" and row.attempts == 1 and "U+000D" in row.attempt_log[0]["error"]
        with session_factory(settings.resolved_database_url)() as session:
            session.execute(update(WebhookDelivery).where(WebhookDelivery.id == row.id).values(
                created_at=row.created_at - timedelta(hours=25), next_attempt_at=row.created_at))
            session.commit()
        deliver(settings)
        [row] = _deliveries(settings, jammed["id"])
        assert row.status == "failed" and row.attempts == 1, (row.status, row.attempt_log)
        assert "not delivered within" in row.attempt_log[-1]["error"]
        assert [d.status for d in _deliveries(settings, good["id"])] == ["delivered"]
    finally:
        receiver.stop()


def test_a_delivery_whose_log_cannot_be_written_after_its_2xx_is_still_delivered(quiet_api: Any,
                                                                                 monkeypatch: Any) -> None:
    from yue2_jobs.webhooks import delivery

    settings, http = quiet_api
    h = headers(settings)
    receiver = Receiver()
    try:
        endpoint = register(http, h, receiver.url)
        invalid_batch(http, h)

        def broken_log(*_: Any, **__: Any) -> None:
            raise ValueError("the attempt log cannot be written")

        monkeypatch.setattr(delivery, "_record", broken_log)
        deliver(settings)
        assert len(receiver.requests) == 1
        assert [d.status for d in _deliveries(settings, endpoint["id"])] == ["delivered"]
        monkeypatch.undo()
        deliver(settings)
        assert len(receiver.requests) == 1  # delivered: never sent again
    finally:
        receiver.stop()
