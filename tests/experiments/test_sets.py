"""The A/B report per eval set, through the API on the embedded stack (SQLite, a local directory):
an experiment of the shipped `base` and `legal`, the shipped eval sets submitted as `yue2 ab
export-eval` writes them, and the workers' part played by writing each job's outcome into its row
(who ran it, when, what it wrote). No verdict is pooled over the two sets, each arm outside its
domain is warned about, a latency verdict from workers sharing one host's cores is withheld (and
given, with its interval, from workers on separate, equal CPUs), and each set shows five items
side by side."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.api.app import create_app
from yue2_jobs.auth import create_api_key
from yue2_jobs.core.config import Settings
from yue2_jobs.db.migrate import upgrade_head
from yue2_jobs.db.models import Job, JobStatus, WorkerPlacement
from yue2_jobs.db.session import session_factory, utcnow
from yue2_jobs.experiments.eval_sets import export_eval_sets
from yue2_jobs.experiments.examples import GONE
from yue2_jobs.experiments.text import format_report

ITEMS = 12  # per eval set


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, sessionmaker[Session]]]:
    settings = Settings(home=tmp_path / "home")
    upgrade_head(settings.resolved_database_url)
    sessions = session_factory(settings.resolved_database_url)
    with sessions() as session:
        key = create_api_key(session, tenant="acme")
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
        yield client, sessions


def run_experiment(api: tuple[TestClient, sessionmaker[Session]], tmp_path: Path, *,
                   workers: dict[str, str], domains: bool = True, cpus: dict[str, list[int]] | None = None) -> str:
    """A paired base-vs-legal experiment on both shipped eval sets, each job 'run' by `workers[variant]`:
    each variant writes the reference on its own domain's set and a wrong licence name on the other.
    `cpus`: each variant's worker recorded as running on these CPUs of one machine (else unrecorded)."""
    client, sessions = api
    exp = client.post("/v1/experiments", json={"name": "t", "mode": "paired",
                                               "variants": [{"variant": "base"}, {"variant": "legal"}]}).json()
    for s in export_eval_sets(tmp_path / "sets", items=ITEMS):
        f = client.post("/v1/files", data={"purpose": "batch"},
                        files={"file": (s.path.name, s.path.read_bytes(), "application/jsonl")}).json()
        metadata = s.metadata if domains else {"name": s.metadata["name"]}
        r = client.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/summarize",
                                             "metadata": metadata, "experiment_id": exp["id"]})
        assert r.status_code == 200, r.text
    now = utcnow()
    with sessions() as session:
        for i, job in enumerate(session.execute(select(Job).where(Job.experiment_id == exp["id"])).scalars()):
            own = (job.variant == "legal") == job.custom_id.startswith("legal")
            job.status, job.worker = JobStatus.SUCCEEDED, workers[job.variant]
            job.output_text = job.reference if own else "Apache License 2.0 (Apache-2.0), OSI approved"
            job.started_at, job.finished_at = now, now + timedelta(seconds=0.5 + (i % 7) / 10)
            job.output_tokens, job.checkpoint = 8, f"{job.variant}@v1"
        for variant, mine in (cpus or {}).items():
            session.add(WorkerPlacement(name=workers[variant], host="box", machine="boot-1", cpus=mine,
                                        cpu_count=len(mine), cpu_model="Xeon", device="cpu", recorded_at=now))
        session.commit()
    return str(exp["id"])


