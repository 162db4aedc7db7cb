"""The HTTP API on the real Postgres and Redis: auth, tenant isolation, every limit's 4xx, batch validation."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.pipeline.conftest import make_settings, new_key
from tests.scratch_redis import flush


@pytest.fixture(scope="module")
def small(pipeline_env: dict[str, str], quiet_redis: Callable[[int], str]) -> Any:
    """An API with small limits, publishing to its own Redis database."""
    from yue2_jobs.api.app import create_app

    settings = make_settings(pipeline_env, max_input_chars=500, max_batch_items=10, max_request_bytes=4096,
                             max_file_bytes=20_000, max_new_tokens_limit=64, metrics_token=METRICS_TOKEN,
                             broker_url=quiet_redis(4))
    with TestClient(create_app(settings)) as http:
        yield settings, http
    flush(settings.broker_url)


METRICS_TOKEN = "operator-token-0123456789"


def auth(settings: Any, tenant: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(settings, tenant or f't-{uuid.uuid4().hex[:8]}')}"}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(ln) + "\n" for ln in lines).encode()


def line(i: int, body: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/summarize", "body": body or {"input": f"text {i}"},
            **extra}


def upload(http: TestClient, headers: dict[str, str], data: bytes) -> Any:
    return http.post("/v1/files", headers=headers, data={"purpose": "batch"},
                     files={"file": ("in.jsonl", data, "application/jsonl")})


def error_of(response: Any) -> dict[str, Any]:
    return response.json()["error"]


def test_auth_is_required(small: Any) -> None:
    _, http = small
    assert http.post("/v1/jobs", json={"input": "x"}).status_code == 401
    assert http.get("/v1/jobs/job_x", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_tenant_never_sees_another_tenants_objects(small: Any) -> None:
    settings, http = small
    a, b = auth(settings), auth(settings)
    job = http.post("/v1/jobs", headers=a, json={"input": "hello there"}).json()
    f = upload(http, a, jsonl([line(1)])).json()
    batch = http.post("/v1/batches", headers=a, json={"input_file_id": f["id"], "endpoint": "/v1/summarize",
                                                       "completion_window": "24h"}).json()
    assert http.get(f"/v1/jobs/{job['id']}", headers=a).status_code == 200
    for method, path in (("GET", f"/v1/jobs/{job['id']}"), ("POST", f"/v1/jobs/{job['id']}/cancel"),
                         ("GET", f"/v1/files/{f['id']}"), ("GET", f"/v1/files/{f['id']}/content"),
                         ("GET", f"/v1/batches/{batch['id']}"), ("POST", f"/v1/batches/{batch['id']}/cancel")):
        response = http.request(method, path, headers=b)
        assert response.status_code == 404, (method, path)
        assert "another" not in response.text
    # B cannot start a batch on A's file either
    r = http.post("/v1/batches", headers=b, json={"input_file_id": f["id"], "endpoint": "/v1/summarize"})
    assert r.status_code == 404
    assert http.get(f"/v1/jobs/{job['id']}", headers=a).json()["status"] == "queued"


@pytest.mark.parametrize(("body", "status", "field", "needle"), [
    ({"input": "x" * 501}, 413, "input", "limit of 500 characters"),
    ({"kind": "generate", "prompt": "y" * 600}, 413, "prompt", "limit of 500 characters"),
    ({"input": "x", "max_new_tokens": 65}, 422, "max_new_tokens", "limit of 64 tokens"),
    ({"input": ""}, 422, "input", "must not be empty"),
    ({"input": "x", "variant": "nope"}, 422, "variant", "not served"),
    ({"input": "x", "mode": "fastest"}, 422, "mode", "mode"),
    ({"input": "x", "temperature": 0}, 422, "temperature", "greater than 0"),
    ({"input": "x", "unknown": 1}, 422, "unknown", "Extra inputs"),
])
def test_job_limits_name_the_field(small: Any, body: dict[str, Any], status: int, field: str, needle: str) -> None:
    settings, http = small
    r = http.post("/v1/jobs", headers=auth(settings), json=body)
    assert r.status_code == status, r.text
    assert error_of(r)["param"] == field and needle in error_of(r)["message"]


def test_request_body_limit(small: Any) -> None:
    settings, http = small
    r = http.post("/v1/jobs", headers={**auth(settings), "content-type": "application/json"},
                  content=json.dumps({"input": "x" * 5000}))
    assert r.status_code == 413 and error_of(r)["param"] == "request body"
    assert "4,096 bytes" in error_of(r)["message"]


def test_a_chunked_body_over_the_limit_gets_the_413_over_http(small: Any) -> None:
    """No Content-Length (Transfer-Encoding: chunked): the body is counted as it arrives, and the answer
    is the same 413 naming the field, not the parser's 400 for a cut-off body."""
    import httpx

    from tests.pipeline.conftest import ApiServer

    settings, _ = small
    server = ApiServer(settings)
    try:
        h = auth(settings)

        def chunks(total: int, *, head: bytes = b"", tail: bytes = b"") -> Any:
            yield head
            for _ in range(total // 1024):
                yield b"x" * 1024
            yield tail

        with httpx.Client(base_url=server.url, timeout=30) as http:
            r = http.post("/v1/jobs", headers={**h, "content-type": "application/json"},
                          content=chunks(2 * 1024 * 1024, head=b'{"input": "', tail=b'"}'))
            assert r.request.headers.get("transfer-encoding") == "chunked" and "content-length" not in r.request.headers
            assert r.status_code == 413 and error_of(r)["param"] == "request body", r.text
            assert "4,096 bytes" in error_of(r)["message"]
            boundary = "yue2boundary"
            head = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                    f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
                    f"Content-Type: application/jsonl\r\n\r\n").encode()
            r = http.post("/v1/files", headers={**h, "content-type": f"multipart/form-data; boundary={boundary}"},
                          content=chunks(300_000, head=head, tail=f"\r\n--{boundary}--\r\n".encode()))
            assert r.status_code == 413 and error_of(r)["param"] == "file", r.text
            assert "20,000 bytes" in error_of(r)["message"]
            # Under the limit, the same chunked upload goes through.
            r = http.post("/v1/jobs", headers={**h, "content-type": "application/json"},
                          content=iter([b'{"input": "', b"a short text in ", b"three chunks", b'"}']))
            assert r.status_code == 201, r.text
    finally:
        server.stop()


