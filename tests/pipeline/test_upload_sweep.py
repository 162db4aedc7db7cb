"""No orphaned storage (issue 38): a writer SIGKILLed in the middle of an S3 multipart upload
leaves the upload open, its parts stored and billed; the sweep aborts it. Against a moto server
over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import boto3

from tests.pipeline.conftest import ROOT, wait_for
from yue2_jobs.core.config import Settings
from yue2_jobs.jobs.reconciler import sweep_abandoned_uploads
from yue2_jobs.storage import CHUNK, S3Storage

WRITER = """
import sys
from yue2_jobs.storage import S3Storage
S3Storage(sys.argv[1], sys.argv[2], endpoint_url=sys.argv[3]).put_stream("big/results.jsonl", sys.stdin.buffer)
"""


def _open_uploads(client, bucket: str, prefix: str) -> list[str]:
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])]


def test_a_killed_writers_multipart_upload_is_aborted_by_the_sweep(s3: dict[str, str]) -> None:
    prefix = f"sweep-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, s3["bucket"], prefix, s3["endpoint"]],
                              stdin=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert writer.stdin is not None
        writer.stdin.write(b"x" * (9 * CHUNK))  # past the 8 MiB threshold: a multipart upload, part 1 sent
        writer.stdin.flush()
        def started() -> bool:  # the writer now waits for part 2's bytes
            assert writer.poll() is None, "the writer exited before its upload started"
            return bool(_open_uploads(client, s3["bucket"], prefix))

        wait_for(started, timeout=60, what="the multipart upload to start", interval=0.05)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        writer.kill()
    assert _open_uploads(client, s3["bucket"], prefix) == [f"{prefix}/big/results.jsonl"]

    store = S3Storage(s3["bucket"], prefix, endpoint_url=s3["endpoint"])
    # The sweep as the reconciling worker runs it, with the upload past the age limit. (moto says
    # every upload began on 2010-11-10, so the age test itself is checked against S3's answers
    # in tests/jobs/test_streaming.py.)
    aged = Settings().model_copy(update={"upload_abandoned_after_s": 0.0})
    swept = sweep_abandoned_uploads({"outputs": store}, settings=aged)
    assert swept == {"outputs": ["big/results.jsonl"]}
    assert _open_uploads(client, s3["bucket"], prefix) == []
    assert store.list_keys("big") == []  # nothing was ever completed
