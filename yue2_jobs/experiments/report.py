"""The A/B report: per variant metrics with bootstrap 95 % confidence intervals, and each variant's
difference from the control (the first variant), per eval set: never pooled over sets, whose
domains may differ (a model ahead on one domain and behind on another has no single verdict).
An eval set is the batches that share a `metadata.name` (a batch without one is a set of its own);
its domain is their `metadata.domain`. Each set gets its own verdicts, a warning for each arm
evaluated outside its checkpoint's domain (`domains`), the latency verdict withheld where the arms'
workers cannot be shown separate and equal (`placement`), and a few items side by side (`examples`).

Per variant: jobs, success rate, run latency p50/p95 (started -> finished), tokens/s (output
tokens / run seconds, summed), NAR acceptance (share of output tokens that came from accepted
drafts), mean output length and, for jobs whose batch line carried a `reference`, ROUGE-1/2/L F1
x 100. Differences: in a `paired` experiment, per request (same batch, same custom_id, both
succeeded), the bootstrap resampling the requests; in a `split` experiment, the difference of the
two groups' means, each group resampled on its own. Percentile bootstrap, fixed seed, so a report
is reproducible.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.db.models import Batch, Experiment, ExperimentMode, Job, JobStatus
from yue2_jobs.experiments.domains import clean_domain, domain_warnings
from yue2_jobs.experiments.examples import examples
from yue2_jobs.experiments.metrics import verdicts
from yue2_jobs.experiments.placement import Placement, latency_not_comparable, load_placements
from yue2_jobs.jobs.assignment import get_experiment, variant_names
from yue2_jobs.jobs.outputs import read_text
from yue2_jobs.rouge import pair_scores
from yue2_jobs.storage import Storage

N_BOOT = 2000
SEED = 20261204
ROUGE = ("rouge1", "rouge2", "rougeL")
COMPARED = (*ROUGE, "success_rate", "output_tokens", "latency_s")  # differences reported for these


@dataclass
class JobRecord:
    """One job of the experiment, with what the report needs."""

    batch_id: str
    custom_id: str
    variant: str
    checkpoint: str | None
    succeeded: bool
    latency_s: float | None
    output_tokens: int
    nar_tokens: int
    scores: dict[str, float] = field(default_factory=dict)  # ROUGE F1 x 100, when a reference was given
    drafted: bool = True  # it ran a mode that drafts (not `ar`): NAR acceptance means something for it
    job_id: str = ""
    worker: str | None = None  # the Celery node name that claimed it (`<name>@<host>`)


@dataclass(frozen=True)
class EvalSet:
    """Batches of one eval set: the same `metadata.name`, and the domain they declare."""

    label: str
    batch_ids: tuple[str, ...]
    domain: str | None


def eval_sets(batches: list[tuple[str, dict[str, Any] | None]]) -> list[EvalSet]:
    """The experiment's batches (oldest first) grouped by `metadata.name` (else the batch id), in the
    order each set was first submitted. A set whose batches declare different domains, or only some
    of them one, has none: it cannot be checked."""
    grouped: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for batch_id, metadata in batches:
        meta = metadata or {}
        grouped[str(meta.get("name") or batch_id)].append((batch_id, clean_domain(meta.get("domain"))))
    out = []
    for label, members in grouped.items():
        domains = {d for _, d in members}
        out.append(EvalSet(label, tuple(sorted(b for b, _ in members)), domains.pop() if len(domains) == 1 else None))
    return out


def load_records(session: Session, exp: Experiment, storage: Storage) -> tuple[list[JobRecord], list[EvalSet]]:
    """The experiment's finished jobs (queued and running ones are left out) and its eval sets."""
    rows = session.execute(select(Job).where(Job.experiment_id == exp.id)
                           .where(Job.status.in_((JobStatus.SUCCEEDED, JobStatus.FAILED)))
                           .order_by(Job.batch_id, Job.custom_id, Job.variant)).scalars().all()
    batches = session.execute(select(Batch.id, Batch.metadata_).where(Batch.experiment_id == exp.id)
                              .order_by(Batch.created_at, Batch.id)).all()
    records, to_score = [], []
    for job in rows:
        ok = job.status == JobStatus.SUCCEEDED
        latency = (job.finished_at - job.started_at).total_seconds() if ok and job.started_at and job.finished_at \
            else None
        rec = JobRecord(batch_id=job.batch_id or "", custom_id=job.custom_id or job.id, variant=job.variant,
                        checkpoint=job.checkpoint, succeeded=ok, latency_s=latency,
                        output_tokens=job.output_tokens or 0, nar_tokens=job.nar_tokens or 0,
                        drafted=(job.decoded_mode or (job.params or {}).get("mode")) not in ("ar", None),
                        job_id=job.id, worker=job.worker)
        records.append(rec)
        if ok and job.reference is not None:
            text = read_text(storage, output_text=job.output_text, output_key=job.output_key)
            to_score.append((rec, text, job.reference))
    if to_score:
        scores = pair_scores([t for _, t, _ in to_score], [r for _, _, r in to_score])
        for (rec, _, _), score in zip(to_score, scores, strict=True):
            rec.scores = {k: 100.0 * v for k, v in score.items()}
    return records, eval_sets([(b.id, b.metadata_) for b in batches])


