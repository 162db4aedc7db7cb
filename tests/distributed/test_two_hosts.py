"""Two hosts, one pipeline: the distributed path across machines, not only on one host.

One 2,000-line batch (a third of it for `legal`) runs across host-a (base and legal workers) and
host-b (a base worker), with the API, the watchdog and the services on hosts of their own. While
it runs:

- a node name another host uses is refused (hosts need unique names; a pid means nothing elsewhere);
- an API key revoked on the API's host is refused by the API process on host-a within 1 s;
- a new `base` version is published: the watchdog swaps the base workers on both hosts, same pids,
  while a second watchdog on host-a stands by;
- host-b, which holds the reconciler's lock, is cut off: host-a's worker takes the lock over; the
  link comes back and host-b does not take it back;
- host-b's processes are SIGKILLed and its link cut: host-a finishes the batch.

Then every custom_id is once in the output file, every job succeeded once, both hosts ran some,
and the jobs record the version that decoded them. The figures are printed.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, text

from tests.checkpoints.garbage import retrained_drafter
from tests.distributed.conftest import Cluster, since, wait_until
from tests.distributed.services import BUCKET
from yue2_jobs.checkpoints.watchdog import watchdog_holder
from yue2_jobs.client import Client
from yue2_jobs.core.paths import DATA
from yue2_jobs.db.models import ApiKey, Job, JobStatus, WorkerProcess
from yue2_jobs.db.session import as_utc, session_factory, utcnow
from yue2_jobs.jobs.capacity import LIVE_WITHIN_S
from yue2_jobs.jobs.reconciler import holder
from yue2_jobs.model.checkpoint import verify_checkpoint_dir

pytestmark = pytest.mark.slow
LINES = 4000  # long enough that the swap, the failover and the dead host all land mid-batch (the decoder got faster)
A_BASE, A_LEGAL, B_BASE = "base-cpu0@host-a", "legal-cpu0@host-a", "base-cpu0@host-b"


def _live(sessions: Any) -> dict[str, WorkerProcess]:
    since_t = utcnow().timestamp() - LIVE_WITHIN_S
    with sessions() as session:
        rows = session.execute(select(WorkerProcess)).scalars().all()
    return {w.name: w for w in rows if w.heartbeat_at.timestamp() >= since_t}


def _asks(sessions: Any, node: str) -> set[Any]:
    """When `node`'s reconciler last asked for the lock (its connection's last query), if that is
    what it last did."""
    with sessions() as session:
        return set(session.execute(text(
            "SELECT query_start FROM pg_stat_activity WHERE application_name = :name "
            "AND query LIKE 'SELECT pg_try_advisory_lock%'"), {"name": f"yue2-reconciler {node}"}).scalars())


def _when(value: Any, test: Any) -> Any:
    """`value` if it passes `test`, else None (for `wait_until`)."""
    return value if test(value) else None


def _holder(sessions: Any) -> str | None:
    with sessions() as session:
        return holder(session)


def _watchdog(sessions: Any) -> str | None:
    with sessions() as session:
        return watchdog_holder(session)


def _by_worker(sessions: Any, batch_id: str, status: str = JobStatus.SUCCEEDED) -> dict[str, int]:
    with sessions() as session:
        return dict(session.execute(select(Job.worker, func.count()).where(
            Job.batch_id == batch_id, Job.status == status).group_by(Job.worker)).all())


def _stored_outputs(cluster: Cluster, batch_id: str) -> set[str]:
    """The job output objects of the batch on S3, by name (a job writes its own key: never two)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=cluster.services.s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"out/t-dist/{batch_id}/job_")
    return {obj["Key"].rsplit("/", 1)[1] for page in pages for obj in page.get("Contents", [])}


def _worker_argv(variant: str) -> list[str]:
    return ["-m", "workers", "--variant", variant, "--procs", "1"]


def _write_batch(path: Path) -> dict[str, str]:
    from yue2_jobs.training.data import read_split

    texts = [r["text"][:800] for r in read_split(DATA, "general", "eval")]
    variants = {}
    with path.open("w") as f:
        for i in range(LINES):
            variant = "legal" if i % 3 == 2 else "base"
            variants[f"d{i}"] = variant
            body = {"input": texts[i % len(texts)], "max_new_tokens": 24, "variant": variant}
            f.write(json.dumps({"custom_id": f"d{i}", "method": "POST", "url": "/v1/summarize", "body": body}) + "\n")
    return variants


