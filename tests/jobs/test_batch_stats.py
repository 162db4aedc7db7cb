"""A batch's stats as the console shows them (`GET /v1/batches/{id}/stats`), on the embedded stack:
throughput is the batch's own average (waiting, then running, then a final figure that no longer
changes), the ETA is what is left at that rate, and the first failed lines come with their errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from yue2_jobs.api.app import create_app
from yue2_jobs.auth import create_api_key
from yue2_jobs.core.config import Settings
from yue2_jobs.db.migrate import upgrade_head
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import session_factory, utcnow
from yue2_jobs.jobs.state import claim_jobs, finish_jobs


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, Any]]:
    settings = Settings(home=tmp_path)
    upgrade_head(settings.resolved_database_url)
    sessions = session_factory(settings.resolved_database_url)
    with sessions() as session:
        key = create_api_key(session, tenant="acme")
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
        yield client, sessions


def _batch(client: TestClient, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(ln) + "\n" for ln in lines).encode()
    f = client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data, "application/jsonl")})
    r = client.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/summarize"})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _run(sessions: Any, batch_id: str, ids: list[str], *, started_s_ago: float, finished_s_ago: float,
         now: datetime | None = None) -> None:
    """Be a worker for `ids`: claim and finish them, then set when they started and finished
    (seconds before `now`: one instant for several calls, so a slow machine does not move it)."""
    now = now or utcnow()
    with sessions() as session:
        claimed, _ = claim_jobs(session, job_ids=ids, worker="w", lease_s=60, max_attempts=3)
        finish_jobs(session, [{"id": j.id, "claim_token": j.claim_token, "status": "succeeded", "output_text": "ok",
                               "output_tokens": 1} for j in claimed])
        session.execute(update(Job).where(Job.id.in_(ids)).values(
            started_at=now - timedelta(seconds=started_s_ago), finished_at=now - timedelta(seconds=finished_s_ago)))
        session.commit()


def test_throughput_is_the_batch_average_and_ends_final(api: tuple[TestClient, Any]) -> None:
    client, sessions = api
    lines = [{"custom_id": f"c{i}", "body": {"input": f"text {i}"}} for i in range(4)]
    lines.append({"custom_id": "bad", "body": {"input": ""}})  # fails alone, at create time
    batch_id = _batch(client, lines)
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
