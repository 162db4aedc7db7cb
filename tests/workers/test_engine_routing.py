"""The worker sends a job to the continuous-batching engine exactly when `DecodingParams.engine_ok`
says the engine decodes it, it runs an engine, and the job's input is one window."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from workers.job_io import JobInput
from workers.runner import ModelRunner
from yue2_jobs.decode.params import MODES


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", [{}, {"do_sample": True}, {"no_repeat_ngram_size": 3}])
@pytest.mark.parametrize("long_input", ["truncate", "reject", "chunk"])
def test_continuous_ok_is_engine_ok_for_one_window(mode: str, extra: dict[str, Any], long_input: str) -> None:
    job = JobInput.of(id="j", kind="summarize", text="t",
                      params={"mode": mode, "max_new_tokens": 8, "long_input": long_input, **extra})
    with_engine: Any = SimpleNamespace(engine=object())
    without: Any = SimpleNamespace(engine=None)
    assert ModelRunner.continuous_ok(with_engine, job) is (job.decoding_params.engine_ok and long_input != "chunk")
    assert ModelRunner.continuous_ok(without, job) is False
