"""Shared by the batch-API tests: an API on its own Redis database (no worker consumes it, so
jobs stay where a test puts them), a webhook receiver on 127.0.0.1, a simulated worker."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.pipeline.conftest import make_settings
from tests.scratch_redis import flush

JSONL = "application/jsonl"


@pytest.fixture(scope="module")
def quiet_api(pipeline_env: dict[str, str], quiet_redis: Callable[[int], str]) -> Iterator[tuple[Any, TestClient]]:
    """An API publishing to database 6 of the run's Redis, which no worker reads; webhooks may target 127.0.0.1."""
    from yue2_jobs.api.app import create_app

    settings = make_settings(pipeline_env, broker_url=quiet_redis(6),
                             webhook_allow_private=True, webhook_retry_s=[0.05], webhook_timeout_s=3,
                             webhook_max_endpoints=3)
    with TestClient(create_app(settings)) as http:
        yield settings, http
    flush(settings.broker_url)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(ln) + "\n" for ln in lines).encode()


def summarize_lines(n: int, *, prefix: str = "c") -> list[dict[str, Any]]:
    return [{"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/summarize",
             "body": {"input": f"document number {i} says something worth a summary", "max_new_tokens": 8}}
            for i in range(n)]


def create_batch(http: TestClient, headers: dict[str, str], lines: list[dict[str, Any]], **extra: Any) -> Any:
    f = http.post("/v1/files", headers=headers, data={"purpose": "batch"},
                  files={"file": ("in.jsonl", jsonl(lines), JSONL)}).json()
    r = http.post("/v1/batches", headers=headers, json={"input_file_id": f["id"], "endpoint": "/v1/summarize",
                                                        "completion_window": "24h", **extra})
    assert r.status_code == 200, r.text
    return r.json()


def run_jobs(settings: Any, batch_id: str, *, succeed: int, leave_running: int) -> list[Any]:
    """Be a worker: claim `succeed + leave_running` of the batch's queued jobs, finish `succeed` of
    them with an output; returns the claimed rows still running."""
    from sqlalchemy import select

    from yue2_jobs.db.models import Job, JobStatus
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.jobs.state import claim_jobs, finish_jobs

    with session_factory(settings.resolved_database_url)() as session:
        ids = session.execute(select(Job.id).where(Job.batch_id == batch_id, Job.status == JobStatus.QUEUED)
                              .order_by(Job.custom_id).limit(succeed + leave_running)).scalars().all()
        claimed, _ = claim_jobs(session, job_ids=list(ids), worker="test-worker", lease_s=600, max_attempts=3)
        claimed = sorted(claimed, key=lambda j: j.custom_id)  # RETURNING keeps no order
        done = [{"id": j.id, "claim_token": j.claim_token, "status": JobStatus.SUCCEEDED, "checkpoint": "base@test",
                 "output_text": f"summary of {j.custom_id}", "output_key": f"t/{j.id}.json", "output_tokens": 3,
                 "input_tokens": 9} for j in claimed[:succeed]]
        assert finish_jobs(session, done) == succeed
        return list(claimed[succeed:])


class Receiver:
    """A webhook receiver on 127.0.0.1: answers with `codes` in turn (then 200), records each request."""

    def __init__(self, *, port: int = 0, codes: list[int] | None = None) -> None:
        self.codes = list(codes or [])
        self.requests: list[tuple[dict[str, str], bytes, int]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                code = receiver.codes.pop(0) if receiver.codes else 200
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body, code))
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/yue2"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
