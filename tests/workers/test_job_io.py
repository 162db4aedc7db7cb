"""`long_input`'s one default (`yue2_jobs.jobs.params.DEFAULT_LONG_INPUT`): what the API stores
for a job that names none and what a worker reads from a row that lacks it (rows from before
migration 0005) are the same value, the documented `truncate` (docs/api.md, "Long inputs")."""

from __future__ import annotations

from workers.job_io import JobInput
from yue2_jobs.core.config import Settings
from yue2_jobs.jobs.params import DEFAULT_LONG_INPUT, validate_job


def test_the_api_and_the_worker_default_long_input_alike() -> None:
    assert DEFAULT_LONG_INPUT == "truncate"
    stored = validate_job({"input": "A text."}, kind=None, settings=Settings()).params
    assert stored["long_input"] == DEFAULT_LONG_INPUT
    assert JobInput.of(id="j", kind="summarize", text="t", params=stored).long_input == DEFAULT_LONG_INPUT
    old_row = {k: v for k, v in stored.items() if k != "long_input"}
    assert JobInput.of(id="j", kind="summarize", text="t", params=old_row).long_input == DEFAULT_LONG_INPUT
    assert JobInput.of(id="j", kind="summarize", text="t", params={**old_row, "long_input": None}
                       ).long_input == DEFAULT_LONG_INPUT


def test_a_named_long_input_is_kept() -> None:
    for value in ("truncate", "reject", "chunk"):
        stored = validate_job({"input": "A text.", "long_input": value}, kind=None, settings=Settings()).params
        assert JobInput.of(id="j", kind="summarize", text="t", params=stored).long_input == value
