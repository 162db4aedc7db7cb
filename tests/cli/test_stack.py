"""`yue2 stack up` prints everything a client needs: after `eval` of its output, the CLI and the
`openai` client reach the API on the port YUE2_API_PORT names, with the key it created, and no
second address setting pins the URL. Against a real Redis (YUE2_TEST_REDIS, else a scratch
server) and moto on a free port; SQLite for the database."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.stand_in import StandInApi
from tests.scratch_redis import NAMED_ENV, ScratchRedis
from yue2_jobs.cli import main
from yue2_jobs.core.net import free_port

pytestmark = pytest.mark.slow  # starts moto_server (and redis-server unless one is named)


@pytest.fixture
def redis_url() -> Iterator[str]:
    if os.environ.get(NAMED_ENV):
        yield os.environ[NAMED_ENV]  # only pinged: nothing is written to it
        return
    server = ScratchRedis.start()
    try:
        yield server.url(0)
    finally:
        server.stop()


def test_stack_up_prints_what_each_client_needs(stand_in: StandInApi, redis_url: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import openai

    monkeypatch.setenv("YUE2_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("YUE2_STACK_S3_PORT", str(free_port()))
    monkeypatch.setenv("YUE2_API_PORT", str(stand_in.port))  # the one setting that moves the API
    try:
        assert main(["stack", "up", "--database-url", f"sqlite:///{tmp_path / 'db.sqlite'}",
                     "--broker-url", redis_url]) == 0
        out, err = capsys.readouterr()
    finally:
        main(["stack", "down"])
    exports = dict(shlex.split(line)[1].split("=", 1) for line in out.splitlines() if line.startswith("export "))
    assert "YUE2_API_URL" not in exports  # a pinned URL would make moving the API two settings again
    url = f"http://127.0.0.1:{stand_in.port}"
    for said in (f"every yue2 command calls {url} (an exported YUE2_API_PORT moves both)",
                 f'OpenAI(base_url="{url}/v1", api_key=<YUE2_API_KEY>)', "another: `yue2 apikey create --tenant NAME`"):
        assert said in err, err  # seen under `eval`
    assert f"# `yue2 api` listens on 127.0.0.1:{stand_in.port}" in out  # and without it, as comments

    for name, value in exports.items():  # what `eval "$(yue2 stack up)"` does
        monkeypatch.setenv(name, value)
    stand_in.routes[("GET", "/v1/batches/batch_x")] = (200, {
        "id": "batch_x", "object": "batch", "endpoint": "/v1/summarize", "input_file_id": "file_in",
        "completion_window": "24h", "status": "completed", "created_at": 0})
    assert main(["status", "batch_x"]) == 0
    base_url = re.search(r'OpenAI\(base_url="([^"]+)"', err).group(1)  # type: ignore[union-attr]
    batch = openai.OpenAI(base_url=base_url, api_key=exports["YUE2_API_KEY"], max_retries=0).batches.retrieve("batch_x")
    assert batch.status == "completed" and stand_in.paths() == ["GET /v1/batches/batch_x"] * 2
    assert stand_in.keys == [f"Bearer {exports['YUE2_API_KEY']}"] * 2