def test_each_eval_set_has_its_own_verdict_and_none_is_pooled(api: Any, tmp_path: Path) -> None:
    client, _ = api
    exp_id = run_experiment(api, tmp_path, workers={"base": "base-1@hostA", "legal": "legal-2@hostB"})
    report = client.get(f"/v1/experiments/{exp_id}/report").json()
    assert set(report["segments"]) == {"legal eval", "general eval"}  # no pooled `all`
    legal, general = report["segments"]["legal eval"], report["segments"]["general eval"]
    assert legal["domain"] == "legal" and general["domain"] == "general"
    on_legal = legal["differences"]["legal - base"]["rougeL"]
    on_general = general["differences"]["legal - base"]["rougeL"]
    assert on_legal["ci95"][0] > 0 and on_general["ci95"][1] < 0  # ahead on one, behind on the other
    for seg, way in ((legal, "better"), (general, "worse")):
        rouge_l = [v for v in seg["verdicts"] if "ROUGE-L" in v["text"]]
        assert [v["direction"] for v in rouge_l] == [way]
        d = seg["differences"]["legal - base"]["rougeL"]
        # the set's own interval and wins/ties/losses, not a pooled one
        assert f"{d['value']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]" in rouge_l[0]["text"]
        assert f"wins/ties/losses {d['wins']}/{d['ties']}/{d['losses']}" in rouge_l[0]["text"]
    text = format_report(report)
    header, *sections = re.split(r"^== ", text, flags=re.M)
    assert " vs " not in header and len(sections) == 2  # no headline above the sets
    assert sections[0].startswith("legal eval: domain legal, 12 items")  # in the order they were submitted
    assert "legal vs base: ROUGE-L" in sections[0] and "legal vs base: ROUGE-L" in sections[1]
    page = client.get(f"/v1/experiments/{exp_id}/report", params={"format": "html"}).text
    before, *boxes = page.split("<div class='set'>")  # a verdict box per set at the top, none above them
    assert len(boxes) == 2 and " vs " not in before
    assert [b.split("</h3>")[0] for b in boxes] == ["<h3>legal eval: domain legal, 12 items",
                                                   "<h3>general eval: domain general, 12 items"]
    for box, way in zip(boxes, ("better", "worse"), strict=True):
        assert f"<li class='{way}'>legal vs base: ROUGE-L" in box.split("</div>")[0]
    assert page.count("<h2>") == 3  # the verdicts, then each set's tables


def test_an_arm_outside_its_domain_is_warned_about(api: Any, tmp_path: Path) -> None:
    client, _ = api
    exp_id = run_experiment(api, tmp_path, workers={"base": "base-1@hostA", "legal": "legal-2@hostB"})
    exp = client.get(f"/v1/experiments/{exp_id}").json()
    # each arm's domain, as its shipped checkpoint's manifest declares it
    assert [(a["variant"], a["domain"]) for a in exp["variants"]] == [("base", "general"), ("legal", "legal")]
    report = client.get(f"/v1/experiments/{exp_id}/report").json()
    for name, outsider in (("legal eval", "base"), ("general eval", "legal")):
        warnings = report["segments"][name]["warnings"]
        assert [(w["kind"], w["variant"]) for w in warnings] == [("domain_mismatch", outsider)], warnings
    text = format_report(report)
    assert "WARNING: legal was trained for legal and is evaluated here on general eval, a general set" in text
    assert "WARNING: base was trained for general and is evaluated here on legal eval, a legal set" in text
    page = client.get(f"/v1/experiments/{exp_id}/report", params={"format": "html"}).text
    assert page.count("<li class='warn'>") == 2


def test_a_set_without_a_domain_says_it_could_not_check(api: Any, tmp_path: Path) -> None:
    client, _ = api
    exp_id = run_experiment(api, tmp_path, workers={"base": "base-1@hostA", "legal": "legal-2@hostB"},
                            domains=False)
    report = client.get(f"/v1/experiments/{exp_id}/report").json()
    for seg in report["segments"].values():
        assert seg["domain"] is None and [w["kind"] for w in seg["warnings"]] == ["domain_unchecked"]
    assert "WARNING" not in format_report(report) and "declares no domain" in format_report(report)


def test_no_latency_verdict_from_workers_sharing_a_host(api: Any, tmp_path: Path) -> None:
    client, _ = api
    exp_id = run_experiment(api, tmp_path, workers={"base": "base-cpu0@box", "legal": "legal-cpu0@box"},
                            cpus={"base": [0, 1], "legal": [0, 1]})
    report = client.get(f"/v1/experiments/{exp_id}/report").json()
    for seg in report["segments"].values():
        latency = seg["differences"]["legal - base"]["latency_s"]
        assert latency["value"] is not None and latency["comparable"] is False
        assert "same host, box, sharing its CPUs 0-1" in latency["not_comparable"]
        ways = {v["direction"] for v in seg["verdicts"] if "latency" in v["text"]}
        assert ways == {"incomparable"}  # said, and neither better nor worse
    text = format_report(report)
    assert "latency, mean (s) not comparable here: base (base-cpu0@box) and legal (legal-cpu0@box) ran on" in text
    assert not re.search(r"latency[^\n]*, (better|worse)", text)


