"""One address setting: the CLI calls the API where `yue2 api` binds it (YUE2_API_HOST,
YUE2_API_PORT) unless YUE2_API_URL or --api-url says otherwise, takes that URL with or without /v1,
and every "no answer" names the URL it tried."""

from __future__ import annotations

import json

import pytest

from tests.cli.stand_in import StandInApi
from yue2_jobs.cli import build_parser, main
from yue2_jobs.client import ApiError, Client
from yue2_jobs.core.config import Settings, normalize_api_url, openai_base_url

JOB = {"id": "job_x", "status": "queued"}


def _status(argv: list[str] | None = None) -> int:
    return main(["status", "job_x", "--api-key", "k", *(argv or [])])


def test_moving_the_api_is_one_setting(stand_in: StandInApi, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    stand_in.routes[("GET", "/v1/jobs/job_x")] = (200, JOB)
    monkeypatch.setenv("YUE2_API_PORT", str(stand_in.port))  # what `yue2 api` binds, and nothing else
    assert _status() == 0
    assert stand_in.paths() == ["GET /v1/jobs/job_x"] and json.loads(capsys.readouterr().out) == JOB
    monkeypatch.setenv("YUE2_API_HOST", "0.0.0.0")  # an API on every address is reached on loopback
    assert _status() == 0 and len(stand_in.requests) == 2


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_the_url_works_with_or_without_v1(stand_in: StandInApi, monkeypatch: pytest.MonkeyPatch,
                                          suffix: str) -> None:
    stand_in.routes[("GET", "/v1/jobs/job_x")] = (200, JOB)
    monkeypatch.setenv("YUE2_API_PORT", "9")  # the URL given wins over where `yue2 api` would bind
    assert _status(["--api-url", stand_in.url + suffix]) == 0
    monkeypatch.setenv("YUE2_API_URL", stand_in.url + suffix)
    assert _status() == 0
    assert stand_in.paths() == ["GET /v1/jobs/job_x"] * 2  # never /v1/v1/...


def test_one_rule_for_the_clients_url() -> None:
    assert Settings(api_port=8013).client_api_url == "http://127.0.0.1:8013"
    assert Settings(api_host="::", api_port=8013).client_api_url == "http://127.0.0.1:8013"
    assert Settings(api_host="::1").client_api_url == "http://[::1]:8000"
    assert Settings(api_url="http://api.internal:80/v1/", api_port=8013).client_api_url == "http://api.internal:80"
    assert normalize_api_url("127.0.0.1:8013/v1") == "http://127.0.0.1:8013"
    assert openai_base_url("http://127.0.0.1:8013") == openai_base_url("http://127.0.0.1:8013/v1/") \
        == "http://127.0.0.1:8013/v1"
    assert Client("http://127.0.0.1:8013/v1", "k").base_url == "http://127.0.0.1:8013"
    with pytest.raises(ValueError, match="YUE2_API_URL='ftp://x' is not the API's URL"):
        Settings(api_url="ftp://x")
    with pytest.raises(ValueError, match=r"YUE2_API_PORT=0 .* set YUE2_API_URL"):
        _ = Settings(api_port=0).client_api_url


def test_a_port_zero_api_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YUE2_API_PORT", "0")
    with pytest.raises(SystemExit, match="set YUE2_API_URL"):
        _status()


def test_help_shows_the_url_it_will_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YUE2_API_PORT", "8013")
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command in ("status", "health", "wait", "retry"):
        assert "now http://127.0.0.1:8013)" in " ".join(sub[command].format_help().split()), command


def test_health_names_the_url_it_tried(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("YUE2_API_PORT", "9")  # port 9 (discard) on loopback: nothing listens there in tests
    with pytest.raises(SystemExit) as exc:
        main(["health"])
    assert exc.value.code == 1
    assert json.loads(capsys.readouterr().out) == {"status": "no answer from http://127.0.0.1:9/healthz: ConnectError"}


def test_wait_names_the_url_it_tried(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("YUE2_API_PORT", "9")
    assert main(["wait", "job_x", "--api-key", "k"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("yue2: error: cannot reach the API at http://127.0.0.1:9 (GET /v1/jobs/job_x: ConnectError)")
    assert "yue2 api" in err and "YUE2_API_PORT" in err and err.count("\n") == 1


def test_something_else_at_the_url_is_named(stand_in: StandInApi) -> None:
    stand_in.routes[("GET", "/v1/jobs/job_x")] = (404, b"<html>Not Found</html>")  # not the API's error shape
    with pytest.raises(ApiError) as err:
        Client(stand_in.url, "k").job("job_x")
    assert str(err.value) == (f"HTTP 404: <html>Not Found</html> (from GET {stand_in.url}/v1/jobs/job_x; is the yue2 "
                              f"API at {stand_in.url}?)")
