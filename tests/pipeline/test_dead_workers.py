"""The reconciler reaps a worker that stopped reporting (its host died with its launcher): the claims
it held end and the message it had received and not acknowledged goes back to its queue at once, on
the real Postgres and Redis."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import redis
from sqlalchemy import select

from yue2_jobs.db.models import Job, JobStatus, WorkerProcess
from yue2_jobs.db.session import session_factory, utcnow
from yue2_jobs.jobs.reconciler import reconcile_once
from yue2_jobs.queue import held_key, job_ids_of_message, make_celery, publish, queue_for


def _dead_worker_holding_a_job(settings: Any, *, silent_s: float) -> tuple[str, str, str, Any, Any]:
    """A running job claimed by a worker whose status row is `silent_s` old, and its message received
    (unacknowledged, in kombu's `unacked` hash) by that worker. Returns (node, job id, delivery tag,
    the celery app, the open connection holding the delivery)."""
    variant, node, job_id = f"dead-{uuid.uuid4().hex[:8]}", f"gone-{uuid.uuid4().hex[:8]}@host-x", uuid.uuid4().hex
    app = make_celery(settings)
    now = utcnow()
    with session_factory(settings.resolved_database_url)() as session:
        session.add(Job(id=job_id, tenant="t-dead", kind="summarize", status=JobStatus.RUNNING, variant=variant,
                        params={}, input_text="x", attempts=1, claim_token="t0", worker=node, created_at=now,
                        started_at=now, lease_expires_at=now + timedelta(seconds=120)))
        session.add(WorkerProcess(name=node, variant=variant, checkpoint=f"{variant}@v", pid=1,
                                  heartbeat_at=now - timedelta(seconds=silent_s)))
        session.commit()
        publish(app, session, [(job_id, variant)])
    conn = app.connection_for_write()
    message = conn.default_channel.basic_get(queue_for(variant), no_ack=False)
    assert message is not None
    with redis.Redis.from_url(settings.broker_url) as r:
        r.sadd(held_key(node), message.delivery_tag)
        assert r.hexists("unacked", message.delivery_tag)
    return node, job_id, message.delivery_tag, app, conn


def _cleanup(settings: Any, *conns: Any) -> None:
    """Close the connections (kombu puts back what they still hold), then drop the tests' queues."""
    for conn in conns:
        conn.release()
    with redis.Redis.from_url(settings.broker_url) as r:
        for key in r.scan_iter("yue2.dead-*"):
            r.delete(key)


def _reconcile(settings: Any, app: Any, *, reap: bool) -> Any:
    from yue2_jobs.storage import storage_from_url

    storage = storage_from_url(settings.resolved_storage_url, endpoint_url=settings.s3_endpoint_url)
    with session_factory(settings.resolved_database_url)() as session:
        return reconcile_once(session, settings=settings, celery_app=app, storage=storage, reap_dead=reap)


def test_a_silent_worker_is_reaped_its_claims_end_and_its_message_goes_back(settings: Any) -> None:
    node, job_id, tag, app, conn = _dead_worker_holding_a_job(settings, silent_s=60)
    try:
        report = _reconcile(settings, app, reap=True)
        released = {r.worker: r for r in report.released_workers}
        assert released[node].jobs == [job_id] and released[node].messages == 1
        with session_factory(settings.resolved_database_url)() as session:
            job = session.get(Job, job_id)
            assert job is not None and job.lease_expires_at is not None
            assert job.lease_expires_at.replace(tzinfo=None) <= utcnow().replace(tzinfo=None), "claim still held"
            assert session.execute(select(WorkerProcess).where(WorkerProcess.name == node)).first() is None
        with redis.Redis.from_url(settings.broker_url) as r:
            assert not r.hexists("unacked", tag), "the message is still held as delivered"
            waiting = r.lrange(queue_for(job.variant), 0, -1)
            assert [job_ids_of_message(raw) for raw in waiting] == [[job_id]]
            assert not r.exists(held_key(node))
    finally:
        _cleanup(settings, conn)


def test_a_worker_that_reports_is_left_alone_and_so_is_everyone_after_an_outage(settings: Any) -> None:
    live, live_job, live_tag, app, conn = _dead_worker_holding_a_job(settings, silent_s=5)
    dead, _, dead_tag, _, conn2 = _dead_worker_holding_a_job(settings, silent_s=60)
    try:
        # A reconciler that could not reach the database a moment ago reaps nobody: after an outage
        # every status row is stale, and the live workers report again within seconds.
        assert _reconcile(settings, app, reap=False).released_workers == []
        with redis.Redis.from_url(settings.broker_url) as r:
            assert r.hexists("unacked", dead_tag)
        reaped = {r.worker for r in _reconcile(settings, app, reap=True).released_workers}
        assert dead in reaped and live not in reaped
        with redis.Redis.from_url(settings.broker_url) as r:
            assert r.hexists("unacked", live_tag) and not r.hexists("unacked", dead_tag)
        with session_factory(settings.resolved_database_url)() as session:
            assert session.get(WorkerProcess, live) is not None
            job = session.get(Job, live_job)
            assert job is not None and job.lease_expires_at is not None
            assert job.lease_expires_at.replace(tzinfo=None) > utcnow().replace(tzinfo=None)
    finally:
        _cleanup(settings, conn, conn2)
