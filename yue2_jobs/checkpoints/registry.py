"""The checkpoint registry: published versions of each variant in a store (S3 or a directory),
their lifecycle in Postgres (`checkpoint_versions`).

A version is the first 12 hex digits of its manifest's sha256, so a job's `variant@version` names
the exact bytes that produced it. `publish` uploads every file, then the manifest: a reader that
requires the manifest never takes a half-uploaded version for a complete one. Activation retires
the previous active version in the same transaction; the database's partial unique index keeps
one active version per variant whatever races above it.

A variant always has somewhere to roll back to: the directory it started from (`YUE2_CHECKPOINTS`)
is registered as its first version (`ensure_seed`) before any other is published or validated,
and every activation is logged in `checkpoint_activations` (`yue2 checkpoints history`).
"""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from yue2_jobs.db.models import CheckpointActivation, CheckpointState, CheckpointVersion
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import CheckpointFileMissingError, ConflictError, NotFoundError
from yue2_jobs.model.checkpoint import MANIFEST, manifest_version
from yue2_jobs.storage import Storage

PREFIX = "checkpoints"
log = logging.getLogger("yue2.checkpoints")


def version_prefix(variant: str, version: str) -> str:
    return f"{PREFIX}/{variant}/{version}/"


def _manifest(directory: Path) -> bytes:
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointFileMissingError(f"{MANIFEST} is missing from {str(directory)!r}: save the checkpoint with "
                                         "save_checkpoint (or write_manifest) first", path=str(manifest_path))
    return manifest_path.read_bytes()


def _upload(store: Storage, *, directory: Path, prefix: str, manifest: bytes) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != MANIFEST and not path.name.startswith("."):
            store.put(prefix + path.relative_to(directory).as_posix(), path.read_bytes(),
                      content_type="application/octet-stream")
    store.put(prefix + MANIFEST, manifest)  # last: a reader never takes a half-uploaded version for a whole one


def publish(session: Session, *, store: Storage, store_url: str, directory: Path, variant: str,
            expect_change: bool = False, tokenizer_change: bool = False) -> CheckpointVersion:
    """Upload a checkpoint directory as a new `staged` version of `variant` (manifest last).

    `expect_change`: it is meant to decode differently from the serving version (validation then
    judges it on the variant's eval set instead); `tokenizer_change`: it brings another tokenizer.
    Publishing a version that failed validation again stages it anew with what this publish says."""
    manifest_bytes = _manifest(directory)
    version, sha = manifest_version(manifest_bytes)
    existing = find(session, variant=variant, version=version)
    if existing is not None and existing.state != CheckpointState.FAILED:
        raise ConflictError(f"{variant}@{version} is already published ({existing.state})")
    prefix = version_prefix(variant, version)
    _upload(store, directory=directory, prefix=prefix, manifest=manifest_bytes)
    if existing is not None:  # a second try, e.g. now saying --expect-change
        existing.state, existing.error, existing.report = CheckpointState.STAGED, None, None
        existing.validated_at = None
        existing.expect_change, existing.tokenizer_change = expect_change, tokenizer_change
        existing.source = f"publish {directory}"
        session.commit()
        return existing
    return register(session, variant=variant, version=version, sha=sha, uri=store_url.rstrip("/") + "/" + prefix,
                    expect_change=expect_change, tokenizer_change=tokenizer_change, source=f"publish {directory}")


def register(session: Session, *, variant: str, version: str, sha: str, uri: str, expect_change: bool = False,
             tokenizer_change: bool = False, source: str = "store") -> CheckpointVersion:
    row = CheckpointVersion(id=f"ckpt_{secrets.token_hex(8)}", variant=variant, version=version, uri=uri,
                            manifest_sha256=sha, state=CheckpointState.STAGED, created_at=utcnow(),
                            expect_change=expect_change, tokenizer_change=tokenizer_change, source=source)
    session.add(row)
    session.commit()
    return row


