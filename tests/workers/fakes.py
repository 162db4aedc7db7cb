"""A worker without a model, a broker or servers, for the fast tests of its micro-batches: a
`Runner` that echoes, an engine runner over a scripted stand-in for the continuous-batching
engine, and a `WorkerContext` on a SQLite database (`tests.sqlite_db`) and a local directory.

The runners are `workers.protocol.Runner` / `EngineRunner` by shape (the protocols are
runtime-checkable); `FakeEngine` has the part of `ContinuousBatcher`'s surface the engine loop and
the metrics read (`submit`, `step`, `has_work`, `abandon`, `waiting`, `max_rows`, `live`,
`counters`), so a test decides exactly when each row finishes.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from workers.context import WorkerContext
from workers.job_io import JobInput, JobOutput
from workers.protocol import Runner
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Batch, Job
from yue2_jobs.db.session import utcnow
from yue2_jobs.decode.requests import DecodeRequest, DecodeResult, EngineCounters
from yue2_jobs.decode.stats import SequenceStats
from yue2_jobs.jobs import files, service
from yue2_jobs.storage import LocalStorage

ALONE = "[alone]"  # in a job's text: the engine cannot take it (`continuous_ok` is False), it goes through `run`
UNREADABLE = "[unreadable]"  # in a job's text: `requests_for` fails it before decoding


def output(text: str, how: str) -> JobOutput:
    return JobOutput(text=f"{how}: {text}", input_tokens=len(text.split()), output_tokens=2, decoder_steps=1,
                     nar_tokens=0)


class EchoRunner:
    """A `Runner` with no engine: each job's output is `run: <its text>`; `calls` lists the ids of
    each `run` call, in order."""

    variant = "base"
    checkpoint = "base@fake"
    weights_sha256: str | None = None

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, jobs: list[JobInput]) -> list[JobOutput | Exception]:
        self.calls.append([j.id for j in jobs])
        return [output(j.text, "run") for j in jobs]


class FakeEngine:
    """Admits up to `max_rows` waiting requests at each `step` and finishes the oldest
    `finish_per_step` live rows. `submits` records each `submit` as (keys, `first`, what was
    waiting then); `fail_at_step`: that step raises (a bug in the loop, not a row's failure);
    `isolate_at_step`: that step hands every live row back marked `isolate` (a step that failed
    with all its rows)."""

    def __init__(self, *, max_rows: int = 2, finish_per_step: int = 1, on_step: Any = None) -> None:
        self.max_rows, self.finish_per_step, self.on_step = max_rows, finish_per_step, on_step
        self.waiting: deque[DecodeRequest[str]] = deque()
        self.rows: list[DecodeRequest[str]] = []
        self.counters = EngineCounters()
        self.submits: list[tuple[list[str], bool, int]] = []
        self.steps = 0
        self.fail_at_step: int | None = None
        self.isolate_at_step: int | None = None
        self.abandoned: list[str] = []

    @property
    def live(self) -> int:
        return len(self.rows)

    def submit(self, requests: list[DecodeRequest[str]], *, first: bool = False) -> None:
        self.submits.append(([r.key for r in requests], first, len(self.waiting)))
        if first:
            self.waiting.extendleft(reversed(requests))
        else:
            self.waiting.extend(requests)

    def has_work(self) -> bool:
        return bool(self.waiting or self.rows)

    def step(self) -> list[DecodeResult[str]]:
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self)
        if self.steps == self.fail_at_step:
            raise RuntimeError("the engine loop broke (test)")
        while self.waiting and len(self.rows) < self.max_rows:
            self.rows.append(self.waiting.popleft())
        self.counters.occupancy.append(len(self.rows))
        if self.steps == self.isolate_at_step:
            failed, self.rows = self.rows, []
            return [DecodeResult(request=r, error=RuntimeError("step failed"), isolate=True) for r in failed]
        done, self.rows = self.rows[:self.finish_per_step], self.rows[self.finish_per_step:]
        return [DecodeResult(request=r, tokens=list(r.input_ids), mode="ar",
                             stats=SequenceStats(decoder_steps=1, nar_tokens=0, ar_tokens=2)) for r in done]

    def abandon(self) -> list[DecodeRequest[str]]:
        dropped = [*self.waiting, *self.rows]
        self.abandoned += [r.key for r in dropped]
        self.waiting.clear()
        self.rows = []
        return dropped


class EngineEchoRunner(EchoRunner):
    """An `EngineRunner` over a `FakeEngine`: an engine job's output is `engine: <its text>`; a job
    whose text holds `ALONE` goes through `run`, one holding `UNREADABLE` fails before decoding."""

    def __init__(self, engine: FakeEngine) -> None:
        super().__init__()
        self.engine = engine
        self._texts: dict[str, str] = {}

    def continuous_ok(self, job: JobInput) -> bool:
        return ALONE not in job.text

    def requests_for(self, jobs: list[JobInput]) -> tuple[list[DecodeRequest[str]], dict[str, Exception]]:
        failed: dict[str, Exception] = {j.id: ValueError("cannot tokenize (test)")
                                        for j in jobs if UNREADABLE in j.text}
        self._texts.update((j.id, j.text) for j in jobs)
        return [DecodeRequest(key=j.id, input_ids=[1, 2]) for j in jobs if j.id not in failed], failed

    def output_of(self, res: DecodeResult[str]) -> JobOutput | Exception:
        return output(self._texts.pop(res.request.key), "engine")


def make_ctx(tmp_path: Path, sessions: sessionmaker[Session], runner: Runner, **settings: Any) -> WorkerContext:
    """A worker's context on `sessions` and a local directory under `tmp_path`; `settings` override
    the defaults (`outage_retry_s` short: no test here waits out an outage)."""
    s = Settings(home=tmp_path, outage_retry_s=5, **settings)
    return WorkerContext(settings=s, sessions=sessions, storage=LocalStorage(tmp_path / "storage"), runner=runner,
                         name="w-test")


def stop(ctx: WorkerContext) -> None:
    """Stop the context's runtime: its recorder and upload pools (a worker's stop does it; tests make many)."""
    assert ctx.runtime.stop(10) == []


def new_jobs(ctx: WorkerContext, texts: list[str], *, tenant: str = "t") -> list[str]:
    """Queued jobs of `tenant` (ids in order), as POST /v1/jobs leaves them."""
    with ctx.sessions() as session:
        return [service.create_job(session, tenant=tenant, body={"input": t}, settings=ctx.settings,
                                   storage=ctx.storage).id for t in texts]


def jobs_by_id(ctx: WorkerContext, ids: list[str]) -> dict[str, Job]:
    with ctx.sessions() as session:
        found = {j.id: j for j in session.execute(select(Job).where(Job.id.in_(ids))).scalars()}
        session.expunge_all()
    return found


def statuses(ctx: WorkerContext, ids: list[str]) -> list[str]:
    found = jobs_by_id(ctx, ids)
    return [str(found[i].status) for i in ids]


def outputs(ctx: WorkerContext, ids: list[str]) -> list[str | None]:
    found = jobs_by_id(ctx, ids)
    return [found[i].output_text for i in ids]


def new_batch(ctx: WorkerContext, custom_ids: list[str], *, tenant: str = "t") -> tuple[str, list[str]]:
    """A batch of one job per custom id (as POST /v1/batches leaves it): its id and its jobs' ids."""
    lines = "".join(json.dumps({"custom_id": c, "body": {"input": f"text of {c}"}}) + "\n" for c in custom_ids)
    with ctx.sessions() as session:
        f = files.create_file(session, tenant=tenant, filename="in.jsonl", purpose="batch", storage=ctx.storage,
                              data=lines.encode())
        batch, enqueue = service.create_batch(session, tenant=tenant, input_file_id=f.id, endpoint="/v1/summarize",
                                              completion_window="24h", metadata=None, settings=ctx.settings,
                                              storage=ctx.storage)
        return batch.id, [job_id for job_id, _ in enqueue]


def batch_row(ctx: WorkerContext, batch_id: str) -> Any:
    with ctx.sessions() as session:
        row = session.get_one(Batch, batch_id)
        session.expunge(row)
    return row


def file_lines(ctx: WorkerContext, file_id: str) -> list[dict[str, Any]]:
    with ctx.sessions() as session:
        key = files.get_file(session, tenant="t", file_id=file_id).storage_key
    return [json.loads(line) for line in ctx.storage.get(key).decode().splitlines()]


def expire_last_attempt(ctx: WorkerContext, job_id: str) -> None:
    """The job was claimed `max_attempts` times by workers that died each time; its last lease ran out."""
    with ctx.sessions() as session:
        session.execute(update(Job).where(Job.id == job_id).values(
            status="running", attempts=ctx.settings.max_attempts, claim_token="dead", lease_expires_at=utcnow()))
        session.commit()
