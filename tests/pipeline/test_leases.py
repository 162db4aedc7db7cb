"""Lease renewal on the real Postgres (the SQLite state tests are tests/jobs/test_state.py): a row
another transaction holds is skipped by the heartbeat, not waited for."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select, text

from tests.pipeline.conftest import temporary_pg_database
from yue2_jobs.core.config import Settings
from yue2_jobs.db.migrate import upgrade_head
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import session_factory
from yue2_jobs.jobs import service
from yue2_jobs.jobs.state import claim_jobs, renew_leases
from yue2_jobs.storage import LocalStorage


def test_heartbeat_renews_leases_and_skips_rows_being_finished_on_postgres(tmp_path: Path) -> None:
    """On the real Postgres: a row another transaction holds (the recorder finishing it) is skipped,
    not waited for, so the heartbeat and the recorder cannot deadlock."""
    with temporary_pg_database("yue2_state") as url:
        upgrade_head(url)
        sessions = session_factory(url)
        settings = Settings(home=tmp_path)
        storage = LocalStorage(tmp_path / "storage")
        with sessions() as s:
            ids = [service.create_job(s, tenant="t", body={"input": f"t{i}"}, settings=settings, storage=storage).id
                   for i in range(3)]
            rows, _ = claim_jobs(s, job_ids=ids, worker="w", lease_s=5, max_attempts=3)
            claims = {r.id: r.claim_token for r in rows}
        recorder = sessions()
        recorder.execute(select(Job).where(Job.id == ids[1]).with_for_update())  # holds row 1's lock
        heartbeat = sessions()
        heartbeat.execute(text("SET lock_timeout = '5s'"))  # a wait would fail the test, not hang it
        assert renew_leases(heartbeat, claims=claims, lease_s=600) == 2
        recorder.rollback()
        with sessions() as s:
            leases = dict(s.execute(select(Job.id, Job.lease_expires_at).where(Job.id.in_(ids))).all())
        assert leases[ids[0]] > leases[ids[1]] and leases[ids[2]] > leases[ids[1]]
        recorder.close()
        heartbeat.close()
