"""A Postgres cluster of a test's own: `initdb` into a temporary directory as the postgres user,
the server on a free 127.0.0.1 port, data thrown away after. A test may stop, restart or break it
at will: no one else has its address, so the machine's Postgres (and everyone connected to it)
never notices. The distributed test's services host runs one too (tests/distributed/services.py,
inside a network namespace), from the same `init_data_dir` and `server_argv`.

Needs root (the data directory belongs to the postgres user, and only root becomes it without a
password) and PostgreSQL's server binaries; `PrivatePostgresError` says which is missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from yue2_jobs.core.net import free_port
from yue2_jobs.core.procs import die_with_parent

START_S = 60.0  # initdb'd clusters answer in about a second; a loaded 2-core CI host, within this
STOP_S = 60.0  # a fast shutdown ends every session at once; the checkpoint after it takes the rest


class PrivatePostgresError(RuntimeError):
    """No private cluster: not root, PostgreSQL missing, or the server would not start."""


def pg_bin(name: str) -> str:
    """The newest installed PostgreSQL's `name` (Debian keeps them off PATH, one folder a version)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise PrivatePostgresError(f"PostgreSQL's {name} is not installed (looked in /usr/lib/postgresql/*/bin)")
    return found[-1]


def init_data_dir(directory: Path) -> Path:
    """`initdb` a cluster into `directory`/data as the postgres user (trust authentication: only this
    machine's loopback, or the test's own namespaces, can reach it); returns the data directory.
    `directory` must be outside pytest's root-only tmp tree, where the postgres user cannot go."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        raise PrivatePostgresError("running initdb as the postgres user needs root and runuser")
    shutil.chown(directory, "postgres", "postgres")
    data = directory / "data"
    done = subprocess.run(["runuser", "-u", "postgres", "--", pg_bin("initdb"), "-D", str(data), "-U", "postgres",
                           "--auth=trust", "--no-sync", "-E", "UTF8"], capture_output=True, text=True)
    if done.returncode != 0:
        raise PrivatePostgresError(f"initdb failed: {done.stderr.strip()[-500:]}")
    return data


def server_argv(data: Path, *, host: str, port: int, socket_dir: Path) -> list[str]:
    """The postmaster's command line: durability off (the data is thrown away), room for every
    worker's pool."""
    return [pg_bin("postgres"), "-D", str(data), "-c", f"listen_addresses={host}", "-c", f"port={port}",
            "-c", f"unix_socket_directories={socket_dir}", "-c", "fsync=off", "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off", "-c", "max_connections=200"]


def is_ready(host: str, port: int) -> bool:
    return subprocess.run([pg_bin("pg_isready"), "-q", "-h", host, "-p", str(port)]).returncode == 0


class PrivatePostgres:
    """One cluster on 127.0.0.1: `create` it, `stop` and `start` it (same port, same data), `destroy` it."""

    def __init__(self, directory: Path, data: Path) -> None:
        self.directory = directory
        self.data = data
        self.port = free_port()
        self.log = directory / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def create(cls) -> PrivatePostgres:
        directory = Path(tempfile.mkdtemp(prefix="yue2-pg-"))
        try:
            server = cls(directory, init_data_dir(directory))
            server.start()
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return server

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Start the server and return once it accepts connections. Run as the postgres user directly
        (not under runuser, which would stand between our signals and the postmaster); SIGINT, a
        fast shutdown, reaches it if this process dies first."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.proc = subprocess.Popen(server_argv(self.data, host="127.0.0.1", port=self.port,
                                                 socket_dir=self.directory),
                                     user="postgres", group="postgres", extra_groups=[], stdin=subprocess.DEVNULL,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=lambda: die_with_parent(signal.SIGINT))
        deadline = time.monotonic() + START_S
        while not is_ready("127.0.0.1", self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-800:]
                raise PrivatePostgresError(f"postgres did not start on 127.0.0.1:{self.port}:\n{tail}")
            time.sleep(0.05)  # pg_isready answers at once; this paces the polling

    def stop(self) -> None:
        """A fast shutdown (SIGINT: every session is ended, then a checkpoint); waits for the postmaster."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGQUIT)  # immediate shutdown: its children go with it
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
