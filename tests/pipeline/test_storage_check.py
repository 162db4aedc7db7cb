"""S3 set-up mistakes, against a moto server over HTTP: a missing bucket and missing credentials
are named with their fix, by /healthz's storage check and by any read or write."""

from __future__ import annotations

import pytest

from tests.pipeline.conftest import S3Server
from yue2_jobs.errors import StorageError
from yue2_jobs.storage import S3Storage


def test_a_missing_bucket_is_named_with_its_fix(s3_server: S3Server, s3: dict[str, str]) -> None:
    S3Storage(s3["bucket"], endpoint_url=s3["endpoint"]).check()  # the bucket the fixture made: fine
    missing = S3Storage("no-such-bucket", endpoint_url=s3_server.endpoint)
    with pytest.raises(StorageError, match=r"S3 bucket 'no-such-bucket' does not exist: create it \(`yue2 stack"):
        missing.check()
    with pytest.raises(StorageError, match="S3 bucket 'no-such-bucket' does not exist"):
        missing.put("t/x.json", b"{}")


def test_missing_credentials_are_named_with_their_fix(s3_server: S3Server, s3: dict[str, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask the instance-metadata address
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it caches the credentials it found earlier
    store = S3Storage(s3["bucket"], endpoint_url=s3_server.endpoint)
    with pytest.raises(StorageError, match="S3 credentials not found: set AWS_ACCESS_KEY_ID and "
                                           "AWS_SECRET_ACCESS_KEY") as exc:
        store.check()
    assert not exc.value.retryable  # a set-up mistake: retrying will not fix it
