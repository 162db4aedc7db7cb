"""An A/B report as text tables (`yue2 ab report`, the A/B demo)."""

from __future__ import annotations

from typing import Any

ROWS = (("success_rate", "success", "{:.1%}"), ("latency_p50_s", "p50 s", "{:.3f}"),
        ("latency_p95_s", "p95 s", "{:.3f}"), ("tokens_per_s", "tok/s", "{:.1f}"),
        ("nar_acceptance", "NAR acc", "{:.1%}"), ("output_tokens", "out tok", "{:.1f}"),
        ("rouge1", "ROUGE-1", "{:.2f}"), ("rouge2", "ROUGE-2", "{:.2f}"), ("rougeL", "ROUGE-L", "{:.2f}"))


def _est(e: dict[str, Any], pattern: str) -> str:
    if e.get("value") is None:
        return "-"
    ci = e.get("ci95")
    return pattern.format(e["value"]) + (f" [{pattern.format(ci[0])}, {pattern.format(ci[1])}]" if ci else "")


def format_report(report: dict[str, Any]) -> str:
    """The report as text tables: per segment, each variant's metrics, then the differences."""
    lines = [f"{report['experiment_id']} ({report['mode']}, control {report['control']}): "
             f"{report['finished_jobs']} finished jobs, 95% bootstrap intervals"]
    for name, seg in report["segments"].items():
        variants = list(seg["variants"])
        lines += ["", f"== {name}", f"{'metric':<10}" + "".join(f"{v:>34}" for v in variants)]
        lines.append(f"{'jobs':<10}" + "".join(f"{m['jobs']:>34}" for m in seg["variants"].values()))
        for key, label, pattern in ROWS:
            lines.append(f"{label:<10}" + "".join(f"{_est(seg['variants'][v][key], pattern):>34}" for v in variants))
        for comparison, diffs in seg["differences"].items():
            for metric, d in diffs.items():
                mark = "  *" if d["excludes_zero"] else ""
                kind = "paired" if d["paired"] else "unpaired"
                lines.append(f"  {comparison}: {metric:<13} {_est(d, '{:+.3f}'):>28}  n={d['n']} ({kind}){mark}")
    lines.append("\n* the 95% interval excludes 0")
    return "\n".join(lines)
