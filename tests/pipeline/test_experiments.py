"""A/B experiments end to end: real workers for `base` and `legal`, Postgres, Redis and moto S3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.pipeline.conftest import ROOT, new_key
from tests.pipeline.test_e2e import batch_jobs, wait_batch
from yue2_jobs.client import ApiError, Client
from yue2_jobs.db.models import JobStatus, WorkerPlacement
from yue2_jobs.db.session import session_factory
from yue2_jobs.jobs.assignment import split_variant
from yue2_jobs.training.data import read_split

N = 30  # items per eval set


def eval_batch(path: Path, corpus: str, n: int = N) -> Path:
    rows = read_split(ROOT / "data", corpus, "eval")[:n]
    path.write_text("".join(json.dumps({"custom_id": f"{corpus}-{i}", "method": "POST", "url": "/v1/summarize",
                                        "body": {"input": r["text"]}, "reference": r["summary"]}) + "\n"
                            for i, r in enumerate(rows)))
    return path


def test_paired_base_vs_legal_report_shows_legal_ahead_on_legal_text(
        client: Client, workers: Any, settings: Any, tmp_path: Path) -> None:
    base, legal = workers(), workers(YUE2_DEFAULT_VARIANT="legal")
    exp = client.create_experiment(name="base vs legal", mode="paired",
                                   variants=[{"variant": "base"}, {"variant": "legal"}])
    assert exp["control"] == "base" and exp["mode"] == "paired"
    batch_ids = {}
    for corpus in ("legal", "general"):
        f = client.upload(eval_batch(tmp_path / f"{corpus}.jsonl", corpus))
        b = client.create_batch(f["id"], metadata={"name": f"{corpus} eval", "domain": corpus},
                                experiment_id=exp["id"])
        assert b["experiment_id"] == exp["id"] and b["request_counts"]["total"] == 2 * N  # each line on both
        batch_ids[corpus] = b["id"]
    for b in batch_ids.values():
        state = wait_batch(client, b, timeout=600, worker=legal)
        assert state["request_counts"] == {"total": 2 * N, "completed": 2 * N, "failed": 0}, base.tail()
    jobs = batch_jobs(settings, batch_ids["legal"])
    assert {(j.variant, j.checkpoint.split("@")[0]) for j in jobs} == {("base", "base"), ("legal", "legal")}

    report = client.experiment_report(exp["id"])
    # one segment per eval set, none pooled over both
    assert report["finished_jobs"] == 4 * N and set(report["segments"]) == {"legal eval", "general eval"}
    on_legal = report["segments"]["legal eval"]
    assert on_legal["variants"]["legal"]["rougeL"]["n"] == N
    gain = on_legal["differences"]["legal - base"]["rougeL"]
    assert gain["paired"] and gain["n"] == N and gain["value"] > 10 and gain["ci95"][0] > 0, gain
    assert gain["excludes_zero"]
    on_general = report["segments"]["general eval"]["differences"]["legal - base"]["rougeL"]
    assert on_general["value"] < 0 and on_general["ci95"][1] < 0, on_general  # legal forgot the general domain
    assert [w["variant"] for w in report["segments"]["general eval"]["warnings"]] == ["legal"]  # outside its domain
    latency = on_legal["differences"]["legal - base"]["latency_s"]
    assert latency["comparable"] is False and "same host" in latency["not_comparable"]  # one machine, unpinned
    with session_factory(settings.resolved_database_url)() as session:  # each worker recorded where it ran
        placed = {p.name: p for p in session.execute(select(WorkerPlacement)).scalars()}
    assert {j.worker for j in jobs} <= set(placed) and {placed[j.worker].device for j in jobs} == {"cpu"}
    for v in ("base", "legal"):
        m = on_legal["variants"][v]
        assert m["success_rate"]["value"] == 1.0 and m["latency_p50_s"]["value"] > 0
        assert m["latency_p50_s"]["value"] <= m["latency_p95_s"]["value"] and m["tokens_per_s"]["value"] > 0
        acceptance = m["nar_acceptance"]  # n/a for a variant whose jobs `auto` ran as `ar` (no drafting)
        assert (acceptance["value"] is None and acceptance["na"]) or 0 <= acceptance["value"] <= 1
        assert m["output_tokens"]["value"] > 0
    page = client.experiment_report_html(exp["id"])
    assert page.startswith("<!doctype html>") and page.count("<img") == 4  # 2 plots x 2 eval sets

    # The output file holds each custom_id once per variant.
    lines = [json.loads(ln) for ln in client.file_content(client.batch(batch_ids["legal"])["output_file_id"])
             .decode().splitlines()]
    assert sorted((ln["custom_id"], ln["response"]["body"]["variant"]) for ln in lines) == sorted(
        (f"legal-{i}", v) for i in range(N) for v in ("base", "legal"))


def test_split_assigns_by_hash_and_rejects_what_it_cannot_run(
        client: Client, workers: Any, settings: Any, api: Any, tmp_path: Path) -> None:
    workers(), workers(YUE2_DEFAULT_VARIANT="legal")
    exp = client.create_experiment(mode="split", variants=[{"variant": "base", "weight": 1},
                                                           {"variant": "legal", "weight": 1}])
    path = eval_batch(tmp_path / "in.jsonl", "legal", 40)
    with path.open("a") as f:  # a line may not pick its variant under an experiment: it alone fails
        f.write(json.dumps({"custom_id": "pinned", "body": {"input": "x y z", "variant": "legal"}}) + "\n")
    b = client.create_batch(client.upload(path)["id"], experiment_id=exp["id"])
    state = wait_batch(client, b["id"], timeout=600)
    assert state["request_counts"] == {"total": 41, "completed": 40, "failed": 1}
    jobs = {j.custom_id: j for j in batch_jobs(settings, b["id"])}
    assert jobs["pinned"].status == JobStatus.FAILED and "experiment assigns" in jobs["pinned"].error["message"]
    stub = type("E", (), {"id": exp["id"], "arms": {"variants": exp["variants"]}})
    for cid, job in jobs.items():
        if cid != "pinned":
            assert job.variant == split_variant(stub, cid) and job.checkpoint.startswith(job.variant + "@")
    assert 5 < sum(j.variant == "legal" for j in jobs.values()) < 35
    report = client.experiment_report(exp["id"])
    (only,) = report["segments"].values()  # one batch, one eval set
    gain = only["differences"]["legal - base"]["rougeL"]
    assert not gain["paired"] and gain["ci95"][0] > 0, gain  # legal text: legal ahead, unpaired interval

    # Every limit is named; other tenants see nothing.
    for body, field in (({"variants": [{"variant": "base"}]}, "variants"),
                        ({"variants": [{"variant": "base"}, {"variant": "nope"}]}, "variants[1].variant"),
                        ({"variants": [{"variant": "base"}, {"variant": "base"}]}, "variants"),
                        ({"mode": "both", "variants": [{"variant": "base"}, {"variant": "legal"}]}, "mode"),
                        ({"variants": [{"variant": "base", "weight": 0}, {"variant": "legal"}]}, "variants")):
        with pytest.raises(ApiError) as err:
            client._json(client.http.post("/v1/experiments", json=body))
        assert err.value.status in (400, 409, 422) and field in str(err.value.param), (body, err.value)
    other = Client(api.url, new_key(settings, "someone-else"))
    for call in (lambda: other.experiment_report(exp["id"]),
                 lambda: other.create_batch(other.upload(path)["id"], experiment_id=exp["id"])):
        with pytest.raises(ApiError) as err:
            call()
        assert err.value.status == 404
