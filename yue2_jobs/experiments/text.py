"""An A/B report as text tables (`yue2 ab report`, the A/B demo): a verdict per difference that
the data shows, then per segment each variant's metrics and the differences from the control."""

from __future__ import annotations

from typing import Any

from yue2_jobs.experiments.metrics import DIFFERENCES, VARIANT_ROWS, direction, estimate_text, verdicts

MARK = {"better": "better", "worse": "WORSE", "differs": "differs", "same": ""}


def format_report(report: dict[str, Any]) -> str:
    """The report as text: verdicts on the whole experiment, then a table per segment."""
    lines = [f"{report['experiment_id']} ({report['mode']}, control {report['control']}): "
             f"{report['finished_jobs']} finished jobs, 95% bootstrap intervals"]
    found = verdicts(report["segments"]["all"])
    lines += ["", "Verdict:"] + ([f"  {sentence}" for _, sentence in found] or
                                 ["  no difference from the control whose 95% interval excludes 0"])
    for name, seg in report["segments"].items():
        variants = list(seg["variants"])
        lines += ["", f"== {name}", f"{'metric':<22}" + "".join(f"{v:>32}" for v in variants)]
        lines.append(f"{'jobs (ok / failed)':<22}" + "".join(
            f"{m['jobs']} ({m['succeeded']} / {m['failed']})".rjust(32) for m in seg["variants"].values()))
        for metric in VARIANT_ROWS:
            lines.append(f"{metric.label:<22}" + "".join(
                f"{estimate_text(seg['variants'][v][metric.key], metric.fmt):>32}" for v in variants))
        for comparison, diffs in seg["differences"].items():
            lines.append(f"  {comparison}:")
            for key, d in diffs.items():
                metric = DIFFERENCES[key]
                kind = "paired" if d["paired"] else "unpaired"
                lines.append(f"    {metric.label:<20} {estimate_text(d, metric.fmt):>30}  n={d['n']} ({kind})  "
                             f"{MARK[direction(metric, d)]}".rstrip())
    return "\n".join(lines)