def _start_hosts(cluster: Cluster, sessions: Any) -> dict[str, int]:
    """Host-b's worker first, so it holds the reconciler's lock; then the rest. Returns the pids."""
    cluster.start("host-b", "base", _worker_argv("base"))
    cluster.start_api("api")
    cluster.start("api", "watchdog", ["-m", "yue2_jobs", "watchdog"])
    assert wait_until(lambda: _holder(sessions), timeout=180, what="a worker to take the reconciler's lock",
                      cluster=cluster) == B_BASE
    assert wait_until(lambda: _watchdog(sessions), timeout=60, what="the watchdog to take its lock",
                      cluster=cluster).endswith("@api")
    cluster.start("host-a", "base", _worker_argv("base"))
    cluster.start("host-a", "legal", _worker_argv("legal"))
    cluster.start_api("host-a")
    cluster.start("host-a", "watchdog", ["-m", "yue2_jobs", "watchdog"])  # a second one, standing by
    live = wait_until(lambda: _when(_live(sessions), lambda w: len(w) == 3), timeout=180,
                      what="three workers reporting", cluster=cluster)
    assert set(live) == {A_BASE, A_LEGAL, B_BASE}
    assert len({w.pid_space for w in live.values()}) == 3  # a process table per host (per launcher here)
    for host in ("api", "host-a"):
        wait_until(lambda h=host: _answers(f"{cluster.api_url(h)}/healthz"), timeout=60,
                   what=f"the API on {host}", cluster=cluster)
    return {name: w.pid for name, w in live.items()}


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _namesake_is_refused(cluster: Cluster) -> None:
    """A host whose hostname is host-a's (a cloned image) cannot take host-a's live node name."""
    out = cluster.hosts["host-b"].run([sys.executable, "-m", "workers", "--child", "--variant", "base",
                                       "--name", A_BASE], env=cluster.env("host-b"), hostname="host-a", timeout=120)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "in use by a worker on another host" in out.stderr, out.stderr[-2000:]


def _revocation_reaches_the_other_api(cluster: Cluster, sessions: Any) -> float:
    """Seconds from the revocation's commit on the API's host (`revoked_at`; every namespace reads
    one kernel clock) to the first refusal by host-a's API, which is polled all along."""
    from yue2_jobs.auth import create_api_key

    with sessions() as session:
        secret = create_api_key(session, tenant="t-revoked")
        key_id = session.execute(select(ApiKey.id).where(ApiKey.tenant == "t-revoked")).scalar_one()
    headers = {"Authorization": f"Bearer {secret}"}
    urls = [f"{cluster.api_url(h)}/v1/batches" for h in ("api", "host-a")]
    assert [httpx.get(u, headers=headers, timeout=10).status_code for u in urls] == [200, 200]  # both cache it
    refused_at: list[float] = []

    def poll() -> None:
        with httpx.Client(timeout=2) as http:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if http.get(urls[1], headers=headers).status_code == 401:
                    refused_at.append(time.time())
                    return
                time.sleep(0.005)

    poller = threading.Thread(target=poll)
    poller.start()
    out = cluster.hosts["api"].run([sys.executable, "-m", "yue2_jobs", "apikey", "revoke", key_id],
                                   env=cluster.env("api"))
    poller.join()
    assert out.returncode == 0 and "2 API process(es) told" in out.stdout, out.stdout + out.stderr
    assert refused_at, "host-a's API never refused the revoked key"
    assert httpx.get(urls[0], headers=headers, timeout=10).status_code == 401
    with sessions() as session:
        revoked_at = session.execute(select(ApiKey.revoked_at).where(ApiKey.id == key_id)).scalar_one()
    return refused_at[0] - as_utc(revoked_at).timestamp()


def _publish_and_converge(cluster: Cluster, sessions: Any, pids: dict[str, int],
                          tmp_path: Path) -> tuple[str, float, datetime]:
    """A new base version (base with a retrained drafter, which validation passes) while both hosts
    decode; both base workers serve it without a restart. Returns its checkpoint name, seconds, and when."""
    retrained = retrained_drafter(tmp_path / "retrained-base")
    out = cluster.hosts["api"].run([sys.executable, "-m", "yue2_jobs", "checkpoints", "publish",
                                    str(retrained), "--variant", "base"], env=cluster.env("api"))
    t0 = time.monotonic()
    published = [line for line in out.stdout.splitlines() if line.startswith("published base@")]
    assert out.returncode == 0 and published, out.stdout + out.stderr
    want = published[0].split()[1]
    live = wait_until(lambda: _when(_live(sessions), lambda w: all(n in w and w[n].checkpoint == want
                                                                   for n in (A_BASE, B_BASE))),
                      timeout=180, what=f"both base workers to serve {want}", cluster=cluster)
    assert {n: live[n].pid for n in (A_BASE, B_BASE)} == {n: pids[n] for n in (A_BASE, B_BASE)}  # no restart

    def both_recorded_new() -> bool:  # both hosts go on decoding, now with the new weights
        with sessions() as session:
            return set(session.execute(select(Job.worker).where(Job.checkpoint == want,
                                                                Job.status == JobStatus.SUCCEEDED)).scalars()) \
                >= {A_BASE, B_BASE}

    wait_until(both_recorded_new, timeout=120, what=f"both hosts to record jobs decoded by {want}", cluster=cluster)
    assert (_watchdog(sessions) or "").endswith("@api")  # host-a's watchdog stood by: one pass at a time
    assert "standing by: the watchdog" in (cluster.logs / "host-a-watchdog.log").read_text()
    assert "swapped" not in (cluster.logs / "host-a-watchdog.log").read_text()
    return want, since(t0), utcnow()


