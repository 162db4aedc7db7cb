"""`yue2 apikey [create] --tenant T [--expires-in-days N] | list [--tenant T] | revoke KEY_ID`.

A revocation is announced on Redis, and every API process drops the key from its cache within a
second (see `yue2_jobs.api.revocations`)."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from yue2_jobs.cli.common import settings


def _sessions() -> Any:
    from yue2_jobs.db.session import session_factory

    return session_factory(settings().resolved_database_url)


def _create(args: argparse.Namespace) -> None:
    from yue2_jobs.auth import create_api_key
    from yue2_jobs.db.session import utcnow

    if not args.tenant:
        raise SystemExit("yue2 apikey create: --tenant is required")
    if args.expires_in_days is not None and args.expires_in_days <= 0:
        raise SystemExit("yue2 apikey create: --expires-in-days must be positive")
    expires = utcnow() + timedelta(days=args.expires_in_days) if args.expires_in_days else None
    with _sessions()() as session:
        print(create_api_key(session, tenant=args.tenant, name=args.name, expires_at=expires))


def _list(args: argparse.Namespace) -> None:
    from yue2_jobs.auth import list_api_keys

    with _sessions()() as session:
        keys = list_api_keys(session, tenant=args.tenant)
    for k in keys:
        state = "revoked" if k.revoked_at else "active"
        print(json.dumps({"id": k.id, "tenant": k.tenant, "prefix": k.prefix, "name": k.name, "state": state,
                          "created_at": k.created_at.isoformat(),
                          "expires_at": k.expires_at.isoformat() if k.expires_at else None,
                          "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None}))


def _revoke(args: argparse.Namespace) -> None:
    from yue2_jobs.api.revocations import announce
    from yue2_jobs.auth import revoke_api_key

    with _sessions()() as session:
        digest = revoke_api_key(session, key_id=args.key_id)
    try:
        told = announce(settings().broker_url, digest)
        print(f"revoked {args.key_id}; {told} API process(es) told")
    except Exception as exc:  # Redis down: the API processes lost their subscription too and cache briefly
        print(f"revoked {args.key_id}; could not announce it on Redis ({type(exc).__name__}): API processes "
              f"without a live subscription keep keys cached under a second")


def _key_options(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--tenant", required=required, default=None,
                   help="the tenant the key acts for: it sees only that tenant's jobs and batches")
    p.add_argument("--name", default="", help="a label for the key, shown by `yue2 apikey list`")
    p.add_argument("--expires-in-days", type=float, default=None, help="days until the key stops working "
                   "(default: never)")


def add_commands(sub: Any) -> None:
    p = sub.add_parser("apikey", help="API keys: create (the default; printed once), list, revoke")
    _key_options(p, required=False)
    p.set_defaults(func=_create)
    actions = p.add_subparsers(dest="apikey_action")
    c = actions.add_parser("create", help="create a key for a tenant; the secret is printed once")
    _key_options(c, required=True)
    c.set_defaults(func=_create)
    ls = actions.add_parser("list", help="keys as JSON lines: ids and prefixes, never secrets")
    ls.add_argument("--tenant", default=None, help="only this tenant's keys (default: every tenant)")
    ls.set_defaults(func=_list)
    r = actions.add_parser("revoke", help="revoke a key (by its id, from `list`); applies within a second")
    r.add_argument("key_id", help="the key's id (key_...), as `yue2 apikey list` shows it")
    r.set_defaults(func=_revoke)