def ensure_seed(session: Session, *, store: Storage, store_url: str, variant: str,
                directory: Path) -> CheckpointVersion | None:
    """Register the directory `variant` starts from as a version of it, once, so that rollback always
    has a target. With no active version it becomes the active one (it is what the workers serve);
    when another version is already active (a deployment from before seeds were registered), it is
    recorded as the version that served before the first activation. A starting directory that
    changed after its first registration is staged like a publish (validated against the serving
    version), not put in service. None when the directory has no manifest (it cannot be a version)
    or is already registered."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return None
    manifest_bytes = manifest_path.read_bytes()
    version, sha = manifest_version(manifest_bytes)
    if find(session, variant=variant, version=version) is not None:
        return None
    prefix = version_prefix(variant, version)
    _upload(store, directory=directory, prefix=prefix, manifest=manifest_bytes)
    if find(session, variant=variant, version=version) is not None:  # another process registered it meanwhile
        return None
    now, current = utcnow(), active(session, variant)
    seeded_before = session.execute(select(CheckpointVersion.id).where(
        CheckpointVersion.variant == variant, CheckpointVersion.source.like("seed %")).limit(1)).scalar()
    first = session.execute(select(CheckpointVersion.created_at).where(CheckpointVersion.variant == variant)
                            .order_by(CheckpointVersion.created_at).limit(1)).scalar()
    row = CheckpointVersion(id=f"ckpt_{secrets.token_hex(8)}", variant=variant, version=version,
                            uri=store_url.rstrip("/") + "/" + prefix, manifest_sha256=sha, created_at=now,
                            source=f"seed {directory}")
    if seeded_before is not None:
        log.warning("the starting directory of %s (%s) changed since it was registered: staged as %s@%s, to be "
                    "validated against the serving version like a publish", variant, directory, variant, version)
        row.state = CheckpointState.STAGED
    elif current is None:
        row.state, row.activated_at, row.validated_at = CheckpointState.ACTIVE, now, now
        row.report = "the variant's starting directory"
        session.add(CheckpointActivation(variant=variant, version=version, how="seed", started_at=now))
    else:
        # It served from the start until the active version's first activation.
        row.created_at, row.validated_at, row.report = first or now, now, "the variant's starting directory"
        row.state, row.activated_at, row.retired_at = CheckpointState.RETIRED, first or now, current.activated_at
        session.add(CheckpointActivation(variant=variant, version=version, how="seed", started_at=first or now,
                                         ended_at=current.activated_at or now))
    session.add(row)
    try:
        session.commit()
    except IntegrityError:  # a concurrent ensure_seed won the unique (variant, version)
        session.rollback()
        return None
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


def finish_validation(session: Session, row: CheckpointVersion, *, error: str | None,
                      report: str | None = None) -> None:
    """Passed: `validated_at` is set and the version may be activated; failed: it never will be
    (unless published again). `report`: the validation's figures."""
    if report is not None:
        row.report = report
    if error is None:
        row.validated_at = utcnow()
    else:
        if row.state == CheckpointState.ACTIVE:  # failed while serving (workers could not load it)
            session.execute(update(CheckpointActivation).where(
                CheckpointActivation.variant == row.variant, CheckpointActivation.version == row.version,
                CheckpointActivation.ended_at.is_(None)).values(ended_at=utcnow()))
        row.state, row.error = CheckpointState.FAILED, error
    session.commit()


def activate(session: Session, row: CheckpointVersion, *, how: str = "activate") -> CheckpointVersion | None:
    """Make a validated version active; returns the version it replaced (now retired), if any.
    `how` is what `checkpoint_activations` records (activate, rollback, load-failed rollback)."""
    if row.validated_at is None or row.state == CheckpointState.FAILED:
        raise ConflictError(f"{row.variant}@{row.version} has not passed validation ({row.state})")
    if row.state == CheckpointState.ACTIVE:
        return None
    now = utcnow()
    previous = active(session, row.variant)
    session.execute(update(CheckpointVersion).where(
        CheckpointVersion.variant == row.variant, CheckpointVersion.state == CheckpointState.ACTIVE)
        .values(state=CheckpointState.RETIRED, retired_at=now))
    session.execute(update(CheckpointActivation).where(
        CheckpointActivation.variant == row.variant, CheckpointActivation.ended_at.is_(None)).values(ended_at=now))
    session.flush()
    row.state, row.activated_at, row.retired_at = CheckpointState.ACTIVE, now, None
    session.add(CheckpointActivation(variant=row.variant, version=row.version, how=how, started_at=now))
    session.commit()
    return previous


def history(session: Session, variant: str | None = None) -> list[CheckpointActivation]:
    """What served when, oldest first."""
    q = select(CheckpointActivation).order_by(CheckpointActivation.variant, CheckpointActivation.started_at,
                                              CheckpointActivation.id)
    if variant:
        q = q.where(CheckpointActivation.variant == variant)
    return list(session.execute(q).scalars())


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
    activate(session, earlier, how="rollback")
    return earlier