def _reconciler_fails_over(cluster: Cluster, sessions: Any) -> float:
    b = cluster.hosts["host-b"]
    assert _holder(sessions) == B_BASE
    t0 = time.monotonic()
    b.cut()
    new = wait_until(lambda: _when(_holder(sessions), lambda h: h and h.endswith("@host-a")), timeout=60,
                     what="a host-a worker to take the reconciler's lock over", cluster=cluster)
    failover = since(t0)
    b.reconnect()
    t_back = utcnow()
    wait_until(lambda: (w := _live(sessions).get(B_BASE)) is not None and w.heartbeat_at > t_back, timeout=60,
               what="host-b's worker to report again", cluster=cluster)
    # Host-b's reconciler connects again and asks for the lock on every pass (0.5 s): once it has
    # asked twice (pg_stat_activity shows each ask's start), the holder is still host-a's.
    asks: set[Any] = set()

    def asked_twice() -> bool:
        asks.update(_asks(sessions, B_BASE))
        return len(asks) >= 2

    wait_until(asked_twice, timeout=60, what="host-b's reconciler to ask for the lock again", cluster=cluster)
    assert _holder(sessions) == new
    return failover


def _kill_and_cut_host_b(cluster: Cluster, sessions: Any, batch_id: str) -> dict[str, float]:
    """SIGKILL host-b's worker process while it holds claimed jobs and cut host-b's link at once
    (its launcher lives on, cut off, restarting the worker). Returns the jobs it held, the jobs it
    had finished, the batch's unfinished jobs then, and the seconds until the first of its jobs was
    claimed again on host-a (the queue moves) and until all of them had run there."""
    b = cluster.hosts["host-b"]

    def claimed_by_b() -> set[str]:
        with sessions() as session:
            return set(session.execute(select(Job.id).where(Job.batch_id == batch_id, Job.worker == B_BASE,
                                                            Job.status == JobStatus.RUNNING)).scalars())

    wait_until(claimed_by_b, timeout=60, what="host-b to hold claimed jobs", cluster=cluster, interval=0.05)
    t0 = time.monotonic()
    children = b.kill(b"--child")
    b.cut()  # right after the kill: what the dying process had in flight may never leave
    assert children, "no worker process on host-b to kill"
    b.wait_gone(children)
    held = claimed_by_b()  # what it held when it died (it can finish nothing more)
    finished = _by_worker(sessions, batch_id).get(B_BASE, 0)
    unfinished = LINES - sum(_by_worker(sessions, batch_id).values())
    assert held and unfinished >= 50, f"host-b held {len(held)} jobs, {unfinished} unfinished: make the batch longer"

    def rerun(*, all_done: bool) -> bool:
        with sessions() as session:
            rows = session.execute(select(Job.status, Job.worker).where(Job.id.in_(held))).all()
        if not all_done:
            return any(w != B_BASE for _, w in rows)
        return all(s == JobStatus.SUCCEEDED and w != B_BASE for s, w in rows)

    wait_until(lambda: rerun(all_done=False), timeout=120, what="a job host-b held to be claimed on host-a",
               cluster=cluster, interval=0.05)
    moved = since(t0)
    wait_until(lambda: rerun(all_done=True), timeout=120, what="host-b's claimed jobs to run on host-a",
               cluster=cluster)
    return {"held": len(held), "finished": finished, "unfinished": unfinished, "moved_s": moved,
            "done_s": since(t0)}


