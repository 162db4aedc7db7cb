"""A Redis server of a test run's own (or a benchmark's): `redis-server` on a free 127.0.0.1 port,
data in memory only, stopped when the run ends, and by the kernel if the run is killed outright
(PR_SET_PDEATHSIG). No one else has its address, so its databases are the run's to fill and
empty, and two runs on one machine (CI and a developer, say) never meet. Tests never empty the
machine's shared Redis (`make test` used to FLUSHDB its database 3 and others).

`flush` is the one FLUSHDB of tests and benchmarks. It empties a database only on a scratch server
(its config file's name, which `INFO` reports, says so: a server anyone else started has
another) or on the one database whoever started the run named for it (`YUE2_TEST_REDIS`, a
benchmark's `--redis`); anything else is refused, so a URL gone astray fails its test instead of
wiping someone's data.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from yue2_jobs.core.net import free_port
from yue2_jobs.core.procs import die_with_parent

# The database the pipeline tests use instead of a scratch server's, when set (and so empty):
# redis://HOST:PORT/N. The databases they flush besides it are still the scratch server's.
NAMED_ENV = "YUE2_TEST_REDIS"
CONFIG_NAME = "yue2-scratch-redis.conf"  # what tells a scratch server from any other
START_S = 10.0  # redis-server answers within milliseconds; a loaded 2-core CI host, within this


class ScratchRedisError(RuntimeError):
    """No scratch server: redis-server is missing or would not start; the message says why."""


class NotScratchError(RuntimeError):
    """A flush of a Redis database this run neither created nor was given."""


@dataclass
class ScratchRedis:
    proc: subprocess.Popen[bytes]
    port: int
    directory: Path

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    @classmethod
    def start(cls, *, tries: int = 5) -> ScratchRedis:
        """A new server, answering. A port another process takes between `free_port` and the
        server's bind fails that server's start; the next try takes another port."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise ScratchRedisError("redis-server is not installed (Debian: apt install redis-server)")
        directory = Path(tempfile.mkdtemp(prefix="yue2-redis-"))
        why = ""
        for _ in range(tries):
            port = free_port()
            config = directory / CONFIG_NAME
            config.write_text(f'bind 127.0.0.1\nport {port}\nsave ""\nappendonly no\ndir {directory}\n'
                              f"logfile {directory / 'redis.log'}\ndaemonize no\n")
            # Its own session: a Ctrl-C at the terminal must not stop it before the tests' clean-up.
            proc = subprocess.Popen([binary, str(config)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
            server = cls(proc=proc, port=port, directory=directory)
            if server._answers():
                return server
            server._end()
            log = directory / "redis.log"
            lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            why = lines[-1] if lines else f"exit status {proc.returncode}"
        shutil.rmtree(directory, ignore_errors=True)
        raise ScratchRedisError(f"redis-server did not start on 127.0.0.1 in {tries} tries: {why}")

    def _answers(self) -> bool:
        """True once the server answers on its port as this process (not another that took the
        port: its pid in INFO is the one we started); False if it exits or stays silent."""
        import redis

        deadline = time.monotonic() + START_S
        with redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1) as r:
            while self.proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(redis.ConnectionError):
                    return int(r.info("server")["process_id"]) == self.proc.pid
                time.sleep(0.02)  # not listening yet
        return False

    def _end(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # no persistence configured: it exits at once
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def stop(self) -> None:
        self._end()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def benchmark_redis(named: str | None) -> Iterator[str]:
    """A benchmark's Redis database, empty: by default database 0 of a scratch server started here
    and stopped after; else `named`, its `--redis`, which its user gives it to empty (flushed
    before and after)."""
    if named:
        flush(named, named=True)
        try:
            yield named
        finally:
            flush(named, named=True)
        return
    server = ScratchRedis.start()
    try:
        yield server.url(0)
    finally:
        server.stop()


def is_scratch(url: str) -> bool:
    """Whether the server at `url` is a scratch server (any run's: a test that hands its server's
    URL to a benchmark process lets that process flush it)."""
    import redis

    with redis.Redis.from_url(url, socket_connect_timeout=2) as r:
        return Path(str(r.info("server").get("config_file", ""))).name == CONFIG_NAME


def flush(url: str, *, named: bool = False) -> None:
    """FLUSHDB on `url`'s database, if it is a scratch server's, the one `YUE2_TEST_REDIS` names,
    or (`named`) one a benchmark's user named; refused (NotScratchError) otherwise."""
    import redis

    if not (named or url == os.environ.get(NAMED_ENV) or is_scratch(url)):
        raise NotScratchError(f"refusing to FLUSHDB {url}: not a Redis server this run started "
                              f"(tests.scratch_redis) nor the database {NAMED_ENV} names")
    with redis.Redis.from_url(url) as r:
        r.flushdb()
