"""The A/B report as one self-contained HTML page: a verdict per difference the data shows,
tables coloured by direction (better, worse, or a difference with no better side), and matplotlib
plots (inline PNGs) that fit a 1,280-pixel window."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from yue2_jobs.experiments.metrics import DIFFERENCES, VARIANT_ROWS, direction, estimate_text, verdicts

PLOTTED = ("rouge1", "rouge2", "rougeL", "output_tokens", "latency_mean_s")
FOREST = ("rouge1", "rouge2", "rougeL", "output_tokens", "latency_s")  # latency too, on its own axis
COLOURS = {"better": "#1a7f37", "worse": "#c62828", "differs": "#6a3d9a", "same": "#777777"}
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:.5em 0}"
         "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th:first-child,td:first-child"
         "{text-align:left}img{max-width:100%;height:auto}small{color:#555}"
         + "".join(f".{k}{{color:{v};font-weight:bold}}" for k, v in COLOURS.items() if k != "same")
         + ".legend span{margin-right:1.5em}.diff td:nth-child(2),.diff th:nth-child(2){text-align:left}")
LEGEND = ("<p class='legend'><span class='better'>better</span><span class='worse'>worse</span>"
          "<span class='differs'>differs (neither better nor worse)</span><span>grey: the 95% interval "
          "includes 0</span></p>")


def _cell(e: dict[str, Any], fmt: str) -> str:
    text = html.escape(estimate_text(e, fmt))
    if " [" in text:  # the interval in small print
        value, ci = text.split(" [", 1)
        text = f"{value} <small>[{ci}</small>"
    return text


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _metric_plot(plt: Any, segment: dict[str, Any]) -> str:
    """One panel per metric: each variant's value with its 95 % interval."""
    variants = list(segment["variants"])
    labels = {m.key: m.label for m in VARIANT_ROWS}
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(2.4 * len(PLOTTED), 2.6))
    for ax, metric in zip(axes, PLOTTED, strict=True):
        ests = [segment["variants"][v][metric] for v in variants]
        values = [e["value"] if e["value"] is not None else 0.0 for e in ests]
        errs = [[max(0.0, v - e["ci95"][0]) if e.get("ci95") else 0.0 for v, e in zip(values, ests, strict=True)],
                [max(0.0, e["ci95"][1] - v) if e.get("ci95") else 0.0 for v, e in zip(values, ests, strict=True)]]
        ax.bar(variants, values, yerr=errs, capsize=4, color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][:len(values)])
        ax.set_title(labels[metric], fontsize=9)
    fig.tight_layout()
    out = _png(fig)
    plt.close(fig)
    return out


def _difference_plot(plt: Any, segment: dict[str, Any]) -> str:
    """A forest plot: per metric (each on its own axis, latency included), each difference from the
    control with its 95 % interval, coloured by direction; the dashed line is no difference."""
    comparisons = list(segment["differences"])
    metrics = [m for m in FOREST if any(segment["differences"][c][m]["value"] is not None for c in comparisons)]
    if not metrics:
        return ""
    fig, axes = plt.subplots(1, len(metrics), figsize=(2.4 * len(metrics), 0.5 * len(comparisons) + 1.4),
                             squeeze=False)
    for ax, key in zip(axes[0], metrics, strict=True):
        metric = DIFFERENCES[key]
        for y, comparison in enumerate(comparisons):
            d = segment["differences"][comparison][key]
            if d["value"] is None:
                continue
            lo, hi = d["ci95"] or (d["value"], d["value"])
            colour = COLOURS[direction(metric, d)]
            ax.plot([lo, hi], [y, y], color=colour)
            ax.plot(d["value"], y, "o", color=colour)
        ax.axvline(0, linestyle="--", color="#999")
        ax.set_yticks(range(len(comparisons)), comparisons if ax is axes[0][0] else [""] * len(comparisons))
        ax.set_ylim(-0.5, len(comparisons) - 0.5)
        ax.set_title(metric.label, fontsize=9)
    fig.supxlabel("treatment - control (95% bootstrap interval)", fontsize=9)
    fig.tight_layout()
    out = _png(fig)
    plt.close(fig)
    return out


def _tables(segment: dict[str, Any]) -> list[str]:
    esc = html.escape
    variants = list(segment["variants"])
    parts = ["<table><tr><th>metric</th>" + "".join(f"<th>{esc(v)}</th>" for v in variants) + "</tr>",
             "<tr><td>jobs (succeeded / failed)</td>" + "".join(
                 f"<td>{m['jobs']} ({m['succeeded']} / {m['failed']})</td>" for m in segment["variants"].values())
             + "</tr>"]
    for metric in VARIANT_ROWS:
        parts.append(f"<tr><td>{esc(metric.label)}</td>" + "".join(
            f"<td>{_cell(segment['variants'][v][metric.key], metric.fmt)}</td>" for v in variants) + "</tr>")
    parts.append("</table><h3>Differences from the control</h3><table class='diff'><tr><th>comparison</th>"
                 "<th>metric</th><th>difference [95% CI]</th><th>reads as</th><th>n</th>"
                 "<th>wins / ties / losses</th></tr>")
    for comparison, diffs in segment["differences"].items():
        for key, d in diffs.items():
            metric = DIFFERENCES[key]
            way = direction(metric, d)
            wtl = f"{d['wins']} / {d['ties']} / {d['losses']}" if "wins" in d else "–"
            parts.append(f"<tr><td>{esc(comparison)}</td><td>{esc(metric.label)}</td>"
                         f"<td class='{way}'>{_cell(d, metric.fmt)}</td><td class='{way}'>"
                         f"{way if way != 'same' else 'no difference shown'}</td><td>{d['n']}</td><td>{wtl}</td></tr>")
    parts.append("</table>")
    return parts


def render_html(report: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no screen on a server
    import matplotlib.pyplot as plt

    esc = html.escape
    found = verdicts(report["segments"]["all"])
    parts = [f"<!doctype html><meta charset='utf-8'><title>A/B report {esc(report['experiment_id'])}</title>",
             f"<style>{STYLE}</style>",
             f"<h1>A/B report: {esc(report['name'] or report['experiment_id'])}</h1>",
             f"<p>{esc(report['experiment_id'])}, mode <b>{esc(report['mode'])}</b>, control "
             f"<b>{esc(report['control'])}</b>, {report['finished_jobs']} finished jobs; 95% percentile bootstrap "
             f"intervals ({report['bootstrap']} resamples).</p>",
             "<h2>Verdict</h2><ul>" + ("".join(f"<li class='{way}'>{esc(sentence)}</li>" for way, sentence in found)
                                       or "<li>no difference from the control whose 95% interval excludes 0</li>")
             + "</ul>", LEGEND]
    for name, segment in report["segments"].items():
        parts.append(f"<h2>{esc(name)}</h2>")
        parts += _tables(segment)
        parts.append(_metric_plot(plt, segment))
        parts.append(_difference_plot(plt, segment))
    return "\n".join(parts)
