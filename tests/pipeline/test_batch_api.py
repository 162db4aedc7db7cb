"""OpenAI Batch API parity on the real Postgres, Redis and moto S3: list endpoints with cursors,
file deletion, expiry mid-run, retrying the failed lines, idempotency keys, and their limits."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from sqlalchemy import update

from tests.pipeline.batch_api_helpers import create_batch, jsonl, quiet_api, run_jobs, summarize_lines
from tests.pipeline.conftest import new_key

__all__ = ["quiet_api"]  # the module fixture, used by name


def headers(settings: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(settings, f't-{uuid.uuid4().hex[:8]}')}"}


def test_lists_page_newest_first_with_cursors_and_limits(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    made = [create_batch(http, h, summarize_lines(1))["id"] for _ in range(7)]
    seen, after = [], None
    while True:
        page = http.get("/v1/batches", headers=h, params={"limit": 3, **({"after": after} if after else {})}).json()
        assert page["object"] == "list" and len(page["data"]) <= 3
        seen += [b["id"] for b in page["data"]]
        assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == made[::-1]  # newest first, each once
    assert http.get("/v1/batches", headers=headers(settings)).json()["data"] == []  # tenant-scoped
    for bad in ({"limit": 0}, {"limit": 101}):
        r = http.get("/v1/batches", headers=h, params=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit" and "1 to 100" in r.text
    for after in ("batch_nope", made[0] + "x", "a b"):  # names none of the tenant's objects: 404
        r = http.get("/v1/batches", headers=h, params={"after": after})
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_cursor", after
        assert r.json()["error"]["param"] == "after" and after in r.json()["error"]["message"]
    other = headers(settings)  # another tenant's id is an unknown cursor too
    assert http.get("/v1/batches", headers=other, params={"after": made[0]}).status_code == 404
    assert http.get("/v1/batches", headers=h, params={"after": ""}).json()["data"][0]["id"] == made[-1]  # no cursor
    files = http.get("/v1/files", headers=h, params={"purpose": "batch", "order": "asc", "limit": 100}).json()
    assert len(files["data"]) == 7 and [f["purpose"] for f in files["data"]] == ["batch"] * 7
    assert files["data"][0]["created_at"] <= files["data"][-1]["created_at"]
    assert http.get("/v1/files", headers=h, params={"purpose": "nope"}).status_code == 400


def test_a_file_in_use_cannot_be_deleted_until_its_batch_ends(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    batch = create_batch(http, h, summarize_lines(3))
    file_id = batch["input_file_id"]
    r = http.delete(f"/v1/files/{file_id}", headers=h)
    assert r.status_code == 409 and batch["id"] in r.json()["error"]["message"]
    assert http.delete(f"/v1/files/{file_id}", headers=headers(settings)).status_code == 404  # not theirs
    assert http.post(f"/v1/batches/{batch['id']}/cancel", headers=h).json()["status"] == "cancelled"
    r = http.delete(f"/v1/files/{file_id}", headers=h)
    assert r.status_code == 200 and r.json() == {"id": file_id, "object": "file", "deleted": True}
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        assert http.get(path, headers=h).status_code == 404
    assert file_id not in [f["id"] for f in http.get("/v1/files", headers=h).json()["data"]]
    assert http.delete(f"/v1/files/{file_id}", headers=h).status_code == 404
    r = http.post("/v1/batches", headers=h, json={"input_file_id": file_id, "endpoint": "/v1/summarize"})
    assert r.status_code == 404  # a batch cannot start on a deleted file
    assert http.get(f"/v1/batches/{batch['id']}", headers=h).json()["input_file_id"] == file_id


def _expire_now(settings: Any, batch_id: str) -> Any:
    from yue2_jobs.db.models import Batch
    from yue2_jobs.db.session import session_factory, utcnow
    from yue2_jobs.jobs.reconciler import reconcile_once
    from yue2_jobs.queue import make_celery
    from yue2_jobs.storage import storage_from_url

    with session_factory(settings.resolved_database_url)() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=utcnow()))
        session.commit()
        return reconcile_once(session, settings=settings, celery_app=make_celery(settings),
                              storage=storage_from_url(settings.resolved_storage_url,
                                                       endpoint_url=settings.s3_endpoint_url))


def test_a_batch_expires_mid_run_and_its_failed_lines_can_be_retried(quiet_api: Any) -> None:
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.jobs.state import finish_jobs

    settings, http = quiet_api
    h = headers(settings)
    lines = summarize_lines(6)
    batch = create_batch(http, h, lines, metadata={"team": "night"})
    assert http.post(f"/v1/batches/{batch['id']}/retry_failed", headers=h).status_code == 409  # still running
    running = run_jobs(settings, batch["id"], succeed=2, leave_running=1)  # c0, c1 done; c2 running; c3-c5 queued
    report = _expire_now(settings, batch["id"])
    assert report.expired_batches == [batch["id"]] and batch["id"] in report.finalized_batches
    state = http.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert state["status"] == "expired" and state["expired_at"] is not None
    counts = state["request_counts"]
    assert counts == {"total": 6, "completed": 2, "failed": 4} and counts["completed"] + counts["failed"] == 6
    out = [json.loads(x) for x in http.get(f"/v1/files/{state['output_file_id']}/content", headers=h).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == ["c0", "c1"]
    assert out[0]["response"]["body"]["output"].startswith("summary of")
    errs = [json.loads(x) for x in http.get(f"/v1/files/{state['error_file_id']}/content", headers=h).text.splitlines()]
    assert sorted(e["custom_id"] for e in errs) == ["c2", "c3", "c4", "c5"]
    assert {e["error"]["code"] for e in errs} == {"batch_expired"}
    # The request that was running when the batch expired finishes later: its result is discarded.
    with session_factory(settings.resolved_database_url)() as session:
        assert finish_jobs(session, [{"id": running[0].id, "claim_token": running[0].claim_token,
                                      "status": "succeeded", "output_text": "late"}]) == 0
    assert _expire_now(settings, batch["id"]).expired_batches == []  # once only

    retry = http.post(f"/v1/batches/{batch['id']}/retry_failed", headers=h)
    assert retry.status_code == 200, retry.text
    retry = retry.json()
    assert retry["metadata"] == {"team": "night", "retry_of": batch["id"]} and retry["status"] == "in_progress"
    assert retry["request_counts"]["total"] == 4
    sent = http.get(f"/v1/files/{retry['input_file_id']}/content", headers=h).content
    assert sent == jsonl(lines[2:])  # the same lines, byte for byte: same bodies and custom_ids


def _post_at_once(http: Any, path: str, h: dict[str, str], n: int) -> list[Any]:
    results: list[Any] = []
    start = threading.Barrier(n)

    def post() -> None:
        start.wait()
        results.append(http.post(path, headers=h))

    threads = [threading.Thread(target=post) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_retry_failed_makes_one_retry_batch_however_often_it_is_called(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    batch = create_batch(http, h, summarize_lines(4))
    run_jobs(settings, batch["id"], succeed=1, leave_running=0)
    _expire_now(settings, batch["id"])  # c1-c3 expire
    path = f"/v1/batches/{batch['id']}/retry_failed"
    # The same Idempotency-Key on 10 concurrent calls: one retry batch, the same answer to each.
    keyed = _post_at_once(http, path, {**h, "Idempotency-Key": "retry-1"}, 10)
    assert [r.status_code for r in keyed] == [200] * 10, [r.text for r in keyed if r.status_code != 200]
    assert len({r.json()["id"] for r in keyed}) == 1
    first = keyed[0].json()["id"]
    # Without a key, while that retry runs: refused, naming it.
    plain = _post_at_once(http, path, h, 10)
    assert {r.status_code for r in plain} == {409} and first in plain[0].json()["error"]["message"]
    listed = [b for b in http.get("/v1/batches", headers=h).json()["data"] if b["metadata"]]
    assert [b["id"] for b in listed] == [first]
    # Once the retry has ended, the original can be retried again: 10 calls at once, one batch.
    http.post(f"/v1/batches/{first}/cancel", headers=h)
    again = _post_at_once(http, path, h, 10)
    assert sorted(r.status_code for r in again) == [200] + [409] * 9, [r.text for r in again]
    listed = [b["id"] for b in http.get("/v1/batches", headers=h).json()["data"] if b["metadata"]]
    assert len(listed) == 2 and first in listed


def test_retry_failed_needs_failed_lines(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    batch = create_batch(http, h, summarize_lines(2))
    run_jobs(settings, batch["id"], succeed=2, leave_running=0)
    _expire_now(settings, batch["id"])  # all finished: it completes, it does not expire
    assert http.get(f"/v1/batches/{batch['id']}", headers=h).json()["status"] == "completed"
    r = http.post(f"/v1/batches/{batch['id']}/retry_failed", headers=h)
    assert r.status_code == 409 and "no failed" in r.json()["error"]["message"]


def test_idempotency_keys_replay_the_first_response(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    f = http.post("/v1/files", headers={**h, "Idempotency-Key": "upload-1"}, data={"purpose": "batch"},
                  files={"file": ("in.jsonl", jsonl(summarize_lines(2)), "application/jsonl")})
    again = http.post("/v1/files", headers={**h, "Idempotency-Key": "upload-1"}, data={"purpose": "batch"},
                      files={"file": ("in.jsonl", jsonl(summarize_lines(2)), "application/jsonl")})
    assert again.json()["id"] == f.json()["id"] and again.headers["idempotent-replayed"] == "true"
    body = {"input_file_id": f.json()["id"], "endpoint": "/v1/summarize", "completion_window": "24h"}
    results: list[Any] = []

    def post() -> None:
        results.append(http.post("/v1/batches", headers={**h, "Idempotency-Key": "nightly-42"}, json=body))

    threads = [threading.Thread(target=post) for _ in range(4)]  # at once: some wait for the first
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {r.status_code for r in results} == {200}
    assert len({r.json()["id"] for r in results}) == 1
    assert len(http.get("/v1/batches", headers=h).json()["data"]) == 1  # one batch, paid once
    r = http.post("/v1/batches", headers={**h, "Idempotency-Key": "nightly-42"}, json={**body, "metadata": {"a": "b"}})
    assert r.status_code == 409 and "different request" in r.json()["error"]["message"]
    # Keys are per tenant: another tenant's same key is its own.
    other = headers(settings)
    job = http.post("/v1/jobs", headers={**other, "Idempotency-Key": "nightly-42"}, json={"input": "a text"})
    assert job.status_code == 201
    twice = http.post("/v1/jobs", headers={**other, "Idempotency-Key": "nightly-42"}, json={"input": "a text"})
    assert twice.status_code == 201 and twice.json()["id"] == job.json()["id"]
    bad = http.post("/v1/jobs", headers={**other, "Idempotency-Key": "x" * 256}, json={"input": "a text"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Idempotency-Key"


def test_a_failed_first_request_leaves_its_key_free(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = {**headers(settings), "Idempotency-Key": "k-1"}
    assert http.post("/v1/jobs", headers=h, json={"input": ""}).status_code == 422
    assert http.post("/v1/jobs", headers=h, json={"input": "now valid"}).status_code == 201


def test_a_cancelled_batch_counts_its_unrun_lines_as_failed_and_retries_them(quiet_api: Any) -> None:
    settings, http = quiet_api
    h = headers(settings)
    lines = summarize_lines(5)
    batch = create_batch(http, h, lines)
    run_jobs(settings, batch["id"], succeed=2, leave_running=0)  # c0, c1 done; c2-c4 never run
    state = http.post(f"/v1/batches/{batch['id']}/cancel", headers=h).json()
    assert state["status"] == "cancelled"
    assert state["request_counts"] == {"total": 5, "completed": 2, "failed": 3}  # adds up: OpenAI's sense
    errs = [json.loads(x) for x in http.get(f"/v1/files/{state['error_file_id']}/content", headers=h).text.splitlines()]
    assert sorted(e["custom_id"] for e in errs) == ["c2", "c3", "c4"]
    retry = http.post(f"/v1/batches/{batch['id']}/retry_failed", headers=h)
    assert retry.status_code == 200, retry.text
    assert retry.json()["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    sent = http.get(f"/v1/files/{retry.json()['input_file_id']}/content", headers=h).content
    assert sent == jsonl(lines[2:])  # the lines that never ran, byte for byte
