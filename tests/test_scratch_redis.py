"""Tests and benchmarks write only to Redis servers they started (tests/scratch_redis.py): no test
or benchmark names the machine's shared Redis or flushes Redis but through `flush`, which empties a
scratch server's database and refuses any other server's."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests import scratch_redis
from tests.pipeline.conftest import service_unavailable, wait_for
from tests.scratch_redis import NAMED_ENV, NotScratchError, ScratchRedis, ScratchRedisError, flush, is_scratch
from yue2_jobs.core.net import free_port

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "tests" / "scratch_redis.py"
# A URL of the shared server on the default port, and a FLUSHDB or FLUSHALL called anywhere.
SHARED_URL = re.compile(r"redis://(127\.0\.0\.1|localhost)(:6379)?/")
FLUSH_CALL = re.compile(r"\.(flushdb|flushall)\(", re.I)


def test_no_test_or_benchmark_names_the_shared_redis_or_flushes_but_through_the_helper() -> None:
    found = []
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        if path in (HELPER, Path(__file__).resolve()):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if SHARED_URL.search(line) or FLUSH_CALL.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "use tests.scratch_redis (a server of the run's own, and its flush):\n" + "\n".join(found)


@pytest.fixture
def scratch() -> Iterator[ScratchRedis]:
    try:
        server = ScratchRedis.start()
    except ScratchRedisError as exc:
        service_unavailable("a Redis server of the test's own", exc)
    yield server
    server.stop()


def _set_theirs(url: str) -> bool:
    try:
        with redis.Redis.from_url(url) as r:
            return bool(r.set("theirs", "keep"))
    except redis.ConnectionError:  # not listening yet
        return False


@pytest.fixture
def foreign(tmp_path: Path) -> Iterator[str]:
    """A Redis server as a developer or CI starts one (no scratch config): someone else's data."""
    if shutil.which("redis-server") is None:
        service_unavailable("redis-server", FileNotFoundError("not installed"))
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/3"
    try:
        wait_for(lambda: _set_theirs(url), timeout=10, what="the other Redis server", interval=0.02)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_flush_empties_a_scratch_servers_database_and_refuses_any_other_server(
        scratch: ScratchRedis, foreign: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAMED_ENV, raising=False)
    with redis.Redis.from_url(scratch.url(2)) as r:
        r.set("ours", "1")
        assert is_scratch(scratch.url(2))
        flush(scratch.url(2))
        assert r.dbsize() == 0
    assert not is_scratch(foreign)
    with pytest.raises(NotScratchError, match="refusing to FLUSHDB"):
        flush(foreign)
    with redis.Redis.from_url(foreign) as r:
        assert r.get("theirs") == b"keep"
        monkeypatch.setenv(NAMED_ENV, foreign)  # named for the tests by whoever runs them: theirs to empty
        flush(foreign)
        assert r.dbsize() == 0


@pytest.mark.slow
def test_a_port_another_server_holds_is_left_to_it(foreign: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between `free_port` and the bind another process may take the port; when that process is a
    Redis server too, it answers on the port, but it is not ours (its pid says so): the start
    takes another port, and the other server's data stays."""
    taken = int(foreign.split(":")[2].split("/")[0])
    ports = iter([taken, free_port()])
    monkeypatch.setattr(scratch_redis, "free_port", lambda: next(ports))
    server = ScratchRedis.start()
    try:
        assert server.port != taken and is_scratch(server.url())
        with redis.Redis.from_url(foreign) as r:
            assert r.get("theirs") == b"keep"
    finally:
        server.stop()
    assert server.proc.poll() is not None and not server.directory.exists()
