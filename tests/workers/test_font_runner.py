"""The fonts worker's runner: every job gets its own output or its own error, whatever its text."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.font_runner import FontRunner
from workers.job_io import JobInput, JobOutput
from yue2_jobs.core.config import Settings
from yue2_jobs.errors import GlyphsMissingError, InvalidRequestError, JobExecutionError
from yue2_jobs.fonts.params import RenderBody


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> FontRunner:
    return FontRunner(variant="fonts", settings=Settings(home=tmp_path_factory.mktemp("home"),
                                                         render_max_pixels=400_000))


def job(text: str, i: int = 0, **params: Any) -> JobInput:
    # The API refuses NUL and lone surrogates before a job exists; the runner must cope with any text.
    body = RenderBody(text="x", **params).model_dump(exclude={"kind", "custom_id", "text"})
    return JobInput.of(id=f"j{i}", kind="render_font", text=text, params=body)


def test_bad_jobs_fail_alone(runner: FontRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    out = runner.run([job("好", 0), job("😀", 1), job("永" * 400, 2, font_size=64), job("ok", 3, output="svg")])
    assert isinstance(out[0], JobOutput) and [f[0] for f in out[0].files] == ["svg", "png"]
    assert isinstance(out[1], GlyphsMissingError)
    assert isinstance(out[2], InvalidRequestError) and "over the limit of 400,000 pixels" in str(out[2])
    assert isinstance(out[3], JobOutput) and [f[0] for f in out[3].files] == ["svg"]
    assert out[0].extra["render"]["glyphs"] == 1 and runner.checkpoint.startswith("fonts@")

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a font table is corrupt")

    monkeypatch.setattr("workers.font_runner.render", broken)
    out = runner.run([job("好", 4)])
    assert isinstance(out[0], JobExecutionError) and "RuntimeError: a font table is corrupt" in str(out[0])


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30), min_size=1,
                      max_size=4))
def test_any_text_gives_an_output_or_an_error_per_job(runner: FontRunner, texts: list[str]) -> None:
    outs = runner.run([job(t, i) for i, t in enumerate(texts)])
    assert len(outs) == len(texts)
    assert all(isinstance(o, (JobOutput, GlyphsMissingError, InvalidRequestError)) for o in outs), outs