def test_a_latency_verdict_from_workers_on_separate_equal_cpus(api: Any, tmp_path: Path) -> None:
    client, sessions = api
    exp_id = run_experiment(api, tmp_path, workers={"base": "base-cpu0@box", "legal": "legal-cpu1@box"},
                            cpus={"base": [0, 1], "legal": [2, 3]})
    with sessions() as session:  # legal a second slower on every item
        for job in session.execute(select(Job)).scalars():
            job.finished_at = job.started_at + timedelta(seconds=1.5 if job.variant == "legal" else 0.5)
        session.commit()
    report = client.get(f"/v1/experiments/{exp_id}/report").json()
    for seg in report["segments"].values():
        latency = seg["differences"]["legal - base"]["latency_s"]
        assert latency["comparable"] is True and latency["not_comparable"] is None
        assert latency["value"] == pytest.approx(1.0) and latency["ci95"] == pytest.approx([1.0, 1.0])
        verdict = [v for v in seg["verdicts"] if "latency" in v["text"]]
        assert [v["direction"] for v in verdict] == ["worse"]
        assert verdict[0]["text"].startswith("legal vs base: latency, mean (s) +1.000 [+1.000, +1.000]")
    text = format_report(report)
    assert "not comparable" not in text and text.count("latency, mean (s) +1.000") == 2


def test_latency_of_workers_without_a_recorded_placement_is_not_compared(api: Any, tmp_path: Path) -> None:
    client, _ = api
    exp_id = run_experiment(api, tmp_path, workers={"base": "base-1@hostA", "legal": "legal-2@hostB"})
    latency = client.get(f"/v1/experiments/{exp_id}/report").json()["segments"]["legal eval"]["differences"][
        "legal - base"]["latency_s"]
    assert latency["comparable"] is False and "base-1@hostA of base has no recorded placement" in latency[
        "not_comparable"]


def test_five_items_of_each_set_side_by_side(api: Any, tmp_path: Path) -> None:
    client, _ = api
    exp_id = run_experiment(api, tmp_path, workers={"base": "base-1@hostA", "legal": "legal-2@hostB"})
    report = client.get(f"/v1/experiments/{exp_id}/report").json()
    for name, seg in report["segments"].items():
        shown = seg["examples"]
        corpus = name.split()[0]
        # spread over the set in custom_id order (the first and the last included), not by score
        assert [e["custom_id"] for e in shown] == [f"{corpus}-{i}" for i in (0, 3, 6, 8, 11)]
        for e in shown:
            assert e["input"] and e["reference"] and set(e["outputs"]) == {"base", "legal"}
            own = "legal" if corpus == "legal" else "base"
            assert e["outputs"][own] == e["reference"]
    text = format_report(report)
    assert text.count("Examples (5, spread evenly") == 2 and text.count("    reference:") == 10
    page = client.get(f"/v1/experiments/{exp_id}/report", params={"format": "html"}).text
    assert page.count("<table class='ex'>") == 2


def test_an_example_whose_output_is_no_longer_stored_says_so(api: Any, tmp_path: Path) -> None:
    client, sessions = api
    exp_id = run_experiment(api, tmp_path, workers={"base": "base-1@hostA", "legal": "legal-2@hostB"})
    with sessions() as session:  # its output was stored, not inline, and the object is gone
        job = session.execute(select(Job).where(Job.experiment_id == exp_id, Job.custom_id == "legal-0",
                                                Job.variant == "legal")).scalar_one()
        # (without a reference: ROUGE, which reads every scored output, is not what this tests)
        job.output_text, job.output_key, job.reference = None, "outputs/gone.json", None
        session.commit()
    report = client.get(f"/v1/experiments/{exp_id}/report").json()
    first = report["segments"]["legal eval"]["examples"][0]
    assert first["custom_id"] == "legal-0" and first["outputs"]["legal"] == GONE
    assert first["outputs"]["base"] == "Apache License 2.0 (Apache-2.0), OSI approved"
