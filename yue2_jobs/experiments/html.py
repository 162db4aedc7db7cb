"""The A/B report as one self-contained HTML page: a section per eval set (nothing pooled over
sets) with its verdicts, its domain warnings, tables coloured by direction (better, worse, a
difference with no better side, or one not comparable here), matplotlib plots (inline PNGs) that
fit a 1,280-pixel window, and a few items side by side."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from yue2_jobs.experiments.metrics import DIFFERENCES, VARIANT_ROWS, direction, estimate_text, wtl_text
from yue2_jobs.experiments.text import EXAMPLES_NOTE, NO_VERDICT, set_heading

PLOTTED = ("rouge1", "rouge2", "rougeL", "output_tokens", "latency_mean_s")
FOREST = ("rouge1", "rouge2", "rougeL", "output_tokens", "latency_s")  # latency too, on its own axis
COLOURS = {"better": "#1a7f37", "worse": "#c62828", "differs": "#6a3d9a", "same": "#777777", "incomparable": "#777777"}
READS = {"same": "no difference shown", "incomparable": "not comparable here"}
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:.5em 0}"
         "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th:first-child,td:first-child"
         "{text-align:left}img{max-width:100%;height:auto}small{color:#555}"
         + "".join(f".{k}{{color:{v};font-weight:bold}}" for k, v in COLOURS.items() if k not in READS)
         + ".legend span{margin-right:1.5em}.diff td:nth-child(2),.diff th:nth-child(2){text-align:left}"
         ".warn{background:#fff4e5;border-left:4px solid #e65100;padding:4px 8px;list-style:none}"
         ".note{color:#555;list-style:none}.ex td,.ex th{text-align:left;vertical-align:top;max-width:22em}"
         ".sets{display:flex;flex-wrap:wrap;gap:1em}.set{flex:1;min-width:22em;border:1px solid #ccc;"
         "padding:0 .8em}.set ul{padding-left:1.2em}"
         "h2{border-top:2px solid #333;padding-top:.4em}")
LEGEND = ("<p class='legend'><span class='better'>better</span><span class='worse'>worse</span>"
          "<span class='differs'>differs (neither better nor worse)</span><span>grey: the 95% interval "
          "includes 0, or the difference is not comparable here (the verdict says why)</span></p>")


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
    def shown(c: str, m: str) -> bool:  # a difference the report cannot read here is not plotted either
        d = segment["differences"][c][m]
        return d["value"] is not None and direction(DIFFERENCES[m], d) != "incomparable"

    metrics = [m for m in FOREST if any(shown(c, m) for c in comparisons)]
    if not metrics:
        return ""
    fig, axes = plt.subplots(1, len(metrics), figsize=(2.4 * len(metrics), 0.5 * len(comparisons) + 1.4),
                             squeeze=False)
    for ax, key in zip(axes[0], metrics, strict=True):
        metric = DIFFERENCES[key]
        for y, comparison in enumerate(comparisons):
            d = segment["differences"][comparison][key]
            if not shown(comparison, key):
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
            why = f" title='{esc(d['not_comparable'])}'" if way == "incomparable" else ""
            parts.append(f"<tr><td>{esc(comparison)}</td><td>{esc(metric.label)}</td>"
                         f"<td class='{way}'>{_cell(d, metric.fmt)}</td><td class='{way}'{why}>"
                         f"{READS.get(way, way)}</td><td>{d['n']}</td><td>{wtl_text(d) or '–'}</td></tr>")
    parts.append("</table>")
    return parts


def _verdicts(name: str, segment: dict[str, Any]) -> str:
    """The set's box at the top of the page: its verdicts, what cannot be compared, its warnings."""
    esc = html.escape
    found = segment.get("verdicts", [])
    items = [f"<li class='{v['direction']}'>{esc(v['text'])}</li>" for v in found if v["direction"] != "incomparable"]
    items = items or [f"<li>{NO_VERDICT}</li>"]
    items += [f"<li class='note'>{esc(v['text'])}</li>" for v in found if v["direction"] == "incomparable"]
    warnings = [f"<li class='{'warn' if w['kind'] == 'domain_mismatch' else 'note'}'>"
                f"{'⚠ ' if w['kind'] == 'domain_mismatch' else ''}{esc(w['message'])}</li>"
                for w in segment.get("warnings", [])]
    return (f"<div class='set'><h3>{esc(set_heading(name, segment))}</h3><ul>" + "".join(items + warnings)
            + "</ul></div>")


def _examples(segment: dict[str, Any]) -> str:
    esc = html.escape
    shown = segment.get("examples") or []
    if not shown:
        return ""
    variants = list(shown[0]["outputs"])
    rows = [f"<h3>Examples</h3><p><small>{len(shown)} items, {EXAMPLES_NOTE}.</small></p><table class='ex'>"
            "<tr><th>input (excerpt)</th>" + "".join(f"<th>{esc(v)}</th>" for v in variants)
            + "<th>reference</th></tr>"]
    for ex in shown:
        cells = "".join(f"<td>{esc(t) if t is not None else '<i>no output</i>'}</td>" for t in ex["outputs"].values())
        rows.append(f"<tr><td><small>{esc(ex['custom_id'])}</small><br>{esc(ex['input'])}</td>{cells}"
                    f"<td>{esc(ex['reference']) if ex['reference'] is not None else '–'}</td></tr>")
    return "".join(rows) + "</table>"


def render_html(report: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no screen on a server
    import matplotlib.pyplot as plt

    esc = html.escape
    parts = [f"<!doctype html><meta charset='utf-8'><title>A/B report {esc(report['experiment_id'])}</title>",
             f"<style>{STYLE}</style>",
             f"<h1>A/B report: {esc(report['name'] or report['experiment_id'])}</h1>",
             f"<p>{esc(report['experiment_id'])}, mode <b>{esc(report['mode'])}</b>, control "
             f"<b>{esc(report['control'])}</b>, {report['finished_jobs']} finished jobs; 95% percentile bootstrap "
             f"intervals ({report['bootstrap']} resamples).</p>",
             "<h2>Verdict per eval set</h2><p>Each set on its own: nothing is pooled over sets, whose domains "
             "may differ.</p>", LEGEND,
             "<div class='sets'>" + "".join(_verdicts(n, seg) for n, seg in report["segments"].items()) + "</div>"]
    for name, segment in report["segments"].items():
        parts.append(f"<h2>{esc(set_heading(name, segment))}</h2>")
        parts += _tables(segment)
        parts.append(_metric_plot(plt, segment))
        parts.append(_difference_plot(plt, segment))
        parts.append(_examples(segment))
    return "\n".join(parts)
