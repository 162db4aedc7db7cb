"""A slice's PUTs through the upload helpers (workers/uploader.py), without S3: each item's future
settles from its helper task's answer, in order; a helper task that fails fails its items; a helper
that died is an outage (its jobs run again), never the jobs' own failure."""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

import pytest

from workers.uploader import settle
from yue2_jobs.core.retry import transient
from yue2_jobs.errors import StorageError, StorageUnavailableError


def _task(result: list[BaseException | None] | None = None, error: BaseException | None = None
          ) -> Future[list[BaseException | None]]:
    task: Future[list[BaseException | None]] = Future()
    if error is not None:
        task.set_exception(error)
    else:
        task.set_result(result or [])
    return task


def test_each_item_settles_from_its_helpers_answer() -> None:
    futures: list[Future[None]] = [Future() for _ in range(3)]
    refused = StorageError("access denied to out/b.json")
    settle(futures, _task([None, refused, None]))
    assert [f.exception() for f in futures] == [None, refused, None]


@pytest.mark.parametrize(("error", "rerun"), [(BrokenProcessPool("a helper died"), True),
                                              (StorageError("no such bucket"), False)])
def test_a_failed_helper_task_fails_its_items_a_dead_helper_as_an_outage(error: BaseException, rerun: bool) -> None:
    futures: list[Future[None]] = [Future() for _ in range(2)]
    settle(futures, _task(error=error))
    errors = [f.exception() for f in futures]
    assert all(e is not None for e in errors)
    assert [transient(e) for e in errors if e is not None] == [rerun, rerun]  # given back, or the jobs fail
    assert all(isinstance(e, StorageUnavailableError) == rerun for e in errors)
