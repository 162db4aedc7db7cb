"""`yue2 submit | retry | wait | results` against a stand-in API: names and metadata on a batch,
retry_failed, a job's wait line, the error file alone, and a reader that leaves early (`| head`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.stand_in import StandInApi
from yue2_jobs.cli import SIGPIPE_EXIT, main

COUNTS = {"total": 2, "completed": 0, "failed": 0}
OUTPUT = b'{"custom_id": "a", "response": {"status_code": 200}}\n'
ERRORS = b'{"custom_id": "b", "error": {"code": "input_too_long"}}\n'


def _run(api: StandInApi, *argv: str) -> int:
    return main([*argv, "--api-url", api.url, "--api-key", "k"])


def test_submit_names_the_batch_and_sets_metadata(stand_in: StandInApi, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    stand_in.routes[("POST", "/v1/files")] = (200, {"id": "file_in"})
    stand_in.routes[("POST", "/v1/batches")] = (200, {"id": "batch_new", "status": "validating",
                                                      "request_counts": COUNTS})
    path = tmp_path / "in.jsonl"
    path.write_text('{"custom_id": "a", "body": {"input": "x"}}\n')
    assert _run(stand_in, "submit", str(path), "--name", "nightly", "--metadata", "owner=ops",
                "--metadata", "query=a=b") == 0
    assert capsys.readouterr().out == "batch_new\n"
    body = json.loads(stand_in.requests[-1][2])
    assert body["metadata"] == {"owner": "ops", "query": "a=b", "name": "nightly"}


@pytest.mark.parametrize(("argv", "says"), [
    (["--metadata", "owner"], "--metadata wants KEY=VALUE, got 'owner'"),
    (["--metadata", "=x"], "--metadata wants KEY=VALUE, got '=x'"),
    (["--metadata", "a=1", "--metadata", "a=2"], "--metadata a is given twice"),
    (["--name", "n", "--metadata", "name=m"], "--name and --metadata name=... both name the batch"),
])
def test_bad_metadata_is_refused_before_the_upload(stand_in: StandInApi, tmp_path: Path, argv: list[str],
                                                   says: str) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("{}\n")
    with pytest.raises(SystemExit, match=says):
        _run(stand_in, "submit", str(path), *argv)
    assert stand_in.requests == []


def test_retry_runs_the_failed_lines_again(stand_in: StandInApi, capsys: pytest.CaptureFixture[str]) -> None:
    stand_in.routes[("POST", "/v1/batches/batch_old/retry_failed")] = (200, {
        "id": "batch_retry", "status": "validating", "request_counts": COUNTS,
        "metadata": {"retry_of": "batch_old"}})
    assert _run(stand_in, "retry", "batch_old") == 0
    captured = capsys.readouterr()
    assert captured.out == "batch_retry\n" and "2 requests of batch_old again" in captured.err
    assert stand_in.paths() == ["POST /v1/batches/batch_old/retry_failed"]


def test_retry_of_a_running_batch_says_why(stand_in: StandInApi, capsys: pytest.CaptureFixture[str]) -> None:
    stand_in.routes[("POST", "/v1/batches/batch_old/retry_failed")] = (409, {"error": {
        "message": "batch batch_old is in_progress; retry it once it ends", "type": "conflict"}})
    assert _run(stand_in, "retry", "batch_old") == 2
    assert "HTTP 409: batch batch_old is in_progress" in capsys.readouterr().err


def _ended_batch(api: StandInApi, *, error_file: bool = True) -> None:
    api.routes[("GET", "/v1/batches/batch_x")] = (200, {
        "id": "batch_x", "status": "completed", "request_counts": COUNTS, "output_file_id": "file_out",
        "error_file_id": "file_err" if error_file else None})
    api.routes[("GET", "/v1/files/file_out/content")] = (200, OUTPUT)
    api.routes[("GET", "/v1/files/file_err/content")] = (200, ERRORS)


@pytest.mark.parametrize(("flags", "written"), [([], OUTPUT), (["--errors"], OUTPUT + ERRORS),
                                                (["--errors-only"], ERRORS)])
def test_results_the_outputs_the_errors_or_both(stand_in: StandInApi, capsysbinary: pytest.CaptureFixture[bytes],
                                                flags: list[str], written: bytes) -> None:
    _ended_batch(stand_in)
    assert _run(stand_in, "results", "batch_x", *flags) == 0
    assert capsysbinary.readouterr().out == written


def test_errors_only_of_a_batch_without_errors_writes_nothing(stand_in: StandInApi,
                                                              capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    _ended_batch(stand_in, error_file=False)
    assert _run(stand_in, "results", "batch_x", "--errors-only") == 0
    captured = capsysbinary.readouterr()
    assert captured.out == b"" and b"batch_x: no error file: no line failed" in captured.err


def test_errors_only_of_a_job_is_its_record_if_it_failed(stand_in: StandInApi,
                                                         capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    failed = {"id": "job_f", "status": "failed", "error": {"code": "input_too_long"}}
    stand_in.routes[("GET", "/v1/jobs/job_f")] = (200, failed)
    stand_in.routes[("GET", "/v1/jobs/job_ok")] = (200, {"id": "job_ok", "status": "succeeded", "error": None})
    assert _run(stand_in, "results", "job_ok", "--errors-only") == 0
    assert capsysbinary.readouterr().out == b""
    assert _run(stand_in, "results", "job_f", "--errors-only") == 0
    assert json.loads(capsysbinary.readouterr().out) == failed


def test_errors_and_errors_only_are_one_choice(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["results", "batch_x", "--errors", "--errors-only"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def _to_a_closed_pipe(argv: list[str], *, buffered: bool) -> subprocess.CompletedProcess[bytes]:
    """`yue2 ARGV | head` where head has exited already: every write to standard output fails (at
    once, or at the last flush when the output is buffered)."""
    env = {k: v for k, v in os.environ.items() if k not in ("YUE2_DEBUG", "PYTHONUNBUFFERED")}
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "yue2_jobs", *argv], stdout=write, stderr=subprocess.PIPE,
                              timeout=60, check=False, env=env if buffered else {**env, "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(write)


@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("command", ["results", "status"])
def test_a_reader_that_left_ends_the_command_quietly(stand_in: StandInApi, command: str, buffered: bool) -> None:
    _ended_batch(stand_in)
    stand_in.routes[("GET", "/v1/files/file_out/content")] = (200, OUTPUT * 20_000)  # past any pipe buffer
    done = _to_a_closed_pipe([command, "batch_x", "--api-url", stand_in.url, "--api-key", "k"], buffered=buffered)
    assert done.stderr == b"" and done.returncode == SIGPIPE_EXIT, done.stderr.decode()


def _break_a_pipe_of_our_own(*_: Any, **__: Any) -> dict[str, Any]:
    """What a command writing to a child process that died meets: a BrokenPipeError not from stdout."""
    read, write = os.pipe()
    os.close(read)
    try:
        os.write(write, b"x")
    finally:
        os.close(write)
    raise AssertionError("a write to a pipe without a reader succeeded")


def test_a_broken_pipe_not_our_output_is_a_failure(stand_in: StandInApi, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from yue2_jobs.client import Client

    monkeypatch.setattr(Client, "status", _break_a_pipe_of_our_own)
    monkeypatch.delenv("YUE2_DEBUG", raising=False)
    assert _run(stand_in, "status", "batch_x") == 2  # not SIGPIPE_EXIT: our output's reader is still there
    assert "yue2: error:" in capsys.readouterr().err
    monkeypatch.setenv("YUE2_DEBUG", "1")
    with pytest.raises(BrokenPipeError):
        _run(stand_in, "status", "batch_x")


class _FakeClient:
    """`Client.wait` as the API answers it: the states in order, the last one terminal."""

    def __init__(self, states: list[dict[str, Any]]) -> None:
        self.states = states

    def wait(self, object_id: str, *, poll_s: float, timeout_s: float | None, on_update: Any) -> dict[str, Any]:
        for state in self.states:
            on_update({"id": object_id, **state})
        return {"id": object_id, **self.states[-1]}


def test_wait_for_a_job_shows_its_status_and_time(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from yue2_jobs.cli import jobs

    states = [{"status": s} for s in ("queued", "queued", "running", "succeeded")]
    monkeypatch.setattr(jobs, "client", lambda args: _FakeClient(states))
    assert main(["wait", "job_x", "--api-key", "k"]) == 0
    captured = capsys.readouterr()
    # Not a terminal: one line per change of status (a log keeps each once), never a job counter.
    assert captured.err.splitlines() == ["job_x: queued, 0s", "job_x: running, 0s", "job_x: succeeded, 0s"]
    assert json.loads(captured.out)["status"] == "succeeded"


def test_wait_for_a_batch_draws_no_bar_before_it_knows_the_total(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from yue2_jobs.cli import jobs

    states = [{"status": "in_progress", "request_counts": {"total": 4, "completed": 1, "failed": 0}},
              {"status": "completed", "request_counts": {"total": 4, "completed": 3, "failed": 1}}]
    monkeypatch.setattr(jobs, "client", lambda args: _FakeClient(states))
    assert main(["wait", "batch_abc", "--api-key", "k"]) == 0
    drawn = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert drawn and all("/4 [" in line for line in drawn if line.strip()), drawn  # never `0req [..., ?req/s]`
    assert sum("completed" in line for line in drawn) == 1 and "4/4" in drawn[-1]
