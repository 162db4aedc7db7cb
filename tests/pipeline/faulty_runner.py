"""A real ModelRunner that misbehaves on marked inputs, for the failure-isolation tests.

`KILLME` in a job's text kills the worker process (SIGKILL, as an OOM killer would) while it
decodes; `RAISEME` makes decoding raise for any batch holding that job.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from workers.runner import JobInput, JobOutput, ModelRunner


class FaultyRunner(ModelRunner):
    def generate(self, jobs: list[JobInput]) -> list[JobOutput]:
        if any("KILLME" in j.text for j in jobs):
            os.kill(os.getpid(), signal.SIGKILL)
        if any("RAISEME" in j.text for j in jobs):
            raise RuntimeError("decoding blew up on a RAISEME input")
        return super().generate(jobs)


def factory(**kwargs: Any) -> FaultyRunner:
    return FaultyRunner(**kwargs)
