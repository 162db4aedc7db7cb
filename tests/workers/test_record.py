"""`decoding.mode`, one rule (`yue2_jobs.jobs.outputs.decoding`): the output JSON a worker stores,
the batch output line the finalizer writes from the row (`output_body(facts_of(row), text)`) and
the job's view (GET /v1/jobs/{id}) say the same thing for every requested mode: the mode that ran
as the worker recorded it, `auto` resolved, and null where none was recorded (never the mode asked
for). No servers: `record` writes to an SQLite row, a fake uploader keeps the stored JSON."""

from __future__ import annotations

import itertools
import json
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.sqlite_db import sessions  # noqa: F401 - fixture
from workers.job_io import JobInput, JobOutput
from workers.record import record
from yue2_jobs.api.views import job_view
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job, JobStatus
from yue2_jobs.db.session import utcnow
from yue2_jobs.decode.params import AUTO, MODES
from yue2_jobs.jobs.outputs import facts_of, output_body, read_text
from yue2_jobs.jobs.state import ClaimedJob
from yue2_jobs.storage import LocalStorage

_ids = itertools.count()


class _Uploader:
    def __init__(self) -> None:
        self.put: dict[str, bytes] = {}

    def submit(self, key: str, data: bytes, content_type: str = "application/json", *,
               deadline: float) -> Future[None]:
        self.put[key] = data
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def submit_all(self, items: list[tuple[str, bytes, str]], *, deadline: float) -> list[Future[None]]:
        return [self.submit(key, data, ctype, deadline=deadline) for key, data, ctype in items]


def _run(db: sessionmaker[Session], tmp_path: Path, requested: str, ran: str | None
         ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the stored output JSON, the batch output line's body, the job's view) of one job that ran."""
    params = {"mode": requested, "max_new_tokens": 8, "long_input": "truncate"}
    job_id = f"job_{next(_ids)}"
    with db() as s:
        s.add(Job(id=job_id, tenant="acme", custom_id="c1", kind="summarize", variant="base", params=params,
                  input_text="A text.", status=JobStatus.RUNNING, claim_token="t", created_at=utcnow()))
        s.commit()
    row = ClaimedJob(id=job_id, tenant="acme", batch_id=None, custom_id="c1", kind="summarize", variant="base",
                     params=params, input_text="A text.", input_key=None, attempts=1, claim_token="t")
    uploader = _Uploader()
    ctx: Any = SimpleNamespace(uploader=uploader, settings=Settings(), sessions=db, let_go=list,
                               metrics=SimpleNamespace(job_done=lambda *a: None, tokens_done=lambda **k: None))
    runner: Any = SimpleNamespace(checkpoint="base@abc", weights_sha256="f" * 64)
    out = JobOutput(text="A summary.", input_tokens=5, output_tokens=3, decoder_steps=2, nar_tokens=1, mode=ran)
    record(ctx, runner, [row], [JobInput.of(id=job_id, kind="summarize", text="A text.", params=params)], [out], [])
    storage = LocalStorage(tmp_path)
    with db() as s:
        job = s.get_one(Job, job_id)
        assert job.status == JobStatus.SUCCEEDED and job.output_key is not None
        stored = json.loads(uploader.put[job.output_key])
        line = output_body(facts_of(job), read_text(storage, output_text=job.output_text, output_key=job.output_key))
        return stored, line, job_view(job, storage=storage, presign_expiry_s=60)


RAN = [(m, m) for m in MODES if m != AUTO] + [(AUTO, "ar"), (AUTO, "hybrid")]


@pytest.mark.parametrize(("requested", "ran"), RAN)
def test_the_stored_json_the_output_line_and_the_view_say_the_mode_that_ran(
        sessions: sessionmaker[Session], tmp_path: Path, requested: str, ran: str) -> None:  # noqa: F811
    stored, line, view = _run(sessions, tmp_path, requested, ran)
    assert stored["decoding"]["mode"] == line["decoding"]["mode"] == view["decoding"]["mode"] == ran
    # The whole `decoding` block is one shape; the view adds tokens per step.
    assert stored["decoding"] == line["decoding"] == {k: v for k, v in view["decoding"].items() if k != "tau"}
    assert view["decoding"]["tau"] == 1.5 and view["params"]["mode"] == requested
    assert stored == line  # the finalizer's line is what the worker stored


@pytest.mark.parametrize("requested", MODES)
def test_no_recorded_mode_is_null_everywhere_never_the_one_asked_for(
        sessions: sessionmaker[Session], tmp_path: Path, requested: str) -> None:  # noqa: F811
    """A runner that reports no mode (rows from before migration 0004 read alike): the view said
    null and the output lines the mode asked for (`auto` for the default, which never runs)."""
    stored, line, view = _run(sessions, tmp_path, requested, None)
    assert stored["decoding"]["mode"] is line["decoding"]["mode"] is view["decoding"]["mode"] is None
    assert view["params"]["mode"] == requested  # what was asked for is in `params`


def test_a_job_that_has_not_run_reports_no_mode(tmp_path: Path) -> None:
    job = Job(id="job_q", tenant="acme", kind="summarize", variant="base", status=JobStatus.QUEUED,
              params={"mode": "ar", "max_new_tokens": 8, "long_input": "truncate"})
    view = job_view(job, storage=LocalStorage(tmp_path), presign_expiry_s=60)
    assert view["decoding"] == {"mode": None, "decoder_steps": None, "nar_tokens": None, "chunks": None, "tau": None}
