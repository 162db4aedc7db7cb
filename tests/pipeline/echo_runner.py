"""A job runner with no model, for the chaos tests: a job's output is the first words of its input,
and each job takes YUE2_TEST_JOB_MS of decoding time, so a batch runs long enough for a fault to
land in the middle of it. It has the runner seams the worker uses (`run`, `checkpoint`,
`weights_sha256`, `variant`: a `workers.protocol.Runner`, no engine)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from workers.job_io import JobInput, JobOutput


def echo(text: str) -> str:
    return " ".join(text.split()[:6])


class EchoRunner:
    def __init__(self, *, variant: str, settings: Any, directory: Path | None = None) -> None:
        self.variant, self.settings = variant, settings
        self.checkpoint = f"{variant}@echo"
        self.weights_sha256 = None
        self.job_s = float(os.environ.get("YUE2_TEST_JOB_MS", "10")) / 1000

    def run(self, jobs: list[JobInput]) -> list[JobOutput | Exception]:
        time.sleep(self.job_s * len(jobs))  # stands in for the decoder's time, which the faults must overlap
        return [JobOutput(text=echo(j.text), input_tokens=len(j.text.split()), output_tokens=len(echo(j.text).split()),
                          decoder_steps=1, nar_tokens=0) for j in jobs]


def factory(**kwargs: Any) -> EchoRunner:
    return EchoRunner(**kwargs)