def test_file_size_limit(small: Any) -> None:
    settings, http = small
    r = upload(http, auth(settings), b"x" * 30_000)
    assert r.status_code == 413 and error_of(r)["param"] == "file" and "20,000 bytes" in error_of(r)["message"]


def test_batch_item_limit_and_validation_at_create_time(small: Any) -> None:
    settings, http = small
    h = auth(settings)

    def create(lines: list[dict[str, Any]] | bytes) -> Any:
        data = lines if isinstance(lines, bytes) else jsonl(lines)
        f = upload(http, h, data).json()
        return http.post("/v1/batches", headers=h, json={"input_file_id": f["id"], "endpoint": "/v1/summarize"})

    r = create([line(i) for i in range(11)])
    assert r.status_code == 400 and "11 requests, over the limit of 10 requests" in error_of(r)["message"]
    r = create([line(1), line(2), line(1)])
    assert r.status_code == 400 and "custom_id 'c1' is used twice" in error_of(r)["message"]
    assert error_of(r)["param"] == "line 3.custom_id"
    r = create(b'{"custom_id": "a", "body": {"input": "x"}}\nnot json\n')
    assert r.status_code == 400 and error_of(r)["param"] == "line 2"
    r = create([line(1, url="/v1/generate")])
    assert r.status_code == 400 and error_of(r)["param"] == "line 1.url"
    f = upload(http, h, jsonl([line(1)])).json()
    r = http.post("/v1/batches", headers=h, json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions"})
    assert r.status_code == 400 and error_of(r)["param"] == "endpoint"
    # A line whose body breaks a limit fails alone; its batch-mates are accepted.
    r = create([line(1), line(2, {"input": "z" * 501}), line(3, {"input": "ok", "max_new_tokens": 99})])
    assert r.status_code == 200, r.text
    batch = r.json()
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 2}
    assert batch["status"] == "in_progress"


def test_all_lines_invalid_finishes_the_batch_with_an_error_file(small: Any) -> None:
    settings, http = small
    h = auth(settings)
    f = upload(http, h, jsonl([line(1, {"input": ""})])).json()
    batch = http.post("/v1/batches", headers=h, json={"input_file_id": f["id"], "endpoint": "/v1/summarize"}).json()
    assert batch["status"] == "completed" and batch["output_file_id"] is None
    errors = http.get(f"/v1/files/{batch['error_file_id']}/content", headers=h).text.splitlines()
    err = json.loads(errors[0])
    assert err["custom_id"] == "c1" and err["response"]["status_code"] == 422
    assert "body.input" in err["error"]["message"]


def test_fifty_thousand_items_are_accepted(pipeline_env: dict[str, str], quiet_redis: Callable[[int], str]) -> None:
    from yue2_jobs.api.app import create_app

    settings = make_settings(pipeline_env, broker_url=quiet_redis(5))
    assert settings.max_batch_items >= 50_000
    with TestClient(create_app(settings)) as http:
        h = auth(settings)
        t0 = time.perf_counter()
        f = upload(http, h, jsonl([line(i) for i in range(50_000)])).json()
        r = http.post("/v1/batches", headers=h, json={"input_file_id": f["id"], "endpoint": "/v1/summarize"})
        assert r.status_code == 200, r.text
        assert r.json()["request_counts"]["total"] == 50_000
        created_s = time.perf_counter() - t0
        cancelled = http.post(f"/v1/batches/{r.json()['id']}/cancel", headers=h).json()
        assert cancelled["status"] == "cancelled"
    flush(settings.broker_url)
    print(f"50,000-line batch uploaded and created in {created_s:.1f}s")


def test_healthz_and_metrics(small: Any) -> None:
    settings, http = small
    health = http.get("/healthz").json()
    assert {k: health[k] for k in ("status", "database", "broker")} == {"status": "ok", "database": "ok",
                                                                          "broker": "ok"}
    assert set(health["variants_without_workers"]) <= {"base", "legal"}
    http.post("/v1/jobs", headers=auth(settings), json={"input": "count me"})
    # Job counts span every tenant: a tenant's key, no key or a wrong token cannot read them.
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers=auth(settings)).status_code == 401
    assert http.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    text = http.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
    assert 'yue2_api_requests_total{method="POST",route="/v1/jobs",status="201"}' in text
    assert 'yue2_jobs{status="queued"}' in text
