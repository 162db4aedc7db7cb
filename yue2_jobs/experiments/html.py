"""The A/B report as one self-contained HTML page: tables and matplotlib plots (inline PNGs)."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

METRICS = (("success_rate", "success rate", "{:.1%}"), ("latency_p50_s", "latency p50 (s)", "{:.3f}"),
           ("latency_p95_s", "latency p95 (s)", "{:.3f}"), ("tokens_per_s", "tokens/s", "{:.1f}"),
           ("nar_acceptance", "NAR acceptance", "{:.1%}"), ("output_tokens", "output tokens", "{:.1f}"),
           ("rouge1", "ROUGE-1", "{:.2f}"), ("rouge2", "ROUGE-2", "{:.2f}"), ("rougeL", "ROUGE-L", "{:.2f}"))
PLOTTED = ("rouge1", "rouge2", "rougeL", "output_tokens", "latency_p50_s")


def _fmt(est: dict[str, Any], pattern: str) -> str:
    if est.get("value") is None:
        return "–"
    text = pattern.format(est["value"])
    if est.get("ci95"):
        lo, hi = est["ci95"]
        text += f" <small>[{pattern.format(lo)}, {pattern.format(hi)}]</small>"
    return text


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _metric_plot(plt: Any, segment: dict[str, Any]) -> str:
    """One panel per metric: each variant's value with its 95 % interval."""
    variants = list(segment["variants"])
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(3.2 * len(PLOTTED), 3))
    for ax, metric in zip(axes, PLOTTED, strict=True):
        ests = [segment["variants"][v][metric] for v in variants]
        values = [e["value"] if e["value"] is not None else 0.0 for e in ests]
        errs = [[max(0.0, v - e["ci95"][0]) if e.get("ci95") else 0.0 for v, e in zip(values, ests, strict=True)],
                [max(0.0, e["ci95"][1] - v) if e.get("ci95") else 0.0 for v, e in zip(values, ests, strict=True)]]
        ax.bar(variants, values, yerr=errs, capsize=4, color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][:len(values)])
        ax.set_title(metric)
    fig.tight_layout()
    out = _png(fig)
    plt.close(fig)
    return out


def _difference_plot(plt: Any, segment: dict[str, Any]) -> str:
    """Each difference from the control with its 95 % interval; the dashed line is no difference."""
    rows = [(f"{name}: {m}", d) for name, diffs in segment["differences"].items() for m, d in diffs.items()
            if d["value"] is not None and m in ("rouge1", "rouge2", "rougeL", "output_tokens")]
    if not rows:
        return ""
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1))
    for y, (_, d) in enumerate(rows):
        lo, hi = d["ci95"] or (d["value"], d["value"])
        ax.plot([lo, hi], [y, y], color="#333")
        ax.plot(d["value"], y, "o", color="#c44e52" if d["excludes_zero"] else "#777")
    ax.axvline(0, linestyle="--", color="#999")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_xlabel("treatment - control (95% bootstrap interval)")
    fig.tight_layout()
    out = _png(fig)
    plt.close(fig)
    return out


def render_html(report: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no screen on a server
    import matplotlib.pyplot as plt

    esc = html.escape
    parts = [f"<!doctype html><meta charset='utf-8'><title>A/B report {esc(report['experiment_id'])}</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th:first-child,td:first-child"
             "{text-align:left}.sig{color:#b00;font-weight:bold}</style>",
             f"<h1>A/B report: {esc(report['name'] or report['experiment_id'])}</h1>",
             f"<p>{esc(report['experiment_id'])}, mode <b>{esc(report['mode'])}</b>, control "
             f"<b>{esc(report['control'])}</b>, {report['finished_jobs']} finished jobs; 95% percentile bootstrap "
             f"intervals ({report['bootstrap']} resamples).</p>"]
    for name, segment in report["segments"].items():
        variants = list(segment["variants"])
        parts.append(f"<h2>{esc(name)}</h2><table><tr><th>metric</th>"
                     + "".join(f"<th>{esc(v)}</th>" for v in variants) + "</tr>")
        parts.append("<tr><td>jobs (succeeded / failed)</td>" + "".join(
            f"<td>{m['jobs']} ({m['succeeded']} / {m['failed']})</td>" for m in segment["variants"].values())
            + "</tr>")
        for key, label, pattern in METRICS:
            parts.append(f"<tr><td>{label}</td>" + "".join(
                f"<td>{_fmt(segment['variants'][v][key], pattern)}</td>" for v in variants) + "</tr>")
        parts.append("</table><h3>Differences from the control</h3><table><tr><th>comparison</th><th>metric</th>"
                     "<th>difference [95% CI]</th><th>n</th><th>wins / ties / losses</th></tr>")
        for comparison, diffs in segment["differences"].items():
            for metric, d in diffs.items():
                cls = " class='sig'" if d["excludes_zero"] else ""
                wtl = f"{d['wins']} / {d['ties']} / {d['losses']}" if "wins" in d else "–"
                parts.append(f"<tr><td>{esc(comparison)}</td><td>{metric}</td><td{cls}>{_fmt(d, '{:+.3f}')}</td>"
                             f"<td>{d['n']}</td><td>{wtl}</td></tr>")
        parts.append("</table>")
        parts.append(_metric_plot(plt, segment))
        parts.append(_difference_plot(plt, segment))
    return "\n".join(parts)
