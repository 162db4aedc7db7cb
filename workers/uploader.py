"""Output uploads off the decoding thread's GIL, retried through a storage outage.

boto3 spends milliseconds of Python per PUT; in threads of the worker process that time is taken
from the decoding loop (CPU-bound Python op dispatch). For S3 the PUTs run in two spawned helper
processes with their own client; a local directory needs no such thing and uses threads.
"""

from __future__ import annotations

import signal
from concurrent.futures import Executor, Future

from workers.runtime import WorkerRuntime
from yue2_jobs.core.config import Settings
from yue2_jobs.core.retry import retrying
from yue2_jobs.storage import Storage, storage_from_url

_storage: Storage | None = None


def _init(url: str, endpoint_url: str | None, region: str) -> None:
    global _storage
    # A SIGTERM sent to the whole process group (systemd's default, `kill -- -PGID`) must not kill
    # the helpers under a worker's warm shutdown: they finish the batch's PUTs and exit when the
    # worker shuts the pool down, or with the worker if it dies.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _storage = storage_from_url(url, endpoint_url=endpoint_url, region=region)


def _put(key: str, data: bytes, content_type: str, deadline: float) -> None:
    assert _storage is not None
    _put_with(_storage, key, data, content_type, deadline)


def _put_with(storage: Storage, key: str, data: bytes, content_type: str, deadline: float) -> None:
    retrying(lambda: storage.put(key, data, content_type=content_type), deadline=deadline, what=f"storing {key}")


class Uploader:
    """The PUTs of job outputs, in a pool the worker's runtime owns (started on the first PUT,
    shut down on the worker's stop after its last micro-batch)."""

    def __init__(self, settings: Settings, storage: Storage, *, runtime: WorkerRuntime) -> None:
        url = settings.resolved_storage_url
        self.storage = storage
        self.in_processes = url.startswith("s3://")

        if self.in_processes:
            self._pool = runtime.process_pool("yue2-put", 2, initializer=_init,
                                              initargs=(url, settings.s3_endpoint_url, settings.s3_region))
        else:
            self._pool = runtime.thread_pool("yue2-put", 4)

    @property
    def pool(self) -> Executor:
        return self._pool.executor

    def submit(self, key: str, data: bytes, content_type: str = "application/json", *,
               deadline: float) -> Future[None]:
        """PUT `key`; a storage outage is retried with backoff until `deadline` (time.monotonic())."""
        if self.in_processes:
            return self.pool.submit(_put, key, data, content_type, deadline)
        return self.pool.submit(_put_with, self.storage, key, data, content_type, deadline)