def test_two_hosts_run_one_batch_through_a_swap_a_failover_and_a_dead_host(
        cluster: Cluster, tmp_path: Path, record_property: Any) -> None:
    sessions = session_factory(cluster.database_url)
    t_start = time.monotonic()
    pids = _start_hosts(cluster, sessions)
    t_up = since(t_start)
    for host in cluster.hosts.values():  # every server binds its host's veth address, none all addresses
        assert not {a for a in host.listening() if a.rsplit(":", 1)[0] in ("0.0.0.0", "*", "[::]")}, host.name
    _namesake_is_refused(cluster)
    revoke_s = _revocation_reaches_the_other_api(cluster, sessions)

    from yue2_jobs.auth import create_api_key

    with sessions() as session:
        client = Client(cluster.api_url("api"), create_api_key(session, tenant="t-dist"))
    variants = _write_batch(tmp_path / "in.jsonl")
    batch_id = client.create_batch(client.upload(tmp_path / "in.jsonl")["id"])["id"]
    wait_until(lambda: all(_by_worker(sessions, batch_id).get(n, 0) >= 20 for n in (A_BASE, B_BASE)),
               timeout=180, what="both hosts' base workers to finish some jobs", cluster=cluster)
    seed = {_live(sessions)[n].checkpoint for n in (A_BASE, B_BASE)}
    new_version, converge_s, t_converged = _publish_and_converge(cluster, sessions, pids, tmp_path)
    assert client.batch(batch_id)["status"] == "in_progress", "the batch ended before the swap: make it longer"
    failover_s = _reconciler_fails_over(cluster, sessions)
    b_done = _by_worker(sessions, batch_id).get(B_BASE, 0)
    killed = _kill_and_cut_host_b(cluster, sessions, batch_id)

    state = wait_until(lambda: _when(client.batch(batch_id), lambda s: s["status"] in ("completed", "failed")),
                       timeout=600, what="the batch to finish on host-a", cluster=cluster, interval=0.5)
    assert state["status"] == "completed" and state["request_counts"] == {"total": LINES, "completed": LINES,
                                                                          "failed": 0}, state
    lines = [json.loads(ln) for ln in client.file_content(state["output_file_id"]).decode().splitlines()]
    ids = [ln["custom_id"] for ln in lines]
    assert len(ids) == LINES and set(ids) == set(variants), "a custom_id is missing or twice in the output"
    assert all(ln["error"] is None and ln["response"]["status_code"] == 200 for ln in lines)

    with sessions() as session:
        jobs = session.execute(select(Job).where(Job.batch_id == batch_id)).scalars().all()
    assert len(jobs) == LINES and {j.status for j in jobs} == {JobStatus.SUCCEEDED}
    assert _stored_outputs(cluster, batch_id) == {f"job_{j.id.removeprefix('job_')}.json" for j in jobs}
    per_node = _by_worker(sessions, batch_id)
    assert per_node.get(A_BASE, 0) > 0 and per_node.get(B_BASE, 0) > 0 and per_node.get(A_LEGAL, 0) > 0, per_node
    # What host-b recorded before it died stays, and its restarted worker, cut off, recorded nothing.
    assert per_node[B_BASE] == killed["finished"] >= b_done > 0
    for job in jobs:
        assert job.variant == variants[job.custom_id or ""]
        assert job.worker in ({A_LEGAL} if job.variant == "legal" else {A_BASE, B_BASE})
    base_jobs = [j for j in jobs if j.variant == "base"]
    assert {j.checkpoint for j in base_jobs} == {*seed, new_version}  # the batch straddles the swap
    assert all(j.checkpoint == new_version for j in base_jobs if j.started_at and j.started_at > t_converged)
    # Both hosts decoded with the new weights (the retrained base's), not only named them.
    new_sha = {verify_checkpoint_dir(tmp_path / "retrained-base")["model.safetensors"]["sha256"]}
    for node in (A_BASE, B_BASE):
        on_new = {j.weights_sha256 for j in base_jobs if j.worker == node and j.checkpoint == new_version}
        assert on_new == new_sha, (node, on_new)
    assert not new_sha & {j.weights_sha256 for j in base_jobs if j.checkpoint != new_version}  # old ones before

    reruns = sum(1 for j in jobs if j.attempts > 1)
    figures = "\n".join([
        f"two hosts: up in {t_up:.1f}s; jobs per node {dict(sorted(per_node.items()))}; {reruns} jobs ran twice",
        f"API key revoked on host api, refused by the API on host-a {revoke_s:.3f}s after its commit",
        f"publish -> the base workers of both hosts serving {new_version}: {converge_s:.1f}s (same pids)",
        f"host-b cut off -> reconciler on {_holder(sessions)} after {failover_s:.1f}s",
        f"host-b's worker SIGKILLed and its link cut with {killed['held']:.0f} jobs claimed and "
        f"{killed['unfinished']:.0f} of the batch unfinished -> the first claimed again on host-a after "
        f"{killed['moved_s']:.1f}s, all done after {killed['done_s']:.1f}s (YUE2_LEASE_S=6); batch done "
        f"{since(t_start):.0f}s after the start"])
    print("\n" + figures)
    record_property("figures", figures)  # shown in make test's summary (tests/conftest.py)
