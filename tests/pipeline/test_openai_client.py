"""tests/openai_batch_script.py, the official `openai` client, against the API on uvicorn (real
Postgres, Redis and moto S3), while this process sends due webhooks as a worker would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

from tests.pipeline.conftest import ROOT, ApiServer, make_settings, new_key
from tests.scratch_redis import flush


def test_the_openai_client_lists_deletes_retries_idempotently_and_gets_a_signed_webhook(
        pipeline_env: dict[str, str], quiet_redis: Callable[[int], str]) -> None:
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.webhooks.delivery import deliver_due

    settings = make_settings(pipeline_env, broker_url=quiet_redis(7),
                             webhook_allow_private=True)
    server = ApiServer(settings)
    stop = threading.Event()

    def send() -> None:
        sessions = session_factory(settings.resolved_database_url)
        while not stop.wait(0.2):
            deliver_due(sessions, settings=settings)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "openai_batch_script.py"), "--base-url",
                               f"{server.url}/v1", "--api-key", new_key(settings, f"t-{uuid.uuid4().hex[:8]}")],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "NO_PROXY": "*"})
    finally:
        stop.set()
        sender.join(10)
        server.stop()
        flush(settings.broker_url)
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert seen["batches_made"] == 250 and seen["batches_listed"] == 250 and seen["listed_each_once"]
    assert seen["files_listed"] == 2 and seen["file_deleted"] is True and seen["deleted_file_listed"] is False
    assert seen["idempotent_same_batch"] and seen["batches_after_retry"] == 251
    assert seen["webhook_type"] == "batch.completed" and seen["webhook_for_first"]
