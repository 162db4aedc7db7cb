"""An A/B report as text (`yue2 ab report`, the A/B demo): per eval set, its verdicts, its warnings
(an arm outside its domain), each variant's metrics, the differences from the control with
wins/ties/losses, and a few items side by side. Nothing is pooled over eval sets."""

from __future__ import annotations

from typing import Any

from yue2_jobs.experiments.metrics import DIFFERENCES, VARIANT_ROWS, direction, estimate_text, wtl_text

MARK = {"better": "better", "worse": "WORSE", "differs": "differs", "same": "", "incomparable": "not comparable"}
NO_VERDICT = "no difference from the control whose 95% interval excludes 0"
EXAMPLES_NOTE = "spread evenly over the set in custom_id order, not chosen by score"


def set_heading(name: str, seg: dict[str, Any]) -> str:
    """`legal eval: domain legal, 182 items` (finished items: requests of the set, each counted once)."""
    return f"{name}: domain {seg.get('domain') or 'not declared'}, {seg['items']} items"


def _table(seg: dict[str, Any]) -> list[str]:
    variants = list(seg["variants"])
    lines = [f"{'metric':<22}" + "".join(f"{v:>32}" for v in variants)]
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
            wtl = f"  w/t/l {wtl_text(d)}" if wtl_text(d) else ""
            lines.append(f"    {metric.label:<20} {estimate_text(d, metric.fmt):>30}  n={d['n']}{wtl} ({kind})  "
                         f"{MARK[direction(metric, d)]}".rstrip())
    return lines


def _examples(seg: dict[str, Any]) -> list[str]:
    shown = seg.get("examples") or []
    if not shown:
        return []
    lines = [f"Examples ({len(shown)}, {EXAMPLES_NOTE}):"]
    for ex in shown:
        lines.append(f"  [{ex['custom_id']}] input: {ex['input']}")
        for variant, text in ex["outputs"].items():
            lines.append(f"    {variant + ':':<12} {text if text is not None else '(no output)'}")
        lines.append(f"    {'reference:':<12} {ex['reference'] if ex['reference'] is not None else '(none)'}")
    return lines


def format_report(report: dict[str, Any]) -> str:
    """The report as text: per eval set, its verdicts and warnings first, then its tables."""
    lines = [f"{report['experiment_id']} ({report['mode']}, control {report['control']}): "
             f"{report['finished_jobs']} finished jobs, 95% bootstrap intervals; verdicts per eval set, "
             f"never pooled over sets"]
    for name, seg in report["segments"].items():
        lines += ["", f"== {set_heading(name, seg)}", "Verdict:"]
        found = seg.get("verdicts", [])
        lines += [f"  {v['text']}" for v in found if v["direction"] != "incomparable"] or [f"  {NO_VERDICT}"]
        lines += [f"  {v['text']}" for v in found if v["direction"] == "incomparable"]
        for w in seg.get("warnings", []):
            lines.append(f"  {'WARNING' if w['kind'] == 'domain_mismatch' else 'note'}: {w['message']}")
        lines += _table(seg) + _examples(seg)
    return "\n".join(lines)