def _resamples(rng: np.random.Generator, n: int, n_boot: int) -> Any:
    """`n_boot` index vectors of length n, drawn a block at a time (a 50,000-job variant would need
    800 MB for all 2,000 at once)."""
    block = max(1, min(n_boot, 2_000_000 // n))
    for start in range(0, n_boot, block):
        yield from rng.integers(0, n, size=(min(block, n_boot - start), n))


def bootstrap_ci(stat: Callable[..., float], *arrays: np.ndarray, rng: np.random.Generator,
                 n_boot: int = N_BOOT) -> list[float] | None:
    """Percentile 95 % interval of `stat(*arrays)` over resamples of the rows (arrays resampled together)."""
    n = len(arrays[0])
    if n < 2:
        return None
    values = np.array([stat(*(a[i] for a in arrays)) for i in _resamples(rng, n, n_boot)])
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]


def _estimate(stat: Callable[..., float], *arrays: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    if not len(arrays[0]):
        return {"value": None, "ci95": None, "n": 0}
    return {"value": float(stat(*arrays)), "ci95": bootstrap_ci(stat, *arrays, rng=rng), "n": len(arrays[0])}


def _ratio(num: np.ndarray, den: np.ndarray) -> float:
    return float(num.sum() / den.sum()) if den.sum() > 0 else float("nan")


def variant_metrics(records: list[JobRecord], rng: np.random.Generator) -> dict[str, Any]:
    ok = [r for r in records if r.succeeded]
    success = np.array([r.succeeded for r in records], dtype=float)
    latency = np.array([r.latency_s for r in ok if r.latency_s is not None])
    timed = [r for r in ok if r.latency_s]
    tokens_t = np.array([r.output_tokens for r in timed], dtype=float)
    seconds_t = np.array([r.latency_s for r in timed], dtype=float)
    out_tokens = np.array([r.output_tokens for r in ok], dtype=float)
    nar = np.array([r.nar_tokens for r in ok], dtype=float)
    drafted = np.array([r.drafted for r in ok], dtype=bool)
    out = {
        "jobs": len(records), "succeeded": len(ok), "failed": len(records) - len(ok),
        "checkpoints": dict(Counter(r.checkpoint for r in ok if r.checkpoint)),
        "success_rate": _estimate(np.mean, success, rng=rng),
        "latency_mean_s": _estimate(np.mean, latency, rng=rng),
        "latency_p50_s": _estimate(lambda x: np.percentile(x, 50), latency, rng=rng),
        "latency_p95_s": _estimate(lambda x: np.percentile(x, 95), latency, rng=rng),
        "tokens_per_s": _estimate(_ratio, tokens_t, seconds_t, rng=rng),
        "nar_acceptance": _estimate(_ratio, nar[drafted], out_tokens[drafted], rng=rng) if drafted.any()
        else {"value": None, "ci95": None, "n": 0, "na": "no job drafted: mode ar"},
        "output_tokens": _estimate(np.mean, out_tokens, rng=rng),
    }
    for key in ROUGE:
        out[key] = _estimate(np.mean, np.array([r.scores[key] for r in ok if r.scores]), rng=rng)
    return out


def _item_value(rec: JobRecord, metric: str) -> float | None:
    if metric == "success_rate":
        return float(rec.succeeded)
    if not rec.succeeded:
        return None
    if metric in ROUGE:
        return rec.scores.get(metric)
    return float(rec.output_tokens) if metric == "output_tokens" else rec.latency_s


def difference(control: list[JobRecord], treatment: list[JobRecord], *, metric: str, paired: bool,
               rng: np.random.Generator) -> dict[str, Any]:
    """Mean of `metric` under treatment minus under control, with its bootstrap 95 % interval."""
    if paired:
        by_item = {(r.batch_id, r.custom_id): r for r in control}
        pairs = [(by_item[(t.batch_id, t.custom_id)], t) for t in treatment if (t.batch_id, t.custom_id) in by_item]
        d = [(tv - cv) for c, t in pairs
             if (cv := _item_value(c, metric)) is not None and (tv := _item_value(t, metric)) is not None]
        est = _estimate(np.mean, np.array(d, dtype=float), rng=rng)
        if d:
            est.update(wins=sum(x > 0 for x in d), ties=sum(x == 0 for x in d), losses=sum(x < 0 for x in d))
    else:
        a = np.array([v for r in control if (v := _item_value(r, metric)) is not None], dtype=float)
        b = np.array([v for r in treatment if (v := _item_value(r, metric)) is not None], dtype=float)
        est = {"value": None, "ci95": None, "n": min(len(a), len(b))}
        if len(a) and len(b):
            est["value"] = float(b.mean() - a.mean())
            if len(a) > 1 and len(b) > 1:
                boots = (np.array([b[i].mean() for i in _resamples(rng, len(b), N_BOOT)])
                         - np.array([a[i].mean() for i in _resamples(rng, len(a), N_BOOT)]))
                est["ci95"] = [float(x) for x in np.percentile(boots, [2.5, 97.5])]
    ci = est.get("ci95")
    est["excludes_zero"] = bool(ci is not None and (ci[0] > 0 or ci[1] < 0))
    return {"metric": metric, "paired": paired, **est}


def segment_report(records: list[JobRecord], variants: list[str], *, paired: bool,
                   placements: dict[str, Placement] | None = None) -> dict[str, Any]:
    """One eval set's figures: each variant's metrics, each difference from the control (latency's
    read only where `placements`, where each worker ran, show the arms' workers separate and equal,
    else with why not: `placement`) and the verdicts they support."""
    rng = np.random.default_rng(SEED)
    by_variant: dict[str, list[JobRecord]] = defaultdict(list)
    for r in records:
        by_variant[r.variant].append(r)
    control = variants[0]
    differences = {}
    for v in variants[1:]:
        diffs = {m: difference(by_variant[control], by_variant[v], metric=m, paired=paired, rng=rng) for m in COMPARED}
        why = latency_not_comparable({arm: {r.worker for r in by_variant[arm] if r.succeeded} for arm in (control, v)},
                                     placements)
        diffs["latency_s"].update(comparable=why is None, not_comparable=why)
        differences[f"{v} - {control}"] = diffs
    seg: dict[str, Any] = {"items": len({(r.batch_id, r.custom_id) for r in records}),
                           "variants": {v: variant_metrics(by_variant[v], rng) for v in variants},
                           "differences": differences}
    seg["verdicts"] = [{"direction": way, "text": text} for way, text in verdicts(seg)]
    return seg


def build_report(session: Session, exp: Experiment, storage: Storage) -> dict[str, Any]:
    """The report as JSON: a segment per eval set (no pooled one: see the module's docstring)."""
    records, sets = load_records(session, exp, storage)
    placements = load_placements(session, (r.worker for r in records if r.succeeded))
    variants, paired = variant_names(exp), exp.mode == ExperimentMode.PAIRED
    domains = {a["variant"]: clean_domain(a.get("domain")) for a in exp.arms["variants"]}
    segments = {}
    for s in sets:
        mine = [r for r in records if r.batch_id in s.batch_ids]
        seg = segment_report(mine, variants, paired=paired, placements=placements)
        seg.update(batches=list(s.batch_ids), domain=s.domain,
                   warnings=domain_warnings(set_label=s.label, set_domain=s.domain, arms=domains),
                   examples=examples(session, storage, mine, variants))
        segments[s.label] = seg
    return {"object": "yue2.experiment.report", "experiment_id": exp.id, "name": exp.name, "mode": exp.mode,
            "control": variants[0], "variants": exp.arms["variants"], "confidence": 0.95, "bootstrap": N_BOOT,
            "finished_jobs": len(records), "segments": segments}


def tenant_report(sessions: sessionmaker[Session], storage: Storage, *, tenant: str,
                  experiment_id: str) -> dict[str, Any]:
    """One call for the route: the tenant's experiment (404 if not theirs), then its report."""
    with sessions() as session:
        return build_report(session, get_experiment(session, tenant=tenant, experiment_id=experiment_id), storage)
