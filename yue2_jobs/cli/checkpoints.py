"""`yue2 checkpoints publish | list | history | validate | activate | rollback`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from yue2_jobs.checkpoints import registry
from yue2_jobs.cli.common import settings


def _context() -> tuple[Any, Any, Any]:
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.storage import storage_from_url

    s = settings()
    store = storage_from_url(s.resolved_checkpoint_store_url, endpoint_url=s.s3_endpoint_url, region=s.s3_region)
    return s, session_factory(s.resolved_database_url)(), store


def _describe(row: Any) -> str:
    when = row.activated_at or row.validated_at or row.created_at
    said = [w for w, on in (("expect-change", row.expect_change), ("tokenizer-change", row.tokenizer_change)) if on]
    extra = f"  [{', '.join(said)}]" if said else ""
    extra += f"  ({row.error})" if row.error else (f"  ({row.report})" if row.report else "")
    return f"{row.variant}@{row.version}  {row.state:<10} {when:%Y-%m-%d %H:%M:%S}  {row.source or row.uri}{extra}"


def _seed(s: Any, session: Any, store: Any, variant: str) -> None:
    """The variant's starting directory becomes its first version before anything else is (rollback's target)."""
    if variant in s.checkpoints:
        seeded = registry.ensure_seed(session, store=store, store_url=s.resolved_checkpoint_store_url,
                                      variant=variant, directory=Path(s.checkpoints[variant]))
        if seeded is not None:
            print(f"registered {variant}@{seeded.version} ({seeded.source}) as {variant}'s first version "
                  f"({seeded.state}): `yue2 checkpoints rollback {variant}` returns to it")


def _publish(args: argparse.Namespace) -> None:
    s, session, store = _context()
    with session:
        _seed(s, session, store, args.variant)
        row = registry.publish(session, store=store, store_url=s.resolved_checkpoint_store_url,
                               directory=Path(args.directory), variant=args.variant,
                               expect_change=args.expect_change, tokenizer_change=args.tokenizer_change)
        print(f"published {row.variant}@{row.version} (staged) at {row.uri}")
        if args.activate:
            _validate_and_activate(s, session, store, row)


def _validate_and_activate(s: Any, session: Any, store: Any, row: Any) -> None:
    from yue2_jobs.checkpoints.validate import validate_version

    _seed(s, session, store, row.variant)
    if row.validated_at is None:
        if validate_version(session, row, store=store, settings=s) is None:
            raise SystemExit(f"yue2: {row.variant}@{row.version} failed validation: {row.error}")
        print(f"{row.variant}@{row.version} passed validation: {row.report}")
    previous = registry.activate(session, row)
    print(f"active: {row.variant}@{row.version}" + (f" (was {previous.version})" if previous else ""))


def _list(args: argparse.Namespace) -> None:
    _, session, _ = _context()
    with session:
        for row in registry.list_versions(session, args.variant):
            print(_describe(row))


def _history(args: argparse.Namespace) -> None:
    _, session, _ = _context()
    with session:
        for a in registry.history(session, args.variant):
            until = f"{a.ended_at:%Y-%m-%d %H:%M:%S}" if a.ended_at else "now" + " " * 16
            print(f"{a.variant}@{a.version}  {a.started_at:%Y-%m-%d %H:%M:%S} .. {until}  {a.how}")


def _validate(args: argparse.Namespace) -> None:
    from yue2_jobs.checkpoints.validate import validate_version

    s, session, store = _context()
    with session:
        _seed(s, session, store, args.variant)
        row = registry.get(session, variant=args.variant, version=args.version)
        ok = validate_version(session, row, store=store, settings=s)
        print(f"{row.variant}@{row.version}: " + (f"passed: {row.report}" if ok else f"failed: {row.error}"))
        if not ok:
            raise SystemExit(1)


def _activate(args: argparse.Namespace) -> None:
    s, session, store = _context()
    with session:
        _validate_and_activate(s, session, store, registry.get(session, variant=args.variant, version=args.version))


def _rollback(args: argparse.Namespace) -> None:
    s, session, store = _context()
    with session:
        _seed(s, session, store, args.variant)  # a deployment no watchdog pass has seeded yet
        row = registry.rollback(session, args.variant)
        print(f"rolled back: {row.variant}@{row.version} is active again")


def add_commands(sub: Any) -> None:
    p = sub.add_parser("checkpoints", help="publish, list, validate, activate and roll back checkpoint versions")
    cmds = p.add_subparsers(dest="checkpoints_command", required=True)
    c = cmds.add_parser("publish", help="upload a checkpoint directory as a new staged version (manifest last)")
    c.add_argument("directory", help="a local checkpoint directory (config, weights, tokenizer, manifest)")
    c.add_argument("--variant", required=True, help="the variant it becomes a version of (base, legal, ...)")
    c.add_argument("--activate", action="store_true", help="validate it and make it active now")
    c.add_argument("--expect-change", action="store_true",
                   help="it is meant to decode differently from the serving version: validation scores it on the "
                   "variant's eval set (at most YUE2_VALIDATION_MAX_ROUGE_DROP ROUGE-L points under the serving "
                   "version) instead of asking its outputs to stay close to the serving version's")
    c.add_argument("--tokenizer-change", action="store_true",
                   help="it brings another tokenizer than the serving version's (refused otherwise)")
    c.set_defaults(func=_publish)
    c = cmds.add_parser("list", help="every version, its state, where it came from and its validation")
    c.add_argument("--variant", default=None, help="only this variant's versions (default: every variant)")
    c.set_defaults(func=_list)
    c = cmds.add_parser("history", help="what served when: each activation, seed and rollback")
    c.add_argument("--variant", default=None, help="only this variant (default: every variant)")
    c.set_defaults(func=_history)
    for name, func, text in (("validate", _validate, "check files, weights, outputs, and closeness to the "
                              "serving version"),
                             ("activate", _activate, "validate if needed, then make it the active version")):
        c = cmds.add_parser(name, help=text)
        c.add_argument("variant", help="the variant, e.g. base")
        c.add_argument("version", help="its version, as `yue2 checkpoints list` shows it")
        c.set_defaults(func=func)
    c = cmds.add_parser("rollback", help="re-activate the version that was active before the current one")
    c.add_argument("variant", help="the variant to roll back, e.g. base")
    c.set_defaults(func=_rollback)
