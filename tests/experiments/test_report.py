"""Assignment and statistics of A/B experiments, on synthetic records (no services)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np

from yue2_jobs.experiments.html import render_html
from yue2_jobs.experiments.metrics import DIFFERENCES, direction
from yue2_jobs.experiments.report import JobRecord, bootstrap_ci, difference, segment_report
from yue2_jobs.experiments.text import format_report
from yue2_jobs.jobs.assignment import split_variant, variants_for


def exp(mode: str, weights: dict[str, float], exp_id: str = "exp_1") -> SimpleNamespace:
    return SimpleNamespace(id=exp_id, mode=mode,
                           arms={"variants": [{"variant": v, "weight": w} for v, w in weights.items()]})


def test_split_assignment_is_deterministic_and_follows_the_weights() -> None:
    e = exp("split", {"base": 1.0, "legal": 3.0})
    ids = [f"req-{i}" for i in range(20000)]
    first = [split_variant(e, i) for i in ids]
    assert first == [split_variant(e, i) for i in ids]  # same id, same variant
    share = Counter(first)["legal"] / len(ids)
    assert 0.74 < share < 0.76, share
    other = [split_variant(exp("split", {"base": 1.0, "legal": 3.0}, "exp_2"), i) for i in ids]
    assert other != first  # each experiment draws its own assignment
    assert variants_for(exp("paired", {"base": 1.0, "legal": 1.0}), "x") == ["base", "legal"]


def records(variant: str, scores: list[float], *, latency: float = 1.0, failed: int = 0,
            drafted: bool = True) -> list[JobRecord]:
    out = [JobRecord(batch_id="b", custom_id=f"c{i}", variant=variant, checkpoint=f"{variant}@v1", succeeded=True,
                     latency_s=latency, output_tokens=10, nar_tokens=5 if drafted else 0,
                     scores={"rouge1": s, "rouge2": s / 2, "rougeL": s}, drafted=drafted)
           for i, s in enumerate(scores)]
    out += [JobRecord(batch_id="b", custom_id=f"f{i}", variant=variant, checkpoint=None, succeeded=False,
                      latency_s=None, output_tokens=0, nar_tokens=0) for i in range(failed)]
    return out


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_n() -> None:
    rng = np.random.default_rng(0)
    small = rng.normal(10, 2, 30)
    big = rng.normal(10, 2, 3000)
    lo_s, hi_s = bootstrap_ci(np.mean, small, rng=rng)
    lo_b, hi_b = bootstrap_ci(np.mean, big, rng=rng)
    assert lo_s < small.mean() < hi_s and lo_b < 10 < hi_b
    assert (hi_b - lo_b) < (hi_s - lo_s) / 5  # about 1/sqrt(100)
    assert bootstrap_ci(np.mean, np.array([1.0]), rng=rng) is None  # one value: no interval


def test_paired_difference_sees_a_small_consistent_gain_an_unpaired_one_would_not() -> None:
    rng = np.random.default_rng(1)
    base_scores = rng.uniform(0, 100, 60)  # items differ a lot...
    control = records("base", list(base_scores))
    treatment = records("legal", list(base_scores + 2.0 + rng.normal(0, 0.5, 60)))  # ...the gain is steady
    paired = difference(control, treatment, metric="rougeL", paired=True, rng=np.random.default_rng(2))
    unpaired = difference(control, treatment, metric="rougeL", paired=False, rng=np.random.default_rng(2))
    assert abs(paired["value"] - 2.0) < 0.5 and paired["excludes_zero"] and paired["wins"] >= 55
    assert abs(unpaired["value"] - paired["value"]) < 1e-9 and not unpaired["excludes_zero"]
    same = difference(control, records("legal", list(base_scores)), metric="rougeL", paired=True,
                      rng=np.random.default_rng(3))
    assert same["value"] == 0 and same["ci95"] == [0.0, 0.0] and not same["excludes_zero"]


def test_segment_report_counts_failures_and_renders_html() -> None:
    recs = records("base", [10.0, 20.0, 30.0], latency=2.0, failed=1) + records("legal", [40.0, 50.0, 60.0])
    seg = segment_report(recs, ["base", "legal"], paired=True)
    base, legal = seg["variants"]["base"], seg["variants"]["legal"]
    assert (base["jobs"], base["succeeded"], base["failed"]) == (4, 3, 1)
    assert base["success_rate"]["value"] == 0.75 and legal["success_rate"]["value"] == 1.0
    assert base["rougeL"]["value"] == 20.0 and legal["rougeL"]["value"] == 50.0
    assert base["tokens_per_s"]["value"] == 5.0 and legal["tokens_per_s"]["value"] == 10.0
    assert base["nar_acceptance"]["value"] == 0.5 and base["checkpoints"] == {"base@v1": 3}
    diff = seg["differences"]["legal - base"]["rougeL"]
    assert diff["value"] == 30.0 and diff["n"] == 3  # the failed item has no pair
    report = {"experiment_id": "exp_1", "name": "t", "mode": "paired", "control": "base", "finished_jobs": 7,
              "bootstrap": 2000, "segments": {"all": seg}}
    page = render_html(report)
    assert page.count("<img") == 2 and "legal - base" in page and "ROUGE-L" in page


def test_the_report_reads_each_difference_by_its_metric_sense() -> None:
    """Better ROUGE is better and a longer latency worse (each in its colour); a difference with no
    better side (output length) or none at all reads so; the latency row and its difference are
    both means; acceptance is n/a for a variant that never drafted."""
    recs = records("base", [10.0, 20.0, 30.0, 40.0], latency=1.0, drafted=False)
    recs += records("legal", [40.0, 50.0, 60.0, 70.0], latency=3.0)
    recs[4].output_tokens = 14  # legal writes longer, for one item
    seg = segment_report(recs, ["base", "legal"], paired=True)
    report = {"experiment_id": "exp_1", "name": "t", "mode": "paired", "control": "base", "finished_jobs": 8,
              "bootstrap": 2000, "segments": {"all": seg}}
    assert seg["variants"]["base"]["latency_mean_s"]["value"] == 1.0
    assert seg["differences"]["legal - base"]["latency_s"]["value"] == 2.0  # mean minus mean
    text = format_report(report)
    assert "legal vs base: ROUGE-L +30.00 [+30.00, +30.00] points, better (wins/ties/losses 4/0/0)" in text
    # a slower arm reads worse, where its workers could be compared; these jobs name no worker
    latency = seg["differences"]["legal - base"]["latency_s"]
    assert direction(DIFFERENCES["latency_s"], {**latency, "not_comparable": None}) == "worse"
    assert "legal vs base: latency, mean (s) not comparable here: the jobs of base, legal do not record" in text
    assert "n/a (no job drafted: mode ar)" in text and "nar_acceptance" not in text and "latency_s" not in text
    page = render_html(report)
    assert "<li class='better'>legal vs base: ROUGE-L" in page and "<li class='note'>legal vs base: latency" in page
    assert "<td class='same'>+1.0 <small>[+0.0, +3.0]</small></td>" in page  # output length: interval spans 0
    assert "n/a (no job drafted: mode ar)" in page and page.count("<img") == 2
