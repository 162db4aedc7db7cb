"""A batch's stats as the console shows them (`GET /v1/batches/{id}/stats`), on the embedded stack:
throughput is the batch's own average (waiting, then running, then a final figure that no longer
changes), the ETA is what is left at that rate, and the first failed lines come with their errors."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select, update

from tests.jobs.conftest import Submit
from yue2_jobs.auth import create_api_key
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import utcnow
from yue2_jobs.jobs.state import claim_jobs, finish_jobs


def _run(sessions: Any, batch_id: str, ids: list[str], *, started_s_ago: float, finished_s_ago: float,
         now: datetime | None = None) -> None:
    """Be a worker for `ids`: claim and finish them, then set when they started and finished
    (seconds before `now`: one instant for several calls, so a slow machine does not move it)."""
    now = now or utcnow()
    with sessions() as session:
        claimed, _ = claim_jobs(session, job_ids=ids, worker="w", lease_s=60, max_attempts=3)
        finish_jobs(session, [{"id": j.id, "claim_token": j.claim_token, "status": "succeeded", "output_text": "ok",
                               "output_key": f"outputs/{j.id}.json", "output_tokens": 1} for j in claimed])
        session.execute(update(Job).where(Job.id.in_(ids)).values(
            started_at=now - timedelta(seconds=started_s_ago), finished_at=now - timedelta(seconds=finished_s_ago)))
        session.commit()


def test_throughput_is_the_batch_average_and_ends_final(api: tuple[TestClient, Any], submit: Submit) -> None:
    client, sessions = api
    lines = [{"custom_id": f"c{i}", "body": {"input": f"text {i}"}} for i in range(4)]
    lines.append({"custom_id": "bad", "body": {"input": ""}})  # fails alone, at create time
    batch_id = submit(lines)
    stats = client.get(f"/v1/batches/{batch_id}/stats").json()
    assert (stats["rate"], stats["throughput_per_s"], stats["eta_s"]) == ("waiting", None, None)
    assert stats["errors_preview"] == [{"custom_id": "bad", "status": "failed", "code": "invalid_request",
                                        "message": "body.input is required for a summarize job and must not be "
                                                   "empty"}]
    with sessions() as session:
        ids = list(session.execute(select(Job.id).where(Job.batch_id == batch_id, Job.status == "queued")
                                   .order_by(Job.custom_id)).scalars())
    now = utcnow()
    _run(sessions, batch_id, ids[:2], started_s_ago=20, finished_s_ago=10, now=now)  # 2 jobs in the 20 s since
    stats = client.get(f"/v1/batches/{batch_id}/stats").json()
    assert stats["rate"] == "running" and 0.09 < stats["throughput_per_s"] <= 0.1  # 2 / (20 s and a little)
    assert 19 < stats["eta_s"] < 21  # 2 left at that rate
    _run(sessions, batch_id, ids[2:], started_s_ago=15, finished_s_ago=4, now=now)  # the last finished 4 s ago
    final = client.get(f"/v1/batches/{batch_id}/stats").json()
    assert (final["rate"], final["eta_s"], final["throughput_per_s"]) == ("final", 0, 0.25)  # 4 jobs / 16 s
    assert client.get(f"/v1/batches/{batch_id}/stats").json()["throughput_per_s"] == 0.25  # it stays


def _ids(page: dict[str, Any]) -> list[str]:
    return [j["custom_id"] for j in page["data"]]


def test_the_line_browser_pages_a_batchs_jobs_by_custom_id_and_filters_by_status(
        api: tuple[TestClient, Any], submit: Submit) -> None:
    client, sessions = api
    lines = [{"custom_id": f"c{i}", "body": {"input": f"text {i}"}} for i in (3, 0, 4, 1, 2)]
    lines.append({"custom_id": "bad", "body": {"input": ""}})  # fails alone, at create time
    batch_id = submit(lines)
    url = f"/v1/batches/{batch_id}/jobs"
    seen, after, pages = [], None, 0
    while True:  # pages of 2, each after the previous page's last job: every line once, in custom_id order
        page = client.get(url, params={"limit": 2, **({"after": after} if after else {})}).json()
        seen += _ids(page)
        pages += 1
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == ["bad", "c0", "c1", "c2", "c3", "c4"] and pages == 3
    failed = client.get(url, params={"status": "failed"}).json()
    assert _ids(failed) == ["bad"] and failed["has_more"] is False
    assert failed["data"][0]["error"]["code"] == "invalid_request" and failed["data"][0]["batch_id"] == batch_id
    with sessions() as session:  # c1 succeeds, as a worker would record it
        (c1,) = session.execute(select(Job.id).where(Job.batch_id == batch_id, Job.custom_id == "c1")).one()
    _run(sessions, batch_id, [c1], started_s_ago=2, finished_s_ago=1)
    ok = client.get(url, params={"status": "succeeded"}).json()["data"]
    assert [(j["custom_id"], j["output"]) for j in ok] == [("c1", "ok")]
    # A filtered page goes on after a cursor whose own status is another one.
    assert _ids(client.get(url, params={"status": "queued", "after": c1}).json()) == ["c2", "c3", "c4"]
    assert client.post(f"/v1/batches/{batch_id}/cancel").status_code == 200
    cancelled = client.get(url, params={"status": "cancelled", "limit": 1}).json()
    assert _ids(cancelled) == ["c0"] and cancelled["has_more"] is True
    assert cancelled["data"][0]["error"]["code"] == "cancelled"  # as its error-file line says it


def test_the_line_browser_refuses_a_bad_page_size_status_or_cursor(api: tuple[TestClient, Any],
                                                                    submit: Submit) -> None:
    client, sessions = api
    batch_id = submit([{"custom_id": "a", "body": {"input": "text"}}])
    other = submit([{"custom_id": "b", "body": {"input": "text"}}])
    url = f"/v1/batches/{batch_id}/jobs"
    for limit in (0, 101):
        r = client.get(url, params={"limit": limit})
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text
        assert "from 1 to 100" in r.json()["error"]["message"]
    r = client.get(url, params={"status": "done"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "query.status"  # as every query field
    assert "'succeeded'" in r.json()["error"]["message"]  # it names what the field takes
    other_job = client.get(f"/v1/batches/{other}/jobs").json()["data"][0]["id"]
    for after in (other_job, "job_nope", "not an id"):  # another batch's job is no cursor here either
        r = client.get(url, params={"after": after})
        error = r.json()["error"]
        assert (r.status_code, error["param"], error["code"]) == (404, "after", "unknown_cursor")
    with sessions() as session:  # another tenant's batch is not found, its lines with it
        key = create_api_key(session, tenant="other")
    r = client.get(url, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 404
