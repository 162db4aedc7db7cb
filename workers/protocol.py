"""What the worker needs of a job runner, as typed seams.

Every runner (the model runner, the font runner, a test's runner) is a `Runner`: it names what
it serves and turns jobs into outputs. A runner that can also feed the continuous-batching
engine is an `EngineRunner` as well; `engine_runner` tells which, so no runner has to fake an
engine it does not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from workers.job_io import JobInput, JobOutput

if TYPE_CHECKING:
    from yue2_jobs.core.config import Settings
    from yue2_jobs.decode.continuous import ContinuousBatcher
    from yue2_jobs.decode.requests import DecodeRequest, DecodeResult


@runtime_checkable
class Runner(Protocol):
    variant: str
    checkpoint: str  # "variant@version": what ran, recorded on every job
    weights_sha256: str | None  # None: no weights (render jobs, test runners)

    def run(self, jobs: list[JobInput]) -> list[JobOutput | Exception]:
        """One output, or the exception that failed it, per job, in order; never raises for one job."""
        ...


@runtime_checkable
class EngineRunner(Runner, Protocol):
    engine: ContinuousBatcher[str] | None  # None: this runner was built for static batching

    def continuous_ok(self, job: JobInput) -> bool:
        """Whether the engine can decode `job`; the rest go through `run`."""
        ...

    def requests_for(self, jobs: list[JobInput]) -> tuple[list[DecodeRequest[str]], dict[str, Exception]]:
        """Engine requests for `jobs` (keyed by job id), and the jobs that failed before decoding (by id)."""
        ...

    def output_of(self, res: DecodeResult[str]) -> JobOutput | Exception:
        """An engine result as the job's output (or its failure)."""
        ...


class RunnerFactory(Protocol):
    def __call__(self, *, variant: str, settings: Settings, directory: Path | None = None) -> Runner: ...


def engine_runner(runner: Runner) -> EngineRunner | None:
    """`runner` when it feeds a continuous-batching engine, else None."""
    if isinstance(runner, EngineRunner) and runner.engine is not None:
        return runner
    return None
