"""Schemathesis against the live API (uvicorn on 127.0.0.1, the real Postgres, Redis and moto), as its
command line runs it: `--checks all`, 50 examples per operation, derandomized (the same cases
every run), with a valid API key. Every operation is covered, webhook registration included: the
API's webhook URL check resolves names through a stand-in resolver that answers 127.0.0.1 for
every name (so no generated host is ever looked up beyond this machine), and the API allows
loopback targets (`YUE2_WEBHOOK_ALLOW_PRIVATE`) so that a well-formed URL is accepted; the
endpoints it registers are deleted before any worker could send to them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select

from tests.pipeline.conftest import ApiServer, make_settings, new_key
from tests.scratch_redis import flush
from yue2_jobs.db.models_api import WebhookDelivery, WebhookEndpoint
from yue2_jobs.db.session import session_factory
from yue2_jobs.webhooks import targets

EXAMPLES = 50


def _loopback_resolver() -> types.SimpleNamespace:
    """The `socket` the webhook URL check sees: an address literal as it is, any name 127.0.0.1;
    it never asks DNS."""
    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return socket.getaddrinfo(host, port, *args, **{**kwargs, "flags": socket.AI_NUMERICHOST})
        except (socket.gaierror, UnicodeError):
            return socket.getaddrinfo("127.0.0.1", port, *args, **{**kwargs, "flags": socket.AI_NUMERICHOST})

    return types.SimpleNamespace(getaddrinfo=getaddrinfo, gaierror=socket.gaierror, SOCK_STREAM=socket.SOCK_STREAM)


@pytest.fixture(scope="module")
def conformance_api(pipeline_env: dict[str, str], quiet_redis: Callable[[int], str]
                    ) -> Iterator[tuple[Any, ApiServer, str]]:
    """The API on a Redis database no worker reads (flushed after), so no worker runs what it creates, with
    the stand-in resolver; its tenant's webhook endpoints are deleted after."""
    settings = make_settings(pipeline_env, broker_url=quiet_redis(14),
                             webhook_allow_private=True,
                             health_stall_s=86400)  # runs no worker by design: its queued jobs are no outage
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    patch = pytest.MonkeyPatch()
    patch.setattr(targets, "socket", _loopback_resolver())
    server = ApiServer(settings)
    try:
        yield settings, server, tenant
    finally:
        server.stop()
        patch.undo()
        with session_factory(settings.resolved_database_url)() as session:
            ids = select(WebhookEndpoint.id).where(WebhookEndpoint.tenant == tenant).scalar_subquery()
            session.execute(delete(WebhookDelivery).where(WebhookDelivery.endpoint_id.in_(ids)))
            session.execute(delete(WebhookEndpoint).where(WebhookEndpoint.tenant == tenant))
            session.commit()
        flush(settings.broker_url)


def test_schemathesis_all_checks_pass(conformance_api: tuple[Any, ApiServer, str], tmp_path: Path) -> None:
    settings, server, tenant = conformance_api
    key = new_key(settings, tenant)
    report = tmp_path / "st.ndjson"
    run = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "run", f"{server.url}/openapi.json",
         "--checks", "all", "--max-examples", str(EXAMPLES), "--generation-deterministic", "--seed", "38",
         "--workers", "1", "--phases", "examples,coverage,fuzzing,stateful", "--no-shrink",
         "-H", f"Authorization: Bearer {key}", "--report", "ndjson", "--report-ndjson-path", str(report)],
        capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    summary = [ln for ln in out.splitlines() if any(w in ln for w in ("passed", "failed", "errors", "cases"))]
    print("\n".join(summary[-12:]))
    assert run.returncode == 0, out[-12000:]
