"""The checkpoint registry: published versions of each variant in a store (S3 or a directory),
their lifecycle in Postgres (`checkpoint_versions`).

A version is the first 12 hex digits of its manifest's sha256, so a job's `variant@version` names
the exact bytes that produced it. `publish` uploads every file, then the manifest: a reader that
requires the manifest never takes a half-uploaded version for a complete one. Activation retires
the previous active version in the same transaction; the database's partial unique index keeps
one active version per variant whatever races above it.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from yue2_jobs.model.checkpoint import MANIFEST, manifest_version
from yue2_jobs.db.models import CheckpointState, CheckpointVersion
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import CheckpointFileMissingError, ConflictError, NotFoundError
from yue2_jobs.storage import Storage

PREFIX = "checkpoints"


def version_prefix(variant: str, version: str) -> str:
    return f"{PREFIX}/{variant}/{version}/"


def publish(session: Session, *, store: Storage, store_url: str, directory: Path, variant: str) -> CheckpointVersion:
    """Upload a checkpoint directory as a new `staged` version of `variant` (manifest last)."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointFileMissingError(f"{MANIFEST} is missing from {str(directory)!r}: save the checkpoint with "
                                         "save_checkpoint (or write_manifest) first", path=str(manifest_path))
    manifest_bytes = manifest_path.read_bytes()
    version, sha = manifest_version(manifest_bytes)
    existing = find(session, variant=variant, version=version)
    if existing is not None:
        raise ConflictError(f"{variant}@{version} is already published ({existing.state})")
    prefix = version_prefix(variant, version)
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != MANIFEST and not path.name.startswith("."):
            store.put(prefix + path.relative_to(directory).as_posix(), path.read_bytes(),
                      content_type="application/octet-stream")
    store.put(prefix + MANIFEST, manifest_bytes)
    return register(session, variant=variant, version=version, sha=sha, uri=store_url.rstrip("/") + "/" + prefix)


def register(session: Session, *, variant: str, version: str, sha: str, uri: str) -> CheckpointVersion:
    row = CheckpointVersion(id=f"ckpt_{secrets.token_hex(8)}", variant=variant, version=version, uri=uri,
                            manifest_sha256=sha, state=CheckpointState.STAGED, created_at=utcnow())
    session.add(row)
    session.commit()
    return row


def complete_versions(store: Storage, variant: str) -> dict[str, bytes]:
    """Versions of `variant` in the store whose manifest is there and lists only files that are
    there too (version -> manifest bytes). A half-uploaded version has no manifest yet."""
    keys = set(store.list_keys(f"{PREFIX}/{variant}/"))
    found: dict[str, bytes] = {}
    for key in sorted(k for k in keys if k.endswith("/" + MANIFEST)):
        prefix = key[: -len(MANIFEST)]
        data = store.get(key)
        try:
            files = json.loads(data)["files"]
        except (ValueError, KeyError, TypeError):
            found[prefix.rstrip("/").rsplit("/", 1)[1]] = data  # unreadable: validation will say so
            continue
        if all(prefix + name in keys for name in files):
            found[prefix.rstrip("/").rsplit("/", 1)[1]] = data
    return found


def find(session: Session, *, variant: str, version: str) -> CheckpointVersion | None:
    return session.execute(select(CheckpointVersion).where(
        CheckpointVersion.variant == variant, CheckpointVersion.version == version)).scalar_one_or_none()


def get(session: Session, *, variant: str, version: str) -> CheckpointVersion:
    row = find(session, variant=variant, version=version)
    if row is None:
        raise NotFoundError(f"no checkpoint {variant}@{version} is published")
    return row


def active(session: Session, variant: str) -> CheckpointVersion | None:
    return session.execute(select(CheckpointVersion).where(
        CheckpointVersion.variant == variant, CheckpointVersion.state == CheckpointState.ACTIVE)).scalar_one_or_none()


def list_versions(session: Session, variant: str | None = None) -> list[CheckpointVersion]:
    q = select(CheckpointVersion).order_by(CheckpointVersion.variant, CheckpointVersion.created_at)
    if variant:
        q = q.where(CheckpointVersion.variant == variant)
    return list(session.execute(q).scalars())


def start_validation(session: Session, row: CheckpointVersion) -> None:
    row.state, row.error, row.validated_at = CheckpointState.VALIDATING, None, None
    session.commit()


def finish_validation(session: Session, row: CheckpointVersion, *, error: str | None) -> None:
    """Passed: `validated_at` is set and the version may be activated; failed: it never will be."""
    if error is None:
        row.validated_at = utcnow()
    else:
        row.state, row.error = CheckpointState.FAILED, error
    session.commit()


def activate(session: Session, row: CheckpointVersion) -> CheckpointVersion | None:
    """Make a validated version active; returns the version it replaced (now retired), if any."""
    if row.validated_at is None or row.state == CheckpointState.FAILED:
        raise ConflictError(f"{row.variant}@{row.version} has not passed validation ({row.state})")
    if row.state == CheckpointState.ACTIVE:
        return None
    now = utcnow()
    previous = active(session, row.variant)
    session.execute(update(CheckpointVersion).where(
        CheckpointVersion.variant == row.variant, CheckpointVersion.state == CheckpointState.ACTIVE)
        .values(state=CheckpointState.RETIRED, retired_at=now))
    session.flush()
    row.state, row.activated_at, row.retired_at = CheckpointState.ACTIVE, now, None
    session.commit()
    return previous


def rollback(session: Session, variant: str) -> CheckpointVersion:
    """Retire the active version and re-activate the one active before it; returns that one."""
    current = active(session, variant)
    if current is None:
        raise ConflictError(f"{variant} has no active checkpoint to roll back")
    earlier = session.execute(select(CheckpointVersion).where(
        CheckpointVersion.variant == variant, CheckpointVersion.state == CheckpointState.RETIRED,
        CheckpointVersion.activated_at.is_not(None), CheckpointVersion.id != current.id)
        .order_by(CheckpointVersion.activated_at.desc()).limit(1)).scalar_one_or_none()
    if earlier is None:
        raise ConflictError(f"{variant}@{current.version} is the only version that was ever active")
    activate(session, earlier)
    return earlier
