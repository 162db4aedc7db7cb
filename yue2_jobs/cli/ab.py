"""`yue2 ab create | report | export-eval | demo`: A/B experiments from the shell (over the HTTP
API), the shipped eval sets as batch files, and the embedded base-vs-legal demo."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from yue2_jobs.cli.common import add_client_args, client
from yue2_jobs.experiments.eval_sets import SHIPPED_SETS, export_eval_sets
from yue2_jobs.experiments.text import format_report


def _arm(text: str) -> dict[str, Any]:
    """`legal` or `legal:3` (weight 3)."""
    name, _, weight = text.partition(":")
    return {"variant": name, "weight": float(weight) if weight else 1.0}


def _create(args: argparse.Namespace) -> None:
    exp = client(args).create_experiment(variants=[_arm(v) for v in args.variant], mode=args.mode, name=args.name)
    print(exp["id"])


def _report(args: argparse.Namespace) -> None:
    c = client(args)
    report = c.experiment_report(args.id)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    if args.html:
        Path(args.html).write_text(c.experiment_report_html(args.id))
        print(f"wrote {args.html}")


def _items(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _export_eval(args: argparse.Namespace) -> None:
    for s in export_eval_sets(Path(args.out), corpora=tuple(args.set or SHIPPED_SETS), items=args.items):
        meta = " ".join(f"--metadata {k}={shlex.quote(v)}" for k, v in s.metadata.items())
        print(f"wrote {s.path} ({s.lines} requests); submit it as: yue2 submit {shlex.quote(str(s.path))} "
              f"--experiment EXP {meta}")


def _demo(args: argparse.Namespace) -> None:
    from yue2_jobs.demo.ab import main

    main(items=args.items, out=Path(args.out))


def add_commands(sub: Any) -> None:
    ab = sub.add_parser("ab", help="A/B experiments: create one, read its report").add_subparsers(
        dest="ab_command", required=True)
    p = ab.add_parser("create", help="create an experiment; prints its id (submit batches with --experiment ID)")
    p.add_argument("--variant", action="append", required=True,
                   help="a variant, control first; `name:weight` sets its share in split mode")
    p.add_argument("--mode", choices=["split", "paired"], default="split",
                   help="split: each line goes to one variant; paired: every line runs on every variant")
    p.add_argument("--name", default="", help="a name shown in the console and the report")
    add_client_args(p)
    p.set_defaults(func=_create)
    p = ab.add_parser("report", help="per variant metrics with 95%% intervals and the differences")
    p.add_argument("id", help="the experiment id (exp_...)")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    p.add_argument("--html", default=None, help="also write the HTML report (with plots) here")
    add_client_args(p)
    p.set_defaults(func=_report)
    p = ab.add_parser("export-eval", help="write the shipped eval sets as batch files (<set>_eval.jsonl, each line "
                      "with its reference); prints how to submit each with its name and domain")
    p.add_argument("--out", default=".", help="the directory to write them to (default: the current one)")
    p.add_argument("--set", action="append", choices=list(SHIPPED_SETS), default=None,
                   help="an eval set to write (repeatable; default: all of them)")
    p.add_argument("--items", type=_items, default=None, help="the first N items of each set (default: all)")
    p.set_defaults(func=_export_eval)
    p = ab.add_parser("demo", help="base vs legal, paired, on both eval sets, on the embedded pipeline")
    p.add_argument("--items", type=_items, default=None, help="items per eval set (default: all)")
    p.add_argument("--out", default="benchmarks/results", help="where ab_report.json and .html go")
    p.set_defaults(func=_demo)
