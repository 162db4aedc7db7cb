"""Batch files are never held whole: creating a batch reads its input file a piece at a time and
inserts its jobs a few thousand rows at a time, and finalizing writes its output file a line at a
time. Python's allocations (tracemalloc) while doing it stay flat as the file grows fivefold."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from tests.sqlite_db import sessions  # noqa: F401 - fixture
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job, JobStatus
from yue2_jobs.db.session import utcnow
from yue2_jobs.jobs import batches, files, service
from yue2_jobs.jobs.batches import try_finalize
from yue2_jobs.storage import LocalStorage

SETTINGS = Settings(max_batch_items=50_000)
TEXT = "A sentence of a long document that a user wants summarised overnight. " * 28  # ~2 KB per line


def _file(factory: sessionmaker[Session], storage: LocalStorage, n: int, tmp: Path) -> str:
    path = tmp / f"in-{n}.jsonl"
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/summarize",
                                "body": {"input": f"{i} {TEXT}"}}) + "\n")
    with factory() as session, path.open("rb") as stream:
        return files.create_file(session, tenant="t", filename=path.name, purpose="batch", data=stream,
                                 storage=storage).id


def _peak(action: Callable[[], Any]) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        out = action()
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_creating_and_finalizing_a_batch_take_no_more_memory_for_a_bigger_file(
        sessions: sessionmaker[Session], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    storage = LocalStorage(tmp_path / "storage")
    monkeypatch.setattr(batches, "SPOOL_BYTES", 1024 * 1024)  # result files go to disk past 1 MB, not 8
    peaks: dict[int, dict[str, int]] = {}
    for n in (2_000, 10_000):
        file_id = _file(sessions, storage, n, tmp_path)
        with sessions() as session:
            create_peak, (batch, queued) = _peak(partial(
                service.create_batch, session, tenant="t", input_file_id=file_id, endpoint="/v1/summarize",
                completion_window="24h", metadata=None, settings=SETTINGS, storage=storage))
            assert batch.total == n and len(queued) == n
            session.execute(update(Job).where(Job.batch_id == batch.id).values(
                status=JobStatus.SUCCEEDED, output_text="a summary", finished_at=utcnow(), checkpoint="base@v"))
            session.commit()
            finalize_peak, done = _peak(partial(try_finalize, session, batch_id=batch.id, storage=storage))
            assert done
        peaks[n] = {"create": create_peak, "finalize": finalize_peak}
    mb = 1024 * 1024
    small, big = peaks[2_000], peaks[10_000]
    # The 10,000-line file is 20 MB; held whole, creating or finalizing would take several times that.
    assert big["create"] < 16 * mb and big["finalize"] < 16 * mb, peaks
    assert big["create"] - small["create"] < 4 * mb and big["finalize"] - small["finalize"] < 4 * mb, peaks


def test_the_sweep_removes_a_killed_writers_temporary_file_only_once_it_is_old(tmp_path) -> None:
    import os

    from yue2_jobs.storage import LocalStorage

    store = LocalStorage(tmp_path)
    store.put("t/b/done.json", b"{}")
    old, young = tmp_path / "t" / "b" / ".tmp-old", tmp_path / "t" / "b" / ".tmp-young"
    old.write_bytes(b"half"), young.write_bytes(b"half")
    os.utime(old, (1_000_000_000, 1_000_000_000))  # written long ago by a writer that died
    assert store.abort_stale_uploads(older_than_s=3600) == ["t/b/.tmp-old"]
    assert not old.exists() and young.exists() and store.get("t/b/done.json") == b"{}"


def test_the_s3_sweep_aborts_only_uploads_older_than_the_limit() -> None:
    """S3's own answer (stubbed: moto dates every upload 2010-11-10): one upload begun two hours
    ago, one a minute ago, under the store's prefix; only the old one is aborted."""
    from datetime import UTC, datetime, timedelta

    from botocore.stub import Stubber

    from yue2_jobs.storage import S3Storage

    store = S3Storage("yue2-sweep", "out", endpoint_url="http://127.0.0.1:9")  # never reached: stubbed
    now = datetime.now(UTC)
    with Stubber(store.client) as stub:
        stub.add_response("list_multipart_uploads", {"Uploads": [
            {"Key": "out/t/b/old.jsonl", "UploadId": "u-old", "Initiated": now - timedelta(hours=2)},
            {"Key": "out/t/b/young.jsonl", "UploadId": "u-young", "Initiated": now - timedelta(minutes=1)},
        ], "IsTruncated": False}, {"Bucket": "yue2-sweep", "Prefix": "out/"})
        stub.add_response("abort_multipart_upload", {},
                          {"Bucket": "yue2-sweep", "Key": "out/t/b/old.jsonl", "UploadId": "u-old"})
        assert store.abort_stale_uploads(older_than_s=3600) == ["t/b/old.jsonl"]
        stub.assert_no_pending_responses()
        # Gone by the time it is aborted (completed, or another sweep's): not an error, not counted.
        stub.add_response("list_multipart_uploads", {"Uploads": [
            {"Key": "out/t/b/old.jsonl", "UploadId": "u-old", "Initiated": now - timedelta(hours=2)}],
            "IsTruncated": False}, {"Bucket": "yue2-sweep", "Prefix": "out/"})
        stub.add_client_error("abort_multipart_upload", service_error_code="NoSuchUpload", http_status_code=404)
        assert store.abort_stale_uploads(older_than_s=3600) == []
