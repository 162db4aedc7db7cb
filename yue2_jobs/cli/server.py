"""`yue2 migrate | api | health | workers | watchdog | flower | reconcile | demo`: the server side (the
workers have their own program, `yue2-worker`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from typing import Any

from yue2_jobs.cli.common import add_api_url, api_url, settings
from yue2_jobs.core.config import Settings


def _migrate(args: argparse.Namespace) -> None:
    from yue2_jobs.db.migrate import upgrade_head

    url = upgrade_head(args.database_url or settings().resolved_database_url)
    print(f"database at head: {url.split('@')[-1]}")


def _api(args: argparse.Namespace) -> None:
    from yue2_jobs.api.app import create_app
    from yue2_jobs.api.server import serve

    s = settings()
    serve(create_app(s), s, host=args.host, port=args.port)


def _health(args: argparse.Namespace) -> None:
    """Print the API's /healthz; with --wait, poll until it answers ok (exit 1 if it never does)."""
    import httpx

    url = f"{api_url(args)}/healthz"
    deadline = time.monotonic() + (args.wait or 0.0)
    while True:
        try:
            r = httpx.get(url, timeout=5.0)
            body, ok = r.json(), r.status_code == 200
        except (httpx.TransportError, ValueError) as exc:
            body, ok = {"status": f"no answer from {url}: {type(exc).__name__}"}, False
        if ok or time.monotonic() >= deadline:
            print(json.dumps(body))
            if not ok:
                raise SystemExit(1)
            return
        time.sleep(0.2)


def _workers(args: argparse.Namespace) -> None:
    """Each worker's status row: what it serves, how long ago it reported, and why it is down."""
    from datetime import UTC, datetime

    from sqlalchemy import select

    from yue2_jobs.db.models import WorkerProcess
    from yue2_jobs.db.session import as_utc, session_factory
    from yue2_jobs.jobs.capacity import LIVE_WITHIN_S

    s = settings()
    with session_factory(s.resolved_database_url)() as session:
        rows = session.execute(select(WorkerProcess).order_by(WorkerProcess.variant, WorkerProcess.name)).scalars()
        now = datetime.now(UTC)
        for row in rows:
            age = (now - as_utc(row.heartbeat_at)).total_seconds()
            state = ("gone" if age > LIVE_WITHIN_S else f"down: {row.load_error}" if row.load_error
                     else "serving")
            print(f"{row.name}  {row.checkpoint}  pid {row.pid}  reported {age:.0f}s ago  {state}")


def _watchdog(args: argparse.Namespace) -> None:
    from yue2_jobs.checkpoints.watchdog import run

    run(settings(), once=args.once)


# A worker answers Flower's inspect commands from its main thread, also mid-batch (the batch runs in
# the threads pool's one thread); one still loading its model answers only once loaded: give it
# longer than Flower's 1 s default.
INSPECT_TIMEOUT_MS = 5000


def _busy_worker_filter(record: logging.LogRecord) -> bool:
    """Drop Flower's "Inspect method X failed" for a command no worker answered in time: a worker
    still loading its model answers later, and Flower keeps what it last said.
    A failure with a cause (a broker error) still logs."""
    return not (record.msg == "Inspect method %s failed" and len(record.args or ()) == 1)


def _flower(args: argparse.Namespace) -> None:
    s = settings()
    auth = args.basic_auth or s.flower_basic_auth
    if not auth or ":" not in auth:
        raise SystemExit("yue2 flower: basic auth is required: set YUE2_FLOWER_BASIC_AUTH=user:password "
                         "(or --basic-auth user:password)")
    from yue2_jobs.queue import make_celery

    app = make_celery(s)
    # Flower inspects workers with several commands at once, each holding a pooled connection
    # beside its event receiver: the workers' small pool would leave it waiting forever.
    app.conf.broker_pool_limit = 32
    logging.getLogger("flower.inspector").addFilter(_busy_worker_filter)
    argv = ["flower", f"--port={args.port or s.flower_port}", f"--address={args.address}",
            f"--basic-auth={auth}", "--persistent=False", f"--inspect_timeout={INSPECT_TIMEOUT_MS}"]
    app.start(argv)


