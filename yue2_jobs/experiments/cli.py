"""`yue2 ab create | report`: A/B experiments from the shell, over the HTTP API."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROWS = (("success_rate", "success", "{:.1%}"), ("latency_p50_s", "p50 s", "{:.3f}"),
        ("latency_p95_s", "p95 s", "{:.3f}"), ("tokens_per_s", "tok/s", "{:.1f}"),
        ("nar_acceptance", "NAR acc", "{:.1%}"), ("output_tokens", "out tok", "{:.1f}"),
        ("rouge1", "ROUGE-1", "{:.2f}"), ("rouge2", "ROUGE-2", "{:.2f}"), ("rougeL", "ROUGE-L", "{:.2f}"))


def _arm(text: str) -> dict[str, Any]:
    """`legal` or `legal:3` (weight 3)."""
    name, _, weight = text.partition(":")
    return {"variant": name, "weight": float(weight) if weight else 1.0}


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


def _create(args: argparse.Namespace) -> None:
    from yue2_jobs.cli import _client

    exp = _client(args).create_experiment(variants=[_arm(v) for v in args.variant], mode=args.mode, name=args.name)
    print(exp["id"])


def _report(args: argparse.Namespace) -> None:
    from yue2_jobs.cli import _client

    client = _client(args)
    report = client.experiment_report(args.id)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    if args.html:
        Path(args.html).write_text(client.experiment_report_html(args.id))
        print(f"wrote {args.html}")


def _demo(args: argparse.Namespace) -> None:
    from yue2_jobs.experiments.demo import main

    main(items=args.items, out=Path(args.out))


def add_parser(sub: Any, client_args: Any) -> None:
    ab = sub.add_parser("ab", help="A/B experiments: create one, read its report").add_subparsers(
        dest="ab_command", required=True)
    p = ab.add_parser("create", help="create an experiment; prints its id (submit batches with --experiment ID)")
    p.add_argument("--variant", action="append", required=True,
                   help="a variant, control first; `name:weight` sets its share in split mode")
    p.add_argument("--mode", choices=["split", "paired"], default="split")
    p.add_argument("--name", default="")
    client_args(p)
    p.set_defaults(func=_create)
    p = ab.add_parser("report", help="per variant metrics with 95%% intervals and the differences")
    p.add_argument("id")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    p.add_argument("--html", default=None, help="also write the HTML report (with plots) here")
    client_args(p)
    p.set_defaults(func=_report)
    p = ab.add_parser("demo", help="base vs legal, paired, on both eval sets, on the embedded pipeline")
    p.add_argument("--items", type=int, default=None, help="items per eval set (default: all)")
    p.add_argument("--out", default="benchmarks/results", help="where ab_report.json and .html go")
    p.set_defaults(func=_demo)
