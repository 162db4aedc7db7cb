"""Object storage for inputs, outputs and batch files: S3 through boto3, or a local directory.

Keys are deterministic (`{tenant}/{batch}/{job}.json`), so a retried write lands on the same
object; boto3 and OS errors are translated into `StorageError`s here.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import unquote, urlparse

from yue2_jobs.errors import StorageError, StorageUnavailableError


class Reader(Protocol):
    """An object's bytes, read a piece at a time (a batch file of 200 MB is never held whole)."""

    def read(self, size: int) -> bytes: ...
    def close(self) -> None: ...


CHUNK = 1024 * 1024  # what a streamed read or write moves at a time
SPOOL_BYTES = 8 * CHUNK  # a file written for storage (a batch's results) moves from memory to disk past this


class Storage(Protocol):
    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> None: ...
    def put_stream(self, key: str, stream: BinaryIO, *, content_type: str = "application/json") -> None:
        """Write `key` from `stream`'s position to its end, a part at a time."""
        ...
    def get(self, key: str) -> bytes: ...
    def open(self, key: str) -> Reader:
        """`key`'s bytes as a stream (close it)."""
        ...
    def get_range(self, key: str, start: int, end: int) -> bytes: ...
    def url(self, key: str, *, expires_s: int) -> str | None: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...
    def check(self) -> None:
        """Raise a `StorageError` saying what to fix if the store cannot be written now."""
        ...
    def abort_stale_uploads(self, *, older_than_s: float) -> list[str]:
        """End the writes begun more than `older_than_s` ago that never finished (a writer killed
        mid-write: an S3 multipart upload, whose parts are stored and billed until aborted, or a
        directory's temporary file); returns their keys. A live writer is never that old."""
        ...


