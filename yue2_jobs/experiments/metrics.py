"""What each A/B metric is called, how it is printed and which way is better: one home for the
text report, the HTML report and the verdicts, so they say the same thing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Sense = Literal["higher", "lower"] | None  # None: a difference is neither better nor worse
# `incomparable`: a difference the report cannot read either way here (latency on shared workers)
Direction = Literal["better", "worse", "differs", "same", "incomparable"]


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    fmt: str
    better: Sense = None
    unit: str = ""


VARIANT_ROWS = (
    Metric("success_rate", "success rate", "{:.1%}", "higher"),
    Metric("latency_mean_s", "latency, mean (s)", "{:.3f}", "lower", "s"),
    Metric("latency_p50_s", "latency, median (s)", "{:.3f}", "lower", "s"),
    Metric("latency_p95_s", "latency, p95 (s)", "{:.3f}", "lower", "s"),
    Metric("tokens_per_s", "tokens/s", "{:.1f}", "higher"),
    Metric("nar_acceptance", "NAR acceptance", "{:.1%}", "higher"),
    Metric("output_tokens", "output tokens, mean", "{:.1f}"),
    Metric("rouge1", "ROUGE-1", "{:.2f}", "higher"),
    Metric("rouge2", "ROUGE-2", "{:.2f}", "higher"),
    Metric("rougeL", "ROUGE-L", "{:.2f}", "higher"),
)
# The differences are of means, so the table row each one sits under is a mean too.
DIFFERENCES = {
    "rouge1": Metric("rouge1", "ROUGE-1", "{:+.2f}", "higher", "points"),
    "rouge2": Metric("rouge2", "ROUGE-2", "{:+.2f}", "higher", "points"),
    "rougeL": Metric("rougeL", "ROUGE-L", "{:+.2f}", "higher", "points"),
    "success_rate": Metric("success_rate", "success rate", "{:+.1%}", "higher"),
    "output_tokens": Metric("output_tokens", "output tokens, mean", "{:+.1f}", None, "tokens"),
    "latency_s": Metric("latency_s", "latency, mean (s)", "{:+.3f}", "lower", "s"),
}


def direction(metric: Metric, d: dict[str, Any]) -> Direction:
    """How a difference (treatment - control) reads: `same` unless its 95 % interval excludes 0, and
    `incomparable` whatever its interval when the report says why it cannot be compared."""
    if d.get("not_comparable"):
        return "incomparable"
    if not d.get("excludes_zero") or d.get("value") is None:
        return "same"
    if metric.better is None:
        return "differs"
    return "better" if (d["value"] > 0) == (metric.better == "higher") else "worse"


def estimate_text(e: dict[str, Any], fmt: str) -> str:
    """A value with its interval, `n/a` (and why) where there is none."""
    if e.get("value") is None:
        return f"n/a ({e['na']})" if e.get("na") else "n/a"
    ci = e.get("ci95")
    return fmt.format(e["value"]) + (f" [{fmt.format(ci[0])}, {fmt.format(ci[1])}]" if ci else "")


def wtl_text(d: dict[str, Any]) -> str:
    """A paired difference's wins / ties / losses (treatment against control, item by item)."""
    return f"{d['wins']}/{d['ties']}/{d['losses']}" if "wins" in d else ""


def verdicts(segment: dict[str, Any]) -> list[tuple[Direction, str]]:
    """One (direction, sentence) per difference whose interval excludes 0, with wins/ties/losses
    beside the interval, e.g. ("better", "legal vs base: ROUGE-L +12.30 [+10.10, +14.50] points,
    better (wins/ties/losses 150/20/12)"); and one `incomparable` sentence per difference the report
    cannot read here, saying why. A segment is one eval set: verdicts are never pooled over sets."""
    out: list[tuple[Direction, str]] = []
    for comparison, diffs in segment["differences"].items():
        treatment, control = comparison.split(" - ", 1)
        for key, d in diffs.items():
            metric = DIFFERENCES[key]
            way = direction(metric, d)
            if way == "incomparable":
                if d.get("value") is not None:
                    out.append((way, f"{treatment} vs {control}: {metric.label} not comparable here: "
                                     f"{d['not_comparable']}"))
            elif way != "same":
                unit = f" {metric.unit}" if metric.unit and metric.unit != "s" else ""
                wtl = f" (wins/ties/losses {wtl_text(d)})" if wtl_text(d) else ""
                out.append((way, f"{treatment} vs {control}: {metric.label} {estimate_text(d, metric.fmt)}{unit}, "
                                 f"{way}{wtl}"))
    return out
