"""`yue2 ab export-eval`: the shipped eval sets written where asked, each printed with the submit
command that carries its name and domain; a bad --items is refused in one line."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from yue2_jobs.cli import main


def test_export_eval_writes_the_sets_and_says_how_to_submit_them(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ab", "export-eval", "--out", str(tmp_path), "--items", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    for line, corpus in zip(out, ("legal", "general"), strict=True):
        path = tmp_path / f"{corpus}_eval.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        assert len(lines) == 4 and all(x["reference"] and x["body"]["input"] for x in lines)
        command = shlex.split(line.split("submit it as: ", 1)[1])
        assert command == ["yue2", "submit", str(path), "--experiment", "EXP", "--metadata", f"name={corpus} eval",
                           "--metadata", f"domain={corpus}"]
    assert main(["ab", "export-eval", "--out", str(tmp_path / "one"), "--set", "general"]) == 0
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["general_eval.jsonl"]


def test_export_eval_refuses_items_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["ab", "export-eval", "--out", str(tmp_path), "--items", "0"])
    assert exc.value.code == 2 and "--items: must be at least 1, not 0" in capsys.readouterr().err