class LocalStorage:
    """A directory; writes go through a temporary file and a rename, so readers never see half a file."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise StorageError(f"storage key {key!r} leaves the storage directory")
        return path

    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> None:
        self.put_stream(key, io.BytesIO(data), content_type=content_type)

    def put_stream(self, key: str, stream: BinaryIO, *, content_type: str = "application/json") -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(stream, f, CHUNK)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def abort_stale_uploads(self, *, older_than_s: float) -> list[str]:
        cutoff = time.time() - older_than_s
        removed = []
        for tmp in self.root.rglob(".tmp-*"):  # `put_stream`'s, left by a killed writer
            with contextlib.suppress(FileNotFoundError):  # a writer that just finished renamed it
                if tmp.is_file() and tmp.stat().st_mtime < cutoff:
                    tmp.unlink()
                    removed.append(str(tmp.parent.relative_to(self.root) / tmp.name))
        return removed

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise StorageError(f"storage key {key!r} does not exist") from exc

    def open(self, key: str) -> Reader:
        try:
            return self._path(key).open("rb")
        except FileNotFoundError as exc:
            raise StorageError(f"storage key {key!r} does not exist") from exc

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of `key`."""
        try:
            with self._path(key).open("rb") as f:
                f.seek(start)
                return f.read(end - start)
        except FileNotFoundError as exc:
            raise StorageError(f"storage key {key!r} does not exist") from exc

    def url(self, key: str, *, expires_s: int) -> str | None:
        return self._path(key).as_uri()

    def delete(self, key: str) -> None:
        """Remove `key`; a key already gone is not an error (a retried delete)."""
        self._path(key).unlink(missing_ok=True)

    def check(self) -> None:
        if not self.root.is_dir():
            raise StorageError(f"storage directory {str(self.root)!r} does not exist or is not a directory",
                               summary="the storage directory does not exist")
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StorageError(f"storage directory {str(self.root)!r} is not writable by this process",
                               summary="the storage directory is not writable")

    def list_keys(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder-like prefix ending in /), sorted; in-flight temporaries excluded."""
        base = self._path(prefix.rstrip("/") or ".")
        if not base.is_dir():
            return []
        root = self.root.resolve()
        return sorted(p.relative_to(root).as_posix() for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith(".tmp-"))


NO_CREDENTIALS = ("S3 credentials not found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any values for a "
                  "local moto server), or configure a boto3 profile")


def no_bucket(bucket: str) -> str:
    return (f"S3 bucket {bucket!r} does not exist: create it (`yue2 stack up` does, or "
            f"`aws s3 mb s3://{bucket}`), or point YUE2_STORAGE_URL at one that does")


@contextlib.contextmanager
def _translate_boto(key: str, bucket: str | None = None) -> Iterator[None]:
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        EndpointConnectionError,
        NoCredentialsError,
    )

    try:
        yield
    except (EndpointConnectionError, ConnectionError) as exc:
        raise StorageUnavailableError(f"S3 unreachable while accessing {key!r}: {exc}") from exc
    except NoCredentialsError as exc:  # a setup problem, named with its fix
        raise StorageError(NO_CREDENTIALS, summary="S3 credentials not found") from exc
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "503", "500"}:
            raise StorageUnavailableError(f"S3 {code} on {key!r}") from exc
        if code == "NoSuchBucket" and bucket is not None:
            raise StorageError(no_bucket(bucket), summary="the S3 bucket does not exist") from exc
        raise StorageError(f"S3 {code or 'error'} on {key!r}: {exc}", summary=f"S3 {code or 'error'}") from exc
    except BotoCoreError as exc:
        raise StorageUnavailableError(f"S3 client error on {key!r}: {exc}") from exc


class S3Storage:
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str = "us-east-1") -> None:
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.endpoint_url, self.region = endpoint_url, region
        self._probe_client: Any = None
        # Checksums only where S3 requires them (as botocore did before 1.36): its default CRC32 on
        # every PUT is a sixth of a small PUT's CPU, which a worker's upload helpers take from its
        # cores, and some S3-compatible stores refuse the new checksum headers.
        self.client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region,
                                   config=Config(retries={"max_attempts": 5, "mode": "standard"},
                                                 max_pool_connections=32, request_checksum_calculation="when_required",
                                                 response_checksum_validation="when_required"))

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> None:
        with _translate_boto(key, self.bucket):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, ContentType=content_type)

    def put_stream(self, key: str, stream: BinaryIO, *, content_type: str = "application/json") -> None:
        from boto3.s3.transfer import TransferConfig

        # A multipart upload above 8 MiB, two parts in flight and two read ahead: memory stays at a few
        # parts (s3transfer would read 10 ahead by default, 80 MiB).
        config = TransferConfig(multipart_threshold=8 * CHUNK, multipart_chunksize=8 * CHUNK, max_concurrency=2)
        config.max_in_memory_upload_chunks = 2
        with _translate_boto(key, self.bucket):
            self.client.upload_fileobj(stream, self.bucket, self._key(key), ExtraArgs={"ContentType": content_type},
                                       Config=config)

    def get(self, key: str) -> bytes:
        with _translate_boto(key, self.bucket):
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def open(self, key: str) -> Reader:
        with _translate_boto(key, self.bucket):
            return _S3Reader(self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"], key, self.bucket)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of `key` (one ranged GET)."""
        with _translate_boto(key, self.bucket):
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key),
                                          Range=f"bytes={start}-{end - 1}")["Body"].read()

    def url(self, key: str, *, expires_s: int) -> str | None:
        with _translate_boto(key, self.bucket):
            return self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=expires_s)

    def delete(self, key: str) -> None:
        with _translate_boto(key, self.bucket):  # S3 answers 204 for a key already gone
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def check(self) -> None:
        from botocore.exceptions import ClientError

        with _translate_boto("(bucket check)", self.bucket):
            try:
                self._probe().head_bucket(Bucket=self.bucket)
            except ClientError as exc:  # HEAD has no body: a missing bucket is a bare 404
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket"):
                    raise StorageError(no_bucket(self.bucket), summary="the S3 bucket does not exist") from exc
                raise

    def _probe(self) -> Any:
        """A client for health checks: one attempt, short timeouts (the data client retries 5 times)."""
        if self._probe_client is None:
            import boto3
            from botocore.config import Config

            self._probe_client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                                              config=Config(retries={"max_attempts": 1}, connect_timeout=3,
                                                            read_timeout=3))
        return self._probe_client

    def abort_stale_uploads(self, *, older_than_s: float) -> list[str]:
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
        aborted = []
        prefix = f"{self.prefix}/" if self.prefix else ""
        with _translate_boto("(multipart uploads)", self.bucket):
            pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                for upload in page.get("Uploads", []):
                    if upload["Initiated"] < cutoff and self._abort(upload["Key"], upload["UploadId"]):
                        aborted.append(upload["Key"][len(prefix):])
        return aborted

    def _abort(self, key: str, upload_id: str) -> bool:
        """Abort one multipart upload; False when it is gone already (completed, or aborted by
        another sweep since the listing), which is what the sweep wanted anyway."""
        from botocore.exceptions import ClientError

        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchUpload":
                return False
            raise
        return True

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        strip = len(self.prefix) + 1 if self.prefix else 0
        with _translate_boto(prefix, self.bucket):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                              Prefix=self._key(prefix)):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)


class _S3Reader:
    """An S3 object's body, read in pieces, with boto's errors translated like every other call's."""

    def __init__(self, body: Any, key: str, bucket: str) -> None:
        self.body, self.key, self.bucket = body, key, bucket

    def read(self, size: int) -> bytes:
        with _translate_boto(self.key, self.bucket):
            data: bytes = self.body.read(size)
            return data

    def close(self) -> None:
        self.body.close()


def read_chunks(reader: Reader) -> Iterator[bytes]:
    """`reader`'s bytes in pieces of up to `CHUNK`, closing it at the end (a streamed HTTP response)."""
    try:
        while chunk := reader.read(CHUNK):
            yield chunk
    finally:
        reader.close()


def storage_from_url(url: str, *, endpoint_url: str | None = None, region: str = "us-east-1") -> Storage:
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        return S3Storage(parsed.netloc, parsed.path, endpoint_url=endpoint_url, region=region)
    if parsed.scheme == "file":
        return LocalStorage(unquote(parsed.path))
    raise StorageError(f"storage URL {url!r}: use s3://bucket/prefix or file:///directory")
