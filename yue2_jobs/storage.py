"""Object storage for inputs, outputs and batch files: S3 through boto3, or a local directory.

Keys are deterministic (`{tenant}/{batch}/{job}.json`), so a retried write lands on the same
object; boto3 and OS errors are translated into `StorageError`s here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from yue2_jobs.errors import StorageError, StorageUnavailableError


class Storage(Protocol):
    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> None: ...
    def get(self, key: str) -> bytes: ...
    def get_range(self, key: str, start: int, end: int) -> bytes: ...
    def url(self, key: str, *, expires_s: int) -> str | None: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...


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
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
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

    def list_keys(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder-like prefix ending in /), sorted; in-flight temporaries excluded."""
        base = self._path(prefix.rstrip("/") or ".")
        if not base.is_dir():
            return []
        root = self.root.resolve()
        return sorted(p.relative_to(root).as_posix() for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith(".tmp-"))


@contextlib.contextmanager
def _translate_boto(key: str) -> Iterator[None]:
    from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, EndpointConnectionError

    try:
        yield
    except (EndpointConnectionError, ConnectionError) as exc:
        raise StorageUnavailableError(f"S3 unreachable while accessing {key!r}: {exc}") from exc
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "503", "500"}:
            raise StorageUnavailableError(f"S3 {code} on {key!r}") from exc
        raise StorageError(f"S3 {code or 'error'} on {key!r}: {exc}") from exc
    except BotoCoreError as exc:
        raise StorageUnavailableError(f"S3 client error on {key!r}: {exc}") from exc


class S3Storage:
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str = "us-east-1") -> None:
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region,
                                   config=Config(retries={"max_attempts": 5, "mode": "standard"},
                                                 max_pool_connections=32))

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes, *, content_type: str = "application/json") -> None:
        with _translate_boto(key):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, ContentType=content_type)

    def get(self, key: str) -> bytes:
        with _translate_boto(key):
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of `key` (one ranged GET)."""
        with _translate_boto(key):
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key),
                                          Range=f"bytes={start}-{end - 1}")["Body"].read()

    def url(self, key: str, *, expires_s: int) -> str | None:
        with _translate_boto(key):
            return self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=expires_s)

    def delete(self, key: str) -> None:
        with _translate_boto(key):  # S3 answers 204 for a key already gone
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        strip = len(self.prefix) + 1 if self.prefix else 0
        with _translate_boto(prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                              Prefix=self._key(prefix)):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)


def storage_from_url(url: str, *, endpoint_url: str | None = None, region: str = "us-east-1") -> Storage:
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        return S3Storage(parsed.netloc, parsed.path, endpoint_url=endpoint_url, region=region)
    if parsed.scheme == "file":
        return LocalStorage(unquote(parsed.path))
    raise StorageError(f"storage URL {url!r}: use s3://bucket/prefix or file:///directory")
