"""One micro-batch of job ids on its way through a worker: claims, recordings, batches touched.

`process_jobs` (`workers.tasks`) and the continuous engine loop (`workers.engine_loop`) claim
groups of jobs, run them and hand their results to the recorder thread; a `MicroBatch` keeps what
that leaves behind, so that however the micro-batch ends, every recording is waited for and every
claim it still holds is let go (a crash never loses a job: an unrecorded claim's lease runs out and
the reconciler reruns it), and the batches its jobs belong to are finalized once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from types import TracebackType
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from workers.context import WorkerContext
from workers.job_io import JobInput, JobOutput, JSONObject
from workers.protocol import Runner
from workers.record import record
from yue2_jobs.core.retry import retrying, transient
from yue2_jobs.db.models import Job
from yue2_jobs.jobs.batches import try_finalize
from yue2_jobs.jobs.state import ClaimedJob, claim_jobs

log = logging.getLogger(__name__)
T = TypeVar("T")


def in_db(ctx: WorkerContext, session: Session, what: str, fn: Callable[[], T]) -> T:
    """`fn()` on `session`, retried through a database outage (the session is rolled back between tries)."""
    return retrying(fn, deadline=time.monotonic() + ctx.settings.outage_retry_s, what=what,
                    on_retry=session.rollback)


class MicroBatch:
    """Claims, in-flight recordings and touched batches of one micro-batch (a context manager:
    leaving it waits for the recordings and lets go of the claims, however it is left)."""

    def __init__(self, ctx: WorkerContext, session: Session) -> None:
        self.ctx, self.session = ctx, session
        self.claimed: set[str] = set()
        self.batch_ids: set[str] = set()
        self._finalized: set[str] = set()  # by this micro-batch (touched only on the recorder thread and after it)
        self._pending: list[Future[None]] = []
        self._left: Counter[str] = Counter()  # this micro-batch's jobs of each batch not yet handed to the recorder
        # Seconds the decoding thread spent claiming and waiting for the recorder: the micro-batch's
        # log line says them (the pipeline benchmark sums them).
        self.claim_s = self.wait_s = 0.0
        self.unstarted: list[str] = []  # ids left unclaimed because the worker is stopping (`leave`)

    def __enter__(self) -> MicroBatch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.wait()
        finally:
            self.ctx.let_go(self.claimed)  # recorded ones are gone already; the rest are given back

    def expect(self, batch_ids: Iterable[str | None]) -> None:
        """The batches of this micro-batch's jobs, one entry a job (None: not in a batch): a batch is
        finalized early once the last of them is recorded, not after every slice."""
        self._left.update(b for b in batch_ids if b is not None)

    def leave(self, groups: Iterable[list[str]]) -> None:
        """Start none of `groups`: the worker is stopping (`WorkerContext.draining`). Their ids are
        put back on the queue when the micro-batch ends (`process_jobs`), before its ack."""
        self.unstarted.extend(j for group in groups for j in group)

    def claim(self, job_ids: list[str], *, fresh: bool = False) -> list[ClaimedJob]:
        """Claim `job_ids` (those this worker may now run); the heartbeat renews them from now on.
        Jobs that used up their attempts end `failed` here; their batches are finalized too.
        `fresh`: the caller read them all as never started (`claim_jobs`)."""
        s = self.ctx.settings

        def once() -> tuple[list[ClaimedJob], list[str]]:
            return claim_jobs(self.session, job_ids=job_ids, worker=self.ctx.name, lease_s=s.lease_s,
                              max_attempts=s.max_attempts, fresh=fresh)

        t0 = time.perf_counter()
        rows, exhausted = in_db(self.ctx, self.session, f"claiming {len(job_ids)} jobs", once)
        self.claim_s += time.perf_counter() - t0
        if exhausted:
            log.warning("failed after %d attempts: %s", s.max_attempts, exhausted)
            found = self.session.execute(select(Job.batch_id).where(Job.id.in_(exhausted))).scalars()
            self.batch_ids.update(b for b in found if b is not None)
        self.ctx.hold(rows)
        self.claimed.update(r.id for r in rows)
        self.batch_ids.update(r.batch_id for r in rows if r.batch_id is not None)
        return rows

    def record(self, runner: Runner, *, rows: list[ClaimedJob], inputs: list[JobInput],
               outputs: list[JobOutput | Exception], failed: list[JSONObject]) -> None:
        """Store and mark results on the recorder thread (it overlaps the next decode): `outputs`
        are `inputs`' (one each, in order), `failed` the results of jobs that failed before
        decoding; `runner` is the one that decoded them."""
        self._pending.append(self.ctx.recorder.submit(record, self.ctx, runner, rows, inputs, outputs, failed))
        # A small batch whose last jobs these were is finalized now, not when this micro-batch ends
        # (another tenant's batch started by fair share would wait for the whole micro-batch). A
        # batch with more jobs still to come in this micro-batch is not looked at yet: a look at
        # every slice cost the recorder a seventh of its time.
        self._left.subtract(r.batch_id for r in rows if r.batch_id is not None)
        touched = {r.batch_id for r in rows if r.batch_id is not None and self._left[r.batch_id] <= 0}
        if touched:
            self._pending.append(self.ctx.recorder.submit(self._finalize_early, touched))

    def wait(self) -> None:
        """Until every recording handed over so far is done (re-raising the first failure)."""
        t0 = time.perf_counter()
        try:
            for future in self._pending:
                future.result()
        finally:
            self._pending.clear()
            self.wait_s += time.perf_counter() - t0

    def finish(self) -> None:
        """Finalize the batches this micro-batch touched (files, status) once its jobs are recorded;
        an outage leaves it to the reconciler's next pass."""
        self._finalize(self.batch_ids)

    def _finalize_early(self, batch_ids: set[str]) -> None:
        """`_finalize` on the recorder thread: whatever fails is left to `finish` and the reconciler."""
        try:
            self._finalize(batch_ids)
        except Exception:
            log.warning("finalizing batches %s early failed; retried when the micro-batch ends", sorted(batch_ids),
                        exc_info=True)

    def _finalize(self, batch_ids: set[str]) -> None:
        """Finalize those of `batch_ids` whose jobs have all finished (a look at one index entry
        for a batch that has not)."""
        for batch_id in sorted(batch_ids - self._finalized):
            try:
                with self.ctx.sessions() as session:
                    if try_finalize(session, batch_id=batch_id, storage=self.ctx.storage):
                        self._finalized.add(batch_id)
            except Exception as exc:
                if not transient(exc):
                    raise
                log.warning("finalizing batch %s: %s; the reconciler will finish it", batch_id, type(exc).__name__)
