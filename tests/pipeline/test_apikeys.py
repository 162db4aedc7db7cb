"""API keys on the real Postgres and Redis: `yue2 apikey list | revoke`, a revocation reaching a
running API process within a second, and key expiry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import httpx

from tests.pipeline.conftest import ROOT, wait_for


def yue2(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "yue2_jobs", *args], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_revoked_key_fails_within_a_second_on_a_running_api(api: Any, pipeline_env: dict[str, str]) -> None:
    from yue2_jobs.auth import CACHE

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    secret = yue2(pipeline_env, "apikey", "create", "--tenant", tenant, "--name", "nightly").strip()
    other = yue2(pipeline_env, "apikey", "--tenant", tenant).strip()  # the old spelling still creates
    listed = [json.loads(x) for x in yue2(pipeline_env, "apikey", "list", "--tenant", tenant).splitlines()]
    assert len(listed) == 2 and all(secret not in json.dumps(k) and other not in json.dumps(k) for k in listed)
    mine = next(k for k in listed if k["name"] == "nightly")
    assert secret.startswith(mine["prefix"].removesuffix("...")) and mine["state"] == "active"
    wait_for(lambda: CACHE.listening, timeout=10, what="the API's revocation listener")
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {secret}"}) as http:
        assert http.get("/v1/batches").status_code == 200  # now cached in the API process
        assert http.get("/v1/batches").status_code == 200
        out = yue2(pipeline_env, "apikey", "revoke", mine["id"])
        revoked_at = time.monotonic()
        assert "1 API process" in out or "API process(es) told" in out, out
        wait_for(lambda: http.get("/v1/batches").status_code == 401, timeout=1.0, interval=0.02,
                 what="the revoked key to be refused")
        print(f"revoked key refused {time.monotonic() - revoked_at:.3f}s after `yue2 apikey revoke` returned")
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {other}"}) as http:
        assert http.get("/v1/batches").status_code == 200  # the tenant's other key still works
    states = {k["id"]: k["state"] for k in
              (json.loads(x) for x in yue2(pipeline_env, "apikey", "list", "--tenant", tenant).splitlines())}
    assert states[mine["id"]] == "revoked"


def test_an_expired_key_is_refused(api: Any, settings: Any) -> None:
    from yue2_jobs.auth import create_api_key
    from yue2_jobs.db.session import session_factory, utcnow

    with session_factory(settings.resolved_database_url)() as session:
        past = create_api_key(session, tenant="t-exp", expires_at=utcnow() - timedelta(seconds=1))
        soon = create_api_key(session, tenant="t-exp", expires_at=utcnow() + timedelta(seconds=2))
    with httpx.Client(base_url=api.url) as http:
        r = http.get("/v1/batches", headers={"Authorization": f"Bearer {past}"})
        assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
        assert http.get("/v1/batches", headers={"Authorization": f"Bearer {soon}"}).status_code == 200
        # cached, but only until it expires
        wait_for(lambda: http.get("/v1/batches", headers={"Authorization": f"Bearer {soon}"}).status_code == 401,
                 timeout=5, what="the key to expire")


def test_a_revocation_reaches_only_its_own_deployment(api: Any, pipeline_env: dict[str, str]) -> None:
    """Two deployments on one Redis (databases 0 and 5): pub/sub ignores database numbers, so each
    deployment's revocations go on a channel of its own."""
    import redis

    from yue2_jobs.api.revocations import announce, channel_for
    from yue2_jobs.auth import CACHE

    ours = pipeline_env["YUE2_BROKER_URL"]
    theirs = ours.rsplit("/", 1)[0] + "/5"
    assert channel_for(ours) != channel_for(theirs)
    wait_for(lambda: CACHE.listening, timeout=10, what="the API's revocation listener")
    with redis.Redis.from_url(theirs) as r:
        other = r.pubsub(ignore_subscribe_messages=True)
        other.subscribe(channel_for(theirs))  # what the other deployment's API processes listen on
        wait_for(lambda: dict(r.pubsub_numsub(channel_for(theirs))).get(channel_for(theirs).encode()), timeout=5,
                 what="the other deployment's subscription")
        listening_here = dict(r.pubsub_numsub(channel_for(ours)))[channel_for(ours).encode()]
        assert listening_here >= 1  # this session's API process
        assert announce(ours, "0" * 64) == listening_here
        assert other.get_message(timeout=0.5) is None, "the other deployment heard our revocation"
        other.close()
