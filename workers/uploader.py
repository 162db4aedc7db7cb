"""Output uploads off the decoding thread's GIL, retried through a storage outage.

boto3 spends milliseconds of Python per PUT; in threads of the worker process that time is taken
from the decoding loop (CPU-bound Python op dispatch). For S3 the PUTs run in two spawned helper
processes with their own client; a local directory needs no such thing and uses threads. A
slice's PUTs go to the helpers as one task each (not one per object: a pickle round trip each),
and a helper runs up to PUTS_PER_HELPER of them at once (a PUT waits on the network, not the CPU).
"""

from __future__ import annotations

import logging
import os
import signal
from concurrent.futures import BrokenExecutor, Executor, Future, ThreadPoolExecutor
from functools import partial

from workers.runtime import WorkerRuntime
from yue2_jobs.core.config import Settings
from yue2_jobs.core.retry import retrying
from yue2_jobs.errors import StorageUnavailableError
from yue2_jobs.storage import Storage, storage_from_url

_storage: Storage | None = None
_puts: ThreadPoolExecutor | None = None  # in a helper process: its PUTs in flight at once
HELPERS = 2
PUTS_PER_HELPER = 8
Item = tuple[str, bytes, str]  # key, data, content type


def _init(url: str, endpoint_url: str | None, region: str, cpus: list[int] | None) -> None:
    global _storage
    if cpus:  # YUE2_UPLOAD_CPUS: off the decoding thread's cores
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:  # not CPUs this container may use: the PUTs still run, on the worker's
            logging.getLogger("yue2.worker").warning("YUE2_UPLOAD_CPUS %s: %s; the upload helpers run on the "
                                                     "worker's CPUs", cpus, exc)
    # A SIGTERM sent to the whole process group (systemd's default, `kill -- -PGID`) must not kill
    # the helpers under a worker's warm shutdown: they finish the batch's PUTs and exit when the
    # worker shuts the pool down, or with the worker if it dies.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _puts
    _storage = storage_from_url(url, endpoint_url=endpoint_url, region=region)
    _puts = ThreadPoolExecutor(PUTS_PER_HELPER, "yue2-helper-put")  # in the helper process, not the worker


def _put_many(items: list[Item], deadline: float) -> list[BaseException | None]:
    """In a helper process: PUT every item, a few at once; each one's error (None: stored)."""
    assert _storage is not None and _puts is not None
    storage = _storage
    futures = [_puts.submit(_put_with, storage, key, data, ctype, deadline) for key, data, ctype in items]
    return [f.exception() for f in futures]


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
            cpus, host = settings.upload_cpus, os.cpu_count() or 1
            if cpus and not set(cpus) <= set(range(host)):
                raise SystemExit(f"yue2-worker: YUE2_UPLOAD_CPUS {cpus}: this host has CPUs 0-{host - 1}")
            self._pool = runtime.process_pool("yue2-put", HELPERS, initializer=_init,
                                              initargs=(url, settings.s3_endpoint_url, settings.s3_region, cpus))
        else:
            self._pool = runtime.thread_pool("yue2-put", 4)

    @property
    def pool(self) -> Executor:
        return self._pool.executor

    def submit(self, key: str, data: bytes, content_type: str = "application/json", *,
               deadline: float) -> Future[None]:
        """PUT `key`; a storage outage is retried with backoff until `deadline` (time.monotonic())."""
        return self.submit_all([(key, data, content_type)], deadline=deadline)[0]

    def submit_all(self, items: list[Item], *, deadline: float) -> list[Future[None]]:
        """PUT every item (key, data, content type); one future each, in order."""
        if not self.in_processes:
            return [self.pool.submit(_put_with, self.storage, key, data, ctype, deadline) for key, data, ctype in items]
        futures: list[Future[None]] = [Future() for _ in items]
        for part in range(min(HELPERS, len(items))):  # one task a helper
            idx = list(range(part, len(items), HELPERS))
            task = self.pool.submit(_put_many, [items[i] for i in idx], deadline)
            task.add_done_callback(partial(settle, [futures[i] for i in idx]))
        return futures


def settle(futures: list[Future[None]], task: Future[list[BaseException | None]]) -> None:
    """Each item's future from its helper task's answer (the task's own failure fails them all). A
    helper that died is an outage, not the jobs' fault: their jobs are given back to run again, and
    the pool starts new helpers (`runtime.Pool`)."""
    exc = task.exception()
    if isinstance(exc, BrokenExecutor):
        exc = StorageUnavailableError(f"the upload helpers died ({exc})")
    errors = [exc] * len(futures) if exc is not None else task.result()
    for future, error in zip(futures, errors, strict=True):
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
