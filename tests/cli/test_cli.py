"""The `yue2` command as a newcomer meets it: every argument explains itself (with its default and
units), and a failing command prints one line that says what to do, never a traceback."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from yue2_jobs.cli import build_parser, main


def _arguments(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser,
                                                                            argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _arguments(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, parser, action


def test_every_argument_has_help_and_shows_its_default() -> None:
    missing, no_default = [], []
    for path, parser, action in _arguments(build_parser(train_arguments=True), "yue2"):
        name = f"{path} {'/'.join(action.option_strings) or action.dest}"
        if not action.help:
            missing.append(name)
            continue
        default = action.default
        if action.option_strings and not (default is None or default is False or default == ""):
            # What --help prints for the option must name its default (0 included).
            text = " ".join(parser.format_help().split())
            rest = text[text.rfind(action.option_strings[-1] + " ") + len(action.option_strings[-1]):]  # after usage
            following = re.search(r" -{1,2}[a-z][\w-]* ", rest)  # where the next option's entry starts
            if "default" not in rest[: following.start() if following else None]:
                no_default.append(name)
    assert not missing, f"arguments without help: {missing}"
    assert not no_default, f"defaults not shown: {no_default}"


ENV_NAME = re.compile(r"\$?\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")  # YUE2_API_PORT, $YUE2_API_KEY


def vague_defaults(parser: argparse.ArgumentParser, path: str = "yue2") -> list[str]:
    """Each `default: ...` that the --help of `parser` or of any subcommand prints for an argument and
    that gives no value: empty, `None`, or only environment variables (`default: YUE2_FLOWER_PORT`)."""
    found = []
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += vague_defaults(sub, f"{path} {name}")
        elif action.help:
            text = " ".join(formatter._expand_help(action).split())  # as --help prints it, %(default)s filled in
            for said in re.findall(r"default: ([^)]*)", text):
                rest = re.sub(r"[\s,;:.]+", "", ENV_NAME.sub("", said))  # what is said besides variable names
                if not rest or said.strip() == "None" or "%(" in said:
                    found.append(f"{path} {'/'.join(action.option_strings) or action.dest}: default: {said}")
    return found


def test_every_help_gives_each_default_a_value() -> None:
    assert vague_defaults(build_parser(train_arguments=True)) == []


def test_a_default_that_names_only_a_variable_is_caught() -> None:
    parser = argparse.ArgumentParser(prog="yue2")
    sub = parser.add_subparsers().add_parser("flower")
    sub.add_argument("--port", help="default: YUE2_FLOWER_PORT")
    sub.add_argument("--address", default="127.0.0.1", help="address (default: %(default)s)")
    sub.add_argument("--key", help="(default: $YUE2_API_KEY)")
    sub.add_argument("--poll", type=float, default=None, help="seconds (default: %(default)s)")
    assert vague_defaults(parser) == ["yue2 flower --port: default: YUE2_FLOWER_PORT",
                                      "yue2 flower --key: default: $YUE2_API_KEY", "yue2 flower --poll: default: None"]


def test_durations_name_their_unit() -> None:
    wait = build_parser().parse_args(["wait", "job_x"])
    assert wait.poll == 1.0
    text = build_parser()._subparsers._group_actions[0].choices["wait"].format_help()  # type: ignore[union-attr]
    assert "seconds between status requests (default: 1.0)" in " ".join(text.split())
    assert "give up after this many seconds" in " ".join(text.split())


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_missing_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _one_line(capsys, ["submit", str(tmp_path / "nope.jsonl"), "--api-key", "k"])
    assert err == f"yue2: error: no such file: {tmp_path / 'nope.jsonl'}\n"


def test_an_api_that_is_not_listening_is_named_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 9 (discard) on loopback: nothing listens there in tests.
    err = _one_line(capsys, ["status", "job_x", "--api-url", "http://127.0.0.1:9", "--api-key", "k"])
    assert "cannot reach the API at http://127.0.0.1:9" in err and "yue2 api" in err


def test_a_database_never_migrated_says_run_migrate(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YUE2_DATABASE_URL", f"sqlite:///{tmp_path / 'fresh.sqlite'}")
    err = _one_line(capsys, ["apikey", "create", "--tenant", "acme"])
    assert err == "yue2: error: the database has no yue2-jobs tables: run `yue2 migrate` first\n"


def test_stack_up_names_what_is_missing_and_how_to_start_it(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    assert main(["stack", "up", "--database-url", f"sqlite:///{tmp_path / 'db.sqlite'}",
                 "--broker-url", "redis://127.0.0.1:9/0"]) == 2
    captured = capsys.readouterr()
    progress, error = captured.err.splitlines()  # what was checked, then the one-line failure
    assert progress == "stack: database ok" and captured.out == ""  # nothing for `eval` to run
    assert error.startswith("yue2: error: cannot reach Redis at redis://127.0.0.1:9/0") and "redis-server" in error
