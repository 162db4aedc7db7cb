"""The job-read pool on the real Postgres: no error can leak a connection, a wait for one is bounded,
and ids that cannot exist never reach the database."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from tests.pipeline.conftest import new_key
from yue2_jobs.api import job_reader
from yue2_jobs.api.job_reader import JobReader
from yue2_jobs.db.session import session_factory
from yue2_jobs.errors import NotFoundError, ServiceUnavailableError


def test_nul_ids_then_valid_reads_all_answer_within_a_second(api: Any, settings: Any, tenant: str) -> None:
    headers = {"Authorization": f"Bearer {new_key(settings, tenant)}"}
    with httpx.Client(base_url=api.url, headers=headers, timeout=10) as http:
        job_id = http.post("/v1/jobs", json={"input": "poll me"}).json()["id"]
        for _ in range(8):
            r = http.get("/v1/jobs/x%00y")
            assert r.status_code == 404, r.text
        for _ in range(50):
            t0 = time.perf_counter()
            r = http.get(f"/v1/jobs/{job_id}")
            assert r.status_code == 200 and time.perf_counter() - t0 < 1.0, r.text


def test_query_errors_give_their_connection_back(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = JobReader(settings.resolved_database_url, session_factory(settings.resolved_database_url),
                       connections=2, wait_s=1.0)

    async def scenario() -> None:
        import psycopg

        # A query that fails in the database (division by zero is a DataError, as a NUL was) ...
        monkeypatch.setattr(job_reader, "QUERY", "SELECT 1 / 0 WHERE %s::text <> %s::text")
        for _ in range(8):
            with pytest.raises(psycopg.DataError):
                await reader.get(tenant="t", job_id="job_abc")
        monkeypatch.undo()
        # ... leaves the pool whole: the next reads find a free connection at once.
        for _ in range(4):
            t0 = time.perf_counter()
            with pytest.raises(NotFoundError):
                await reader.get(tenant="t", job_id="job_missing")
            assert time.perf_counter() - t0 < 1.0
        assert reader.slots is not None and reader.slots._value == 2  # both free

        # Every connection held: a reader waits at most wait_s, then gets a retryable 503.
        held = [await reader._acquire(), await reader._acquire()]
        t0 = time.perf_counter()
        with pytest.raises(ServiceUnavailableError):
            await reader.get(tenant="t", job_id="job_abc")
        assert 0.9 < time.perf_counter() - t0 < 3
        for conn in held:
            await reader._release(conn, reusable=True)
        with pytest.raises(NotFoundError):
            await reader.get(tenant="t", job_id="job_missing")
        for conn in reader.idle:
            await conn.close()

    asyncio.run(scenario())


def test_impossible_ids_are_404_without_a_connection(settings: Any) -> None:
    reader = JobReader(settings.resolved_database_url, session_factory(settings.resolved_database_url))

    async def scenario() -> None:
        for bad in ("x\x00y", "\ud800", "", "a" * 65, "../etc", "job id"):
            with pytest.raises(NotFoundError):
                await reader.get(tenant="t", job_id=bad)
        assert reader.slots is None  # the pool was never touched

    asyncio.run(scenario())
