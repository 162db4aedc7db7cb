"""Fair share between tenants (issue 38), on the real Postgres, Redis and moto with the shipped
defaults and the shipped model: tenant B's single job and small batch, sent while tenant A's big
batch fills the one worker's queue, are done within seconds instead of after A's backlog
(`jobs.fair_share`). And the policy's Postgres query, on the database itself."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from tests.pipeline.conftest import new_key, wait_for
from tests.pipeline.e2e_helpers import submit, write_batch
from tests.pipeline.test_chaos import DEFAULTS, counts
from yue2_jobs.client import Client
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import session_factory
from yue2_jobs.jobs import service
from yue2_jobs.jobs.fair_share import jobs_to_share, queued_tenants
from yue2_jobs.jobs.state import claim_jobs
from yue2_jobs.storage import LocalStorage

A_LINES = 3000  # minutes of the shipped model on one core: far longer than B may wait


def test_the_loose_index_scan_finds_each_waiting_tenant(settings: Any, tmp_path: Path) -> None:
    variant = f"v-{uuid.uuid4().hex[:8]}"  # a variant of its own: no other test's jobs are in its queue
    sessions = session_factory(settings.resolved_database_url)
    storage = LocalStorage(tmp_path)
    cfg = Settings(home=tmp_path, checkpoints={variant: "unused"}, default_variant=variant)
    with sessions() as session:
        made = {t: [service.create_job(session, tenant=t, body={"input": f"{t} {i}", "variant": variant},
                                       settings=cfg, storage=storage).id for i in range(n)]
                for t, n in (("big", 300), ("one", 1), ("two", 2))}
        try:
            assert queued_tenants(session, variant=variant) == ["big", "one", "two"]
            claim_jobs(session, job_ids=made["two"][:1], worker="elsewhere", lease_s=60, max_attempts=3)
            got = jobs_to_share(session, variant=variant, serving={"big"}, share=2, limit=8)
            assert sorted(got) == sorted([*made["one"], made["two"][1]])
        finally:
            session.execute(delete(Job).where(Job.variant == variant))
            session.commit()


def test_a_small_tenant_is_not_stuck_behind_a_big_batch(api: Any, client: Client, workers: Any, settings: Any,
                                                        eval_texts: list[str], tmp_path: Path) -> None:
    big = (eval_texts * (A_LINES // len(eval_texts) + 1))[:A_LINES]
    write_batch(tmp_path / "a.jsonl", big)
    small = Client(api.url, new_key(settings, f"small-{uuid.uuid4().hex[:8]}"))
    write_batch(tmp_path / "b.jsonl", eval_texts[:10], prefix="b")
    worker = workers(**DEFAULTS)  # the shipped model and batching, one worker
    batch_a = submit(client, tmp_path / "a.jsonl")
    wait_for(lambda: (counts(client, batch_a) or {"completed": 0})["completed"] >= 64, timeout=180,
             what="A's batch to be under way", interval=0.1)
    t0 = time.monotonic()
    job = small.submit_job({"input": eval_texts[-1]})
    batch_b = submit(small, tmp_path / "b.jsonl")
    done: dict[str, float] = {}  # when each of B's was first seen finished, seconds after it was sent

    def both_done() -> bool:
        if "job" not in done and small.job(job["id"])["status"] == "succeeded":
            done["job"] = time.monotonic() - t0
        if "batch" not in done and small.batch(batch_b)["status"] == "completed":
            done["batch"] = time.monotonic() - t0
        return len(done) == 2

    try:
        wait_for(both_done, timeout=120, what="B's job and batch", interval=0.1)
    except AssertionError:
        raise AssertionError(f"B still waits after 120 s ({done})\n{worker.tail()}") from None
    job_s, batch_s = done["job"], done["batch"]
    with session_factory(settings.resolved_database_url)() as session:
        a_queued = len(session.execute(select(Job.id).where(Job.batch_id == batch_a, Job.status == "queued")).all())
    client.cancel(batch_a)
    print(f"fair share, shipped model, one worker: tenant B's single job done {job_s:.1f} s and its 10-line batch "
          f"{batch_s:.1f} s after they were sent, while {a_queued} of A's {A_LINES} lines still waited "
          f"(target <= 10 s; > 240 s before)")
    assert a_queued >= 1000, "A's batch was nearly done: B did not have to jump it"
    assert job_s <= 10 and batch_s <= 10
    wait_for(lambda: client.batch(batch_a)["status"] == "cancelled", timeout=120, what="A's batch to be cancelled")
