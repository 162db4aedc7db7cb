"""The read path of GET /v1/jobs/{id}, which polling clients hit hardest.

On Postgres it runs on the event loop over a few psycopg async connections (autocommit, so one
round trip; psycopg prepares the statement after a few uses): no thread-pool hop and no ORM,
which here costs more than the query itself. Elsewhere (SQLite) it runs the Core query in the
thread pool.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.concurrency import run_in_threadpool
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from yue2_jobs.errors import NotFoundError
from yue2_jobs.jobs.service import get_job_row

COLUMNS = ("id, kind, status, custom_id, batch_id, variant, checkpoint, weights_sha256, params, attempts, error, "
           "worker, created_at, started_at, finished_at, input_tokens, output_tokens, decoder_steps, nar_tokens, "
           "output_key, output_text")
QUERY = f"SELECT {COLUMNS} FROM jobs WHERE id = %s AND tenant = %s"


class JobReader:
    def __init__(self, database_url: str, sessions: sessionmaker[Session], *, connections: int = 4) -> None:
        url = make_url(database_url)
        self.sessions = sessions
        self.conninfo: str | None = None
        if url.get_backend_name() == "postgresql":
            self.conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.size = connections
        self.pool: asyncio.Queue[Any] | None = None
        self.opened = 0

    async def _connection(self) -> Any:
        import psycopg
        from psycopg.rows import namedtuple_row

        if self.pool is None:
            self.pool = asyncio.Queue()
        if self.pool.empty() and self.opened < self.size:
            self.opened += 1
            try:
                return await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                             row_factory=namedtuple_row)
            except Exception:
                self.opened -= 1
                raise
        return await self.pool.get()

    async def get(self, *, tenant: str, job_id: str) -> Any:
        if self.conninfo is None:
            return await run_in_threadpool(self._get_sync, tenant, job_id)
        import psycopg

        conn = await self._connection()
        try:
            cur = await conn.execute(QUERY, (job_id, tenant))
            row = await cur.fetchone()
        except psycopg.OperationalError:
            self.opened -= 1  # a broken connection is dropped, not returned to the pool
            await conn.close()
            return await run_in_threadpool(self._get_sync, tenant, job_id)
        assert self.pool is not None
        self.pool.put_nowait(conn)
        if row is None:
            raise NotFoundError(f"no job {job_id!r}")
        return row

    def _get_sync(self, tenant: str, job_id: str) -> Any:
        with self.sessions() as session:
            return get_job_row(session, tenant=tenant, job_id=job_id)