def _reconcile(args: argparse.Namespace) -> None:
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.jobs.reconciler import holder, reconcile_once, sweep_abandoned_uploads
    from yue2_jobs.queue import make_celery
    from yue2_jobs.storage import storage_from_url
    from yue2_jobs.webhooks.delivery import deliver_due

    s = settings()
    storage = storage_from_url(s.resolved_storage_url, endpoint_url=s.s3_endpoint_url, region=s.s3_region)
    with session_factory(s.resolved_database_url)() as session:
        report = reconcile_once(session, settings=s, celery_app=make_celery(s), storage=storage)
        running = holder(session)  # skipped: the worker that holds the reconciler's lock runs the passes
    swept: dict[str, list[str]] = {}
    if not report.skipped:
        stores = {"outputs": storage}
        if s.resolved_checkpoint_store_url != s.resolved_storage_url:
            stores["checkpoint store"] = storage_from_url(s.resolved_checkpoint_store_url,
                                                          endpoint_url=s.s3_endpoint_url, region=s.s3_region)
        swept = sweep_abandoned_uploads(stores, settings=s)
    sent = deliver_due(session_factory(s.resolved_database_url), settings=s)
    print(json.dumps({**dataclasses.asdict(report), "reconciler": running, "webhook_attempts": sent,
                      "aborted_uploads": swept}))


def _demo(args: argparse.Namespace) -> None:
    from yue2_jobs.demo import main as demo_main

    demo_main(items=args.items)


def _default(field: str) -> Any:
    """A setting's built-in default, for --help (one home: `Settings`)."""
    return Settings.model_fields[field].default


def add_commands(sub: Any) -> None:
    p = sub.add_parser("migrate", help="bring the database to the newest schema (alembic upgrade head)")
    p.add_argument("--database-url", default=None, help="SQLAlchemy URL (default: YUE2_DATABASE_URL, else the "
                   "SQLite file yue2.db in YUE2_HOME, else in .yue2)")
    p.set_defaults(func=_migrate)
    p = sub.add_parser("api", help="serve the HTTP API")
    p.add_argument("--host", default=None, help=f"address to listen on (default: YUE2_API_HOST, else "
                   f"{_default('api_host')})")
    p.add_argument("--port", type=int, default=None, help=f"port (default: YUE2_API_PORT, else {_default('api_port')}; "
                   f"set YUE2_API_PORT rather than --port and the CLI finds the API there too)")
    p.set_defaults(func=_api)
    p = sub.add_parser("health", help="print the API's /healthz (database, broker, storage); exit 1 unless ok")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to keep asking until it answers ok")
    add_api_url(p)
    p.set_defaults(func=_health)
    p = sub.add_parser("workers", help="each worker's status row: what it serves, its last report, why it is down")
    p.set_defaults(func=_workers)
    p = sub.add_parser("watchdog", help="validate new checkpoint versions, activate them, swap the workers")
    p.add_argument("--once", action="store_true", help="one pass, then exit (no pass while another watchdog runs "
                   "them: it says which)")
    p.set_defaults(func=_watchdog)
    p = sub.add_parser("flower", help="serve Flower (Celery monitoring) with basic auth")
    p.add_argument("--port", type=int, default=None, help=f"port Flower listens on (default: YUE2_FLOWER_PORT, "
                   f"else {_default('flower_port')})")
    p.add_argument("--address", default="127.0.0.1", help="address Flower listens on")
    p.add_argument("--basic-auth", default=None, help="user:password (default: YUE2_FLOWER_BASIC_AUTH; with neither, "
                   "Flower does not start)")
    p.set_defaults(func=_flower)
    p = sub.add_parser("reconcile", help="one reconciler pass and the due webhooks; no pass while a worker runs "
                       "the passes (the output's `reconciler` names it)")
    p.set_defaults(func=_reconcile)
    p = sub.add_parser("demo", help="the embedded pipeline demo (`make demo`)")
    p.add_argument("--items", type=int, default=200, help="summary jobs the demo submits")
    p.set_defaults(func=_demo)
