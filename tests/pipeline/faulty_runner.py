"""A real ModelRunner that misbehaves on marked inputs, for the failure-isolation tests.

`KILLME` in a job's text kills the worker process (SIGKILL, as an OOM killer would) while it
decodes; `RAISEME` makes decoding raise for any batch holding that job (static path), or for the
job alone when it enters the continuous engine.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from workers.job_io import JobInput, JobOutput
from workers.runner import ModelRunner


def _misbehave(jobs: list[JobInput]) -> None:
    if any("KILLME" in j.text for j in jobs):
        os.kill(os.getpid(), signal.SIGKILL)
    if any("RAISEME" in j.text for j in jobs):
        raise RuntimeError("decoding blew up on a RAISEME input")


class FaultyRunner(ModelRunner):
    def generate(self, jobs: list[JobInput]) -> list[JobOutput]:
        _misbehave(jobs)
        return super().generate(jobs)

    def encode(self, job: JobInput) -> tuple[int, list[int]]:
        _misbehave([job])
        return super().encode(job)


def factory(**kwargs: Any) -> FaultyRunner:
    return FaultyRunner(**kwargs)
