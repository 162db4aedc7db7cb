"""Hostile input against the API on the real Postgres (its own database) and the moto S3 server:
NUL bytes and lone surrogates in every string field, over-long values, deep nesting, bad ids, bad
auth headers, huge headers. Each gets a 4xx naming the field, never a 500, and leaves nothing
behind; whatever the API accepts it can read back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.pipeline.conftest import make_settings, new_key, temporary_pg_database
from tests.scratch_redis import flush


@pytest.fixture(scope="module")
def app(pipeline_env: dict[str, str], quiet_redis: Callable[[int], str]) -> Iterator[tuple[Any, TestClient]]:
    from yue2_jobs.api.app import create_app
    from yue2_jobs.db.migrate import upgrade_head

    with temporary_pg_database("yue2_hostile") as url:
        upgrade_head(url)
        settings = make_settings(pipeline_env, database_url=url, storage_url="s3://yue2-test/hostile",
                                 broker_url=quiet_redis(5))
        with TestClient(create_app(settings)) as http:
            yield settings, http
        flush(settings.broker_url)


@pytest.fixture(scope="module")
def key(app: tuple[Any, TestClient]) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(app[0], f't-{uuid.uuid4().hex[:8]}')}",
            "Content-Type": "application/json"}


def post_json(http: TestClient, path: str, body: Any, headers: dict[str, str]) -> Any:
    # json.dumps escapes a lone surrogate as \ud800, as a hostile client would send it
    return http.post(path, content=json.dumps(body).encode(), headers=headers)


def upload(http: TestClient, headers: dict[str, str], data: bytes, filename: str = "in.jsonl") -> Any:
    return http.post("/v1/files", headers={"Authorization": headers["Authorization"]}, data={"purpose": "batch"},
                     files={"file": (filename, data, "application/jsonl")})


HOSTILE = ["\x00", "a\x00b", "\ud800", "x\udfffy", "\ud83d", "ok"]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("field", ["input", "custom_id", "variant"])
def test_nul_and_surrogates_in_a_job_are_a_4xx_naming_the_field(app: Any, key: dict[str, str], field: str,
                                                                value: str) -> None:
    _, http = app
    body = {"input": "some text", field: value} if field != "input" else {"input": value}
    r = post_json(http, "/v1/jobs", body, key)
    if value == "ok" and field != "variant":
        assert r.status_code == 201, r.text
        return
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == field


def test_bad_ids_are_404_without_a_query_and_never_500(app: Any, key: dict[str, str]) -> None:
    _, http = app
    for path in ("/v1/jobs/x%00y", "/v1/jobs/%ED%A0%80", "/v1/jobs/" + "j" * 65, "/v1/files/a%00",
                 "/v1/files/a%00/content", "/v1/batches/b%00", "/v1/experiments/e%00", "/v1/jobs/x%00/cancel",
                 "/v1/batches/b%00/cancel", "/v1/jobs/x%00/files/svg"):
        method = http.post if path.endswith("/cancel") else http.get
        r = method(path, headers=key)
        assert r.status_code == 404, (path, r.status_code, r.text)
    r = post_json(http, "/v1/batches", {"input_file_id": "file-\x00", "endpoint": "/v1/summarize"}, key)
    assert r.status_code == 422 and r.json()["error"]["param"] == "input_file_id", r.text


def _objects(prefix: str, s3: dict[str, str]) -> int:
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1")
    return sum(len(p.get("Contents", [])) for p in client.get_paginator("list_objects_v2").paginate(
        Bucket=s3["bucket"], Prefix=prefix))


def test_a_long_or_nul_filename_is_refused_before_anything_is_stored(app: Any, key: dict[str, str],
                                                                     s3: dict[str, str]) -> None:
    _, http = app
    before = _objects("hostile/", s3)
    r = upload(http, key, b'{"custom_id": "a", "body": {"input": "x"}}\n', filename="f" * 600 + ".jsonl")
    assert r.status_code in (400, 413), r.text
    assert r.json()["error"]["param"] == "filename"
    # httpx escapes a NUL in a multipart filename; another client may not, so the service checks it too.
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.errors import InvalidRequestError
    from yue2_jobs.jobs.files import create_file
    from yue2_jobs.storage import storage_from_url

    settings = app[0]
    storage = storage_from_url(settings.resolved_storage_url, endpoint_url=settings.s3_endpoint_url)
    with session_factory(settings.resolved_database_url)() as session, pytest.raises(InvalidRequestError) as err:
        create_file(session, tenant="t", filename="a\x00.jsonl", purpose="batch", data=b"{}", storage=storage)
    assert err.value.field == "filename"
    assert _objects("hostile/", s3) == before, "a refused upload left an object behind"


def test_batch_lines_with_hostile_values_fail_alone(app: Any, key: dict[str, str]) -> None:
    settings, http = app
    lines = [json.dumps({"custom_id": "ok", "body": {"input": "fine text"}}),
             json.dumps({"custom_id": "nul", "body": {"input": "bad\x00"}}),
             json.dumps({"custom_id": "sur", "body": {"input": "bad\ud800"}}),
             json.dumps({"custom_id": "ref", "body": {"input": "fine"}, "reference": "r\x00"}),
             '{"custom_id": "deep", "body": {"input": ' + "[" * 10_000 + "]" * 10_000 + "}}",
             json.dumps({"custom_id": "deep2", "body": {"input": "x", "seed": json.loads("[" * 40 + "]" * 40)}})]
    file_id = upload(http, key, ("\n".join(lines) + "\n").encode()).json()["id"]
    r = post_json(http, "/v1/batches", {"input_file_id": file_id, "endpoint": "/v1/summarize"}, key)
    assert r.status_code == 200, r.text
    batch = r.json()
    assert batch["request_counts"] == {"total": 6, "completed": 0, "failed": 5}
    from yue2_jobs.db.models import Job
    from yue2_jobs.db.session import session_factory

    with session_factory(settings.resolved_database_url)() as session:
        errors = {j.custom_id: j.error for j in session.query(Job).filter(Job.batch_id == batch["id"])}
    assert errors["ok"] is None
    assert {c: errors[c]["param"] for c in ("nul", "sur", "ref", "deep", "deep2")} == {
        "nul": "body.input", "sur": "body.input", "ref": "reference", "deep": "body", "deep2": "body"}
    # A NUL in a custom_id cannot be matched to a result: the whole file is refused, naming the line.
    bad = upload(http, key, (json.dumps({"custom_id": "a\x00", "body": {"input": "x"}}) + "\n").encode())
    r = post_json(http, "/v1/batches", {"input_file_id": bad.json()["id"], "endpoint": "/v1/summarize"}, key)
    assert r.status_code == 400 and r.json()["error"]["param"] == "line 1.custom_id", r.text


def test_a_request_body_nested_10000_deep_is_a_400_in_our_error_shape(app: Any, key: dict[str, str]) -> None:
    _, http = app
    deep = "[" * 10_000 + "]" * 10_000
    for path in ("/v1/jobs", "/v1/batches", "/v1/experiments"):
        r = http.post(path, content=('{"input": ' + deep + '}').encode(), headers=key)
        assert r.status_code == 400 and r.json()["error"]["param"] == "body", (path, r.text)
    r = http.post("/v1/jobs", content=b'{"input": "x", "seed": ' + b"[" * 40 + b"]" * 40 + b"}", headers=key)
    assert r.status_code == 400 and "nested more than 32 levels" in r.json()["error"]["message"]


def test_batch_metadata_with_a_surrogate_is_refused_before_commit(app: Any, key: dict[str, str]) -> None:
    _, http = app
    file_id = upload(http, key, b'{"custom_id": "a", "body": {"input": "x"}}\n').json()["id"]
    for metadata in ({"k": "\ud800"}, {"\x00": "v"}, {"k": "v" * 513}, {f"k{i}": "v" for i in range(17)}):
        r = post_json(http, "/v1/batches", {"input_file_id": file_id, "endpoint": "/v1/summarize",
                                            "metadata": metadata}, key)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"].startswith("metadata"), r.text


def test_auth_header_must_be_bearer_and_headers_are_limited(app: Any, key: dict[str, str]) -> None:
    _, http = app
    secret = key["Authorization"].removeprefix("Bearer ")
    assert http.get("/v1/jobs/job_x", headers={"Authorization": secret}).status_code == 401
    assert http.get("/v1/jobs/job_x", headers={"Authorization": f"Token {secret}"}).status_code == 401
    assert http.get("/v1/jobs/job_x", headers=key).status_code == 404
    r = http.get("/v1/jobs/job_x", headers={**key, "X-Pad": "p" * 20_000})
    assert r.status_code == 431 and "limit of 16,384 bytes" in r.json()["error"]["message"]


def test_a_submit_warns_when_no_worker_serves_its_variant(app: Any, key: dict[str, str]) -> None:
    settings, http = app
    from yue2_jobs.db.models import WorkerProcess
    from yue2_jobs.db.session import session_factory, utcnow

    r = post_json(http, "/v1/jobs", {"input": "text", "variant": "legal"}, key)
    assert r.status_code == 201 and "no live worker serves variant 'legal'" in r.json()["warnings"][0]
    assert http.get("/healthz").json()["variants_without_workers"] == ["base", "legal"]
    with session_factory(settings.resolved_database_url)() as session:
        session.add(WorkerProcess(name="legal-cpu0@h", variant="legal", checkpoint="legal@x", pid=1,
                                  heartbeat_at=utcnow()))
        session.commit()
    r = post_json(http, "/v1/jobs", {"input": "text", "variant": "legal"}, key)
    assert r.status_code == 201 and "warnings" not in r.json()
    assert http.get("/healthz").json()["variants_without_workers"] == ["base"]


def test_large_inputs_are_read_from_the_uploaded_file_not_copied(app: Any, key: dict[str, str],
                                                                 s3: dict[str, str]) -> None:
    settings, http = app
    big = "word " * 1700  # just over the 8 KB inline limit
    data = "".join(json.dumps({"custom_id": f"c{i}", "body": {"input": f"{i} {big}"}}) + "\n" for i in range(2000))
    file_id = upload(http, key, data.encode()).json()["id"]
    before = _objects("hostile/", s3)
    t0 = time.perf_counter()
    r = post_json(http, "/v1/batches", {"input_file_id": file_id, "endpoint": "/v1/summarize"}, key)
    created_s = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    assert _objects("hostile/", s3) == before, "creating the batch wrote objects"
    from yue2_jobs.db.models import Job
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.jobs.inputs import read_input
    from yue2_jobs.storage import storage_from_url

    storage = storage_from_url(settings.resolved_storage_url, endpoint_url=settings.s3_endpoint_url)
    with session_factory(settings.resolved_database_url)() as session:
        jobs = session.query(Job).filter(Job.batch_id == r.json()["id"]).order_by(Job.custom_id).limit(3).all()
    for job in jobs:
        assert job.input_text is None
        assert read_input(storage, input_text=None, input_key=job.input_key, kind=job.kind) == \
            f"{job.custom_id[1:]} {big}"
    print(f"2,000 inputs of {len(big.encode()):,} bytes: batch created in {created_s:.2f}s")


# --- property: any Unicode in any string field is a 2xx or a 4xx, and what is accepted reads back

# Code points of every kind, lone surrogates and NUL included (st.text leaves surrogates out).
CODE_POINT = st.one_of(st.integers(0, 0x7F), st.integers(0xD800, 0xDFFF), st.integers(0, 0x10FFFF))
TEXT = st.lists(CODE_POINT, max_size=40).map(lambda cps: "".join(map(chr, cps)))


def as_sent(value: Any) -> Any:
    """`value` as the server decodes it from JSON: an escaped surrogate pair is one code point."""
    return json.loads(json.dumps(value))


PROPERTY = hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@PROPERTY
@given(text=TEXT, custom_id=TEXT)
def test_property_job_strings(app: Any, key: dict[str, str], text: str, custom_id: str) -> None:
    _, http = app
    r = post_json(http, "/v1/jobs", {"input": text, "custom_id": custom_id}, key)
    assert r.status_code < 500, r.text
    if r.status_code == 201:
        got = http.get(f"/v1/jobs/{r.json()['id']}", headers=key)
        assert got.status_code == 200 and got.json()["custom_id"] == as_sent(custom_id)


@PROPERTY
@given(text=TEXT, custom_id=TEXT, reference=TEXT, meta_key=TEXT, meta_value=TEXT)
def test_property_batch_strings(app: Any, key: dict[str, str], text: str, custom_id: str, reference: str,
                                meta_key: str, meta_value: str) -> None:
    _, http = app
    line = {"custom_id": custom_id, "body": {"input": text}, "reference": reference}
    up = upload(http, key, (json.dumps(line) + "\n").encode())
    assert up.status_code == 200, up.text
    r = post_json(http, "/v1/batches", {"input_file_id": up.json()["id"], "endpoint": "/v1/summarize",
                                        "metadata": {meta_key: meta_value}}, key)
    assert r.status_code < 500, r.text
    if r.status_code == 200:
        got = http.get(f"/v1/batches/{r.json()['id']}", headers=key)
        assert got.status_code == 200 and got.json()["metadata"] == as_sent({meta_key: meta_value})
        assert got.json()["request_counts"]["total"] == 1


@PROPERTY
@given(name=TEXT)
def test_property_experiment_names(app: Any, key: dict[str, str], name: str) -> None:
    _, http = app
    r = post_json(http, "/v1/experiments", {"name": name, "variants": [{"variant": "base"}, {"variant": "legal"}]},
                  key)
    assert r.status_code < 500, r.text
    if r.status_code == 201:
        got = http.get(f"/v1/experiments/{r.json()['id']}", headers=key)
        assert got.status_code == 200 and got.json()["name"] == as_sent(name)
