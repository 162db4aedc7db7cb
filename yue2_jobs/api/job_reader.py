"""The read path of GET /v1/jobs/{id}, which polling clients hit hardest.

On Postgres it runs on the event loop over a few psycopg async connections (autocommit, so one
round trip; psycopg prepares the statement after a few uses): no thread-pool hop and no ORM,
which here costs more than the query itself. Elsewhere (SQLite) it runs the Core query in the
thread pool.

The pool is a semaphore over its connections: every checkout is given back in a `finally`, a
connection in any doubtful state (an error, a cancelled query) is closed instead of reused, and a
wait for a free connection is bounded (503), so no request and no client can drain it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi.concurrency import run_in_threadpool
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.core.safe import require_id
from yue2_jobs.errors import NotFoundError, ServiceUnavailableError
from yue2_jobs.jobs.service import get_job_row

log = logging.getLogger(__name__)
COLUMNS = ("id, kind, status, custom_id, batch_id, variant, checkpoint, weights_sha256, params, attempts, error, "
           "worker, created_at, started_at, finished_at, input_tokens, output_tokens, decoder_steps, nar_tokens, "
           "decoded_mode, input_tokens_used, input_truncated, chunks, output_key, output_text")
QUERY = f"SELECT {COLUMNS} FROM jobs WHERE id = %s AND tenant = %s"


class JobReader:
    def __init__(self, database_url: str, sessions: sessionmaker[Session], *, connections: int = 4,
                 wait_s: float = 5.0, connect_timeout_s: int = 5) -> None:
        url = make_url(database_url)
        self.sessions = sessions
        self.conninfo: str | None = None
        if url.get_backend_name() == "postgresql":
            self.conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.size, self.wait_s, self.connect_timeout_s = connections, wait_s, connect_timeout_s
        self.slots: asyncio.Semaphore | None = None  # created on the event loop that uses it
        self.idle: list[Any] = []

    async def _acquire(self) -> Any:
        import psycopg
        from psycopg.rows import namedtuple_row

        if self.slots is None:
            self.slots = asyncio.Semaphore(self.size)
        try:
            await asyncio.wait_for(self.slots.acquire(), self.wait_s)
        except TimeoutError:
            raise ServiceUnavailableError(f"all {self.size} job-read connections stayed busy for {self.wait_s}s; "
                                          "retry") from None
        assert self.conninfo is not None  # `get` takes the sync path without a Postgres URL
        try:
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed:
                    return conn
            return await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True, row_factory=namedtuple_row,
                                                         connect_timeout=self.connect_timeout_s)
        except BaseException:
            self.slots.release()
            raise

    async def _release(self, conn: Any, *, reusable: bool) -> None:
        from psycopg.pq import TransactionStatus

        assert self.slots is not None
        try:
            if reusable and not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
                self.idle.append(conn)
            else:
                await conn.close()
        except Exception:  # closing a broken connection may fail too; it is dropped either way
            log.debug("closing a job-read connection failed", exc_info=True)
        finally:
            self.slots.release()

    async def get(self, *, tenant: str, job_id: str) -> Any:
        require_id(job_id, what="job")
        if self.conninfo is None:
            return await run_in_threadpool(self._get_sync, tenant, job_id)
        import psycopg

        try:
            conn = await self._acquire()
        except psycopg.OperationalError:  # cannot connect: the sync path answers (503 while it is down)
            return await run_in_threadpool(self._get_sync, tenant, job_id)
        reusable = False
        try:
            cur = await conn.execute(QUERY, (job_id, tenant))
            row = await cur.fetchone()
            reusable = True
        except psycopg.OperationalError:  # the connection broke (a restart): the sync path reconnects
            row = None
        finally:
            await self._release(conn, reusable=reusable)
        if not reusable:
            return await run_in_threadpool(self._get_sync, tenant, job_id)
        if row is None:
            raise NotFoundError(f"no job {job_id!r}")
        return row

    def _get_sync(self, tenant: str, job_id: str) -> Any:
        with self.sessions() as session:
            return get_job_row(session, tenant=tenant, job_id=job_id)
