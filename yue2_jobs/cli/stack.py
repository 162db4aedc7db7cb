"""`yue2 stack up | down`: the real stack on this machine for a first run.

`up` checks Postgres and Redis (and creates the database if the server has none of that name),
starts a moto S3 server on loopback unless one answers already, creates the bucket, migrates,
creates an API key, and prints the `export` lines that point every `yue2` command, the API and
the workers at all of it: `eval "$(yue2 stack up)"`. Progress goes to stderr, so only the exports
reach `eval`. `down` stops the moto server `up` started; Postgres and Redis are left as they were.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from yue2_jobs.cli.common import settings
from yue2_jobs.core.config import Settings, openai_base_url
from yue2_jobs.errors import Yue2Error

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/yue2"
DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "yue2-local", "AWS_SECRET_ACCESS_KEY": "yue2-local"}  # moto takes any


class StackError(Yue2Error):
    """A part of the local stack is missing or unreachable; the message says how to fix it."""


def _say(text: str) -> None:
    print(f"stack: {text}", file=sys.stderr, flush=True)


def _database(url: str) -> None:
    """Reach the database, creating it when the server has none of that name."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    try:
        with create_engine(url).connect() as conn:
            conn.execute(text("SELECT 1"))
        return
    except OperationalError as exc:
        where, reason = make_url(url).render_as_string(hide_password=True), str(exc.orig).strip()
        if f'database "{make_url(url).database}" does not exist' in reason:
            pass  # created below
        elif "authentication failed" in reason or "no password supplied" in reason or "role" in reason:
            raise StackError(f"Postgres at {where} refused the login ({reason.splitlines()[-1]}): pass a "
                             f"--database-url with a user and password it accepts, or allow that user (pg_hba.conf)"
                             ) from None
        else:
            raise StackError(f"cannot reach Postgres at {where}: {reason.splitlines()[0]}; start it (e.g. "
                             f"`sudo service postgresql start`) or pass --database-url") from None
    name = make_url(url).database
    with create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    _say(f"created database {name}")


def _redis(url: str) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        raise StackError(f"cannot reach Redis at {url}: {exc}; start it (e.g. `redis-server --daemonize yes`) "
                         f"or pass --broker-url") from None


def _s3_answers(endpoint: str) -> bool:
    import httpx

    try:
        httpx.get(endpoint, timeout=1.0)
        return True
    except httpx.TransportError:
        return False


def _moto(port: int, state: Path) -> str:
    """The S3 endpoint: a server already answering on the port, or a moto server started here."""
    endpoint = f"http://127.0.0.1:{port}"
    if _s3_answers(endpoint):
        _say(f"S3 already answers at {endpoint}")
        return endpoint
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if server is None:
        raise StackError("moto_server is not installed: `pip install 'moto[server]'` (make venv installs it)")
    state.mkdir(parents=True, exist_ok=True)
    log = (state / "moto.log").open("ab")
    proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # outlives this command, until `yue2 stack down`
    deadline = time.monotonic() + 30
    while not _s3_answers(endpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise StackError(f"moto did not start on port {port}; see {state / 'moto.log'}")
        time.sleep(0.1)
    (state / "moto.pid").write_text(str(proc.pid))
    _say(f"started moto (S3) at {endpoint}, pid {proc.pid}; `yue2 stack down` stops it")
    return endpoint


def _port_from_env() -> int:
    value = os.environ.get("YUE2_STACK_S3_PORT", "5000")
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise StackError(f"YUE2_STACK_S3_PORT={value!r} is not a port number")
    return int(value)


def _bucket(endpoint: str, bucket: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"])
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
        _say(f"created bucket {bucket}")


def _up(args: argparse.Namespace) -> None:
    from yue2_jobs.auth import create_api_key
    from yue2_jobs.db.migrate import upgrade_head
    from yue2_jobs.db.session import session_factory

    s = settings()
    db = args.database_url or os.environ.get("YUE2_DATABASE_URL") or DEFAULT_DATABASE
    broker = args.broker_url or (s.broker_url if s.broker_url.startswith("redis") else DEFAULT_BROKER)
    _database(db)
    _say("database ok")
    _redis(broker)
    _say("Redis ok")
    port = args.s3_port or _port_from_env()
    endpoint = _moto(port, s.home / "stack")
    _bucket(endpoint, args.bucket)
    upgrade_head(db)
    _say("database migrated")
    with session_factory(db)() as session:
        key = create_api_key(session, tenant=args.tenant, name="yue2 stack up")
    _say(f"API key created for tenant {args.tenant}: in YUE2_API_KEY (another: `yue2 apikey create --tenant NAME`)")
    exports = {"YUE2_DATABASE_URL": db, "YUE2_BROKER_URL": broker, "YUE2_STORAGE_URL": f"s3://{args.bucket}/outputs",
               "YUE2_S3_ENDPOINT_URL": endpoint, **S3_KEYS, "YUE2_API_KEY": key}
    for name, value in exports.items():
        print(f"export {name}={shlex.quote(value)}")
    for line in _client_lines(s):
        _say(line)  # on stderr, seen under `eval`; and as comments in what `eval` runs, seen without it
        print(f"# {line}")


def _client_lines(s: Settings) -> list[str]:
    """Where the API will listen and how each client reaches it. YUE2_API_URL is not exported: the
    CLI derives the URL from YUE2_API_HOST and YUE2_API_PORT, so moving the API stays one setting."""
    try:
        url = s.client_api_url
    except ValueError as exc:  # YUE2_API_PORT=0: the API picks its port
        return [f"{exc}"]
    moved = "set by YUE2_API_URL" if s.api_url else "an exported YUE2_API_PORT moves both"
    return [f"`yue2 api` listens on {s.api_host}:{s.api_port} and every yue2 command calls {url} ({moved})",
            f"the openai client: OpenAI(base_url=\"{openai_base_url(url)}\", api_key=<YUE2_API_KEY>), or "
            f"export OPENAI_BASE_URL={openai_base_url(url)} OPENAI_API_KEY=\"$YUE2_API_KEY\""]


def _down(args: argparse.Namespace) -> None:
    pid_file = settings().home / "stack" / "moto.pid"
    if not pid_file.is_file():
        _say("no moto server started by `yue2 stack up` here")
        return
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
        _say(f"stopped moto (pid {pid})")
    except ProcessLookupError:
        _say(f"moto (pid {pid}) had already exited")
    pid_file.unlink()


def add_commands(sub: Any) -> None:
    p = sub.add_parser("stack", help="the real stack on this machine: `eval \"$(yue2 stack up)\"`, `yue2 stack down`")
    cmds = p.add_subparsers(dest="stack_command", required=True)
    up = cmds.add_parser("up", help="check Postgres and Redis, start moto (S3), create the bucket, migrate, create "
                                    "a key; print export lines")
    up.add_argument("--database-url", default=None,
                    help=f"Postgres URL; the database is created if missing (default: YUE2_DATABASE_URL, else "
                         f"{DEFAULT_DATABASE})")
    up.add_argument("--broker-url", default=None,
                    help=f"Redis URL (default: YUE2_BROKER_URL when it is Redis, else {DEFAULT_BROKER})")
    up.add_argument("--s3-port", type=int, default=None,
                    help="loopback port of the moto S3 server (default: YUE2_STACK_S3_PORT, else 5000)")
    up.add_argument("--bucket", default="yue2", help="the S3 bucket outputs go to")
    up.add_argument("--tenant", default="me", help="the tenant of the API key it creates")
    up.set_defaults(func=_up)
    down = cmds.add_parser("down", help="stop the moto server `yue2 stack up` started")
    down.set_defaults(func=_down)
