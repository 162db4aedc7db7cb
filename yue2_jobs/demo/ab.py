"""`make ab-demo` / `yue2 ab demo`: `base` vs `legal`, paired, over both eval sets, on the embedded
pipeline (SQLite, filesystem queue, local storage: no servers).

Starts the API and one worker per variant, creates a paired experiment, submits each eval set as
a batch under it, as `yue2 ab export-eval` writes it (the references ride along in each line's
`reference`; the batch's metadata names the set and its domain), waits, and prints the report;
writes the JSON and the HTML report (with plots) to --out. With at least one CPU per arm and
one more, each worker is pinned to its own, equal share of this process's CPUs and this process
(the API, the demo's own client) to the rest (`plan_cpus`), so the report can give a latency verdict
(each worker records where it ran, `experiments.placement`). With fewer (a 2-core machine) nothing
is pinned: pinning each worker to one core while the API and the client still ran on those same
cores would pass the placement check yet measure scheduling again, so the workers share the CPUs
and the report withholds the latency verdict and says why.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from yue2_jobs.demo import embedded_stack, stop_with_parent
from yue2_jobs.experiments.eval_sets import SHIPPED_SETS, export_eval_sets

VARIANTS = ("base", "legal")


@dataclass(frozen=True)
class CpuPlan:
    """Where the demo's processes run: `arms[i]` the CPUs of arm i's worker, `rest` those of this
    process (the API, the client) and anything else it starts; None: not pinned (all CPUs)."""

    arms: list[list[int] | None]
    rest: list[int] | None


def plan_cpus(allowed: list[int], arms: int) -> CpuPlan:
    """Equal, disjoint, contiguous shares of `allowed` for the arms' workers and the CPUs left over
    (at least one) for everything else; nothing pinned when the CPUs cannot give every arm one of
    its own and keep one besides (the API and the client would run on the arms' cores)."""
    share = (len(allowed) - 1) // arms
    if share <= 0:
        return CpuPlan(arms=[None] * arms, rest=None)
    ordered = sorted(allowed)
    return CpuPlan(arms=[ordered[i * share:(i + 1) * share] for i in range(arms)], rest=ordered[arms * share:])


def main(*, items: int | None, out: Path) -> None:
    from yue2_jobs.client import Client
    from yue2_jobs.experiments.text import format_report

    stop_with_parent()
    plan = plan_cpus(sorted(os.sched_getaffinity(0)), len(VARIANTS))
    if plan.rest is not None:  # before the API starts: its thread and everything started later inherit it
        os.sched_setaffinity(0, plan.rest)
        print(f"API and client on CPUs {','.join(map(str, plan.rest))}")
    with embedded_stack(prefix="yue2-ab-", tenant="ab-demo") as stack:
        for variant, cpus in zip(VARIANTS, plan.arms, strict=True):
            stack.worker(variant, cpus=cpus)
            print(f"{variant} worker on {'CPUs ' + ','.join(map(str, cpus)) if cpus else 'all CPUs, shared'}")
        home, url, key = stack.home, stack.url, stack.key
        client = Client(url, key)
        exp = client.create_experiment(name="base vs legal on both eval sets", mode="paired",
                                       variants=[{"variant": v} for v in VARIANTS])
        batches = [client.create_batch(client.upload(s.path)["id"], metadata=s.metadata, experiment_id=exp["id"])
                   for s in export_eval_sets(home, items=items)]
        total = sum(b["request_counts"]["total"] for b in batches)
        print(f"experiment {exp['id']}: {total} jobs ({', '.join(VARIANTS)} on every item of "
              f"{' and '.join(SHIPPED_SETS)} eval)")
        with tqdm(total=total, unit="job", desc="running", file=sys.stdout, mininterval=0.5) as bar:
            for b in batches:
                start = bar.n
                def progress(state: dict[str, Any], start: int = start) -> None:
                    counts = state["request_counts"]
                    bar.update(start + counts["completed"] + counts["failed"] - bar.n)

                client.wait(b["id"], poll_s=0.25, timeout_s=1800, on_update=progress)
        report = client.experiment_report(exp["id"])
        print(format_report(report))
        out.mkdir(parents=True, exist_ok=True)
        (out / "ab_report.json").write_text(json.dumps(report, indent=2))
        (out / "ab_report.html").write_text(client.experiment_report_html(exp["id"]))
        print(f"wrote {out / 'ab_report.json'} and {out / 'ab_report.html'}")
