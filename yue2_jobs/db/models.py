"""The tables Postgres keeps: the source of truth for every job, batch, file and API key.

Job status only moves forward (queued -> running -> succeeded | failed | cancelled); every change
is a conditional UPDATE in `yue2_jobs.jobs.state`, never a read-modify-write.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {"ix": "ix_%(column_0_label)s", "uq": "uq_%(table_name)s_%(column_0_name)s",
          "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s", "pk": "pk_%(table_name)s"}


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class BatchStatus(StrEnum):
    """The OpenAI Batch lifecycle."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: DateTime(timezone=True), dict[str, Any]: JSON}


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    name: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]
    prefix: Mapped[str | None] = mapped_column(String(16))  # the secret's first characters, for `apikey list`


class File(Base):
    __tablename__ = "files"
    __table_args__ = (Index("ix_files_tenant_created", "tenant", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(500))
    bytes: Mapped[int] = mapped_column(Integer)
    # Its non-blank lines, counted at upload: a batch over the line limit is refused before its
    # file is read (None: uploaded before they were counted).
    lines: Mapped[int | None] = mapped_column(Integer)
    storage_key: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime]
    deleted_at: Mapped[datetime | None]  # DELETE /v1/files: the object is gone, the row stays for its batches


class Batch(Base):
    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_tenant_created", "tenant", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    input_file_id: Mapped[str] = mapped_column(ForeignKey("files.id"))
    endpoint: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16), default="24h")
    status: Mapped[str] = mapped_column(String(16), index=True)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata")
    errors: Mapped[dict[str, Any] | None]
    total: Mapped[int] = mapped_column(Integer, default=0)
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime]
    in_progress_at: Mapped[datetime | None]
    finalizing_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    cancelling_at: Mapped[datetime | None]
    cancelled_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]
    expired_at: Mapped[datetime | None]  # the reconciler found it unfinished at expires_at
    experiment_id: Mapped[str | None] = mapped_column(ForeignKey("experiments.id"), index=True)
    retry_of: Mapped[str | None] = mapped_column(String(64), index=True)  # retry_failed: the batch it retries
    # Set while a retry of this batch is being created: a second retry_failed meanwhile is refused.
    retrying_since: Mapped[datetime | None]


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # A paired experiment runs each custom_id once per variant.
        UniqueConstraint("batch_id", "custom_id", "variant", name="uq_jobs_batch_custom_id_variant"),
        Index("ix_jobs_batch_status", "batch_id", "status"),
        Index("ix_jobs_status_enqueued", "status", "enqueued_at"),
        # jobs.fair_share: which tenants wait for a variant, and each one's oldest queued jobs.
        Index("ix_jobs_fair_share", "status", "variant", "tenant", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id"))
    custom_id: Mapped[str | None] = mapped_column(String(512))
    kind: Mapped[str] = mapped_column(String(16))  # summarize | generate
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED)
    variant: Mapped[str] = mapped_column(String(64))  # requested
    checkpoint: Mapped[str | None] = mapped_column(String(128))  # served: variant@manifest-sha
    weights_sha256: Mapped[str | None] = mapped_column(String(64))  # sha256 of the model.safetensors that ran
    params: Mapped[dict[str, Any]]
    input_text: Mapped[str | None] = mapped_column(Text)
    input_key: Mapped[str | None] = mapped_column(String(500))  # when the input is too large for the row
    output_key: Mapped[str | None] = mapped_column(String(500))
    output_text: Mapped[str | None] = mapped_column(Text)  # kept inline when small
    error: Mapped[dict[str, Any] | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claim_token: Mapped[str | None] = mapped_column(String(32))
    worker: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    enqueued_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    input_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    decoder_steps: Mapped[int | None] = mapped_column(Integer)
    nar_tokens: Mapped[int | None] = mapped_column(Integer)
    decoded_mode: Mapped[str | None] = mapped_column(String(16))  # what `params.mode` ran as (auto -> ar|hybrid)
    input_tokens_used: Mapped[int | None] = mapped_column(Integer)  # of input_tokens, what the encoder read
    input_truncated: Mapped[bool | None]  # long_input=truncate cut the input at the checkpoint's limit
    chunks: Mapped[int | None] = mapped_column(Integer)  # long_input=chunk: windows summarised (1: it fitted)
    experiment_id: Mapped[str | None] = mapped_column(ForeignKey("experiments.id"), index=True)
    reference: Mapped[str | None] = mapped_column(Text)  # a batch line's reference summary, for ROUGE in reports


class CheckpointState(StrEnum):
    """A checkpoint version's lifecycle: staged -> validating -> active | failed; active -> retired."""

    STAGED = "staged"
    VALIDATING = "validating"
    ACTIVE = "active"
    FAILED = "failed"
    RETIRED = "retired"


class CheckpointVersion(Base):
    """One published checkpoint of a variant. `version` is the first 12 hex digits of its
    manifest's sha256 (what every job records as `variant@version`); at most one per variant is
    `active`."""

    __tablename__ = "checkpoint_versions"
    __table_args__ = (
        UniqueConstraint("variant", "version", name="uq_checkpoint_versions_variant_version"),
        # The database itself keeps "one active version per variant", whatever races above it.
        Index("uq_checkpoint_versions_one_active", "variant", unique=True,
              postgresql_where=text("state = 'active'"), sqlite_where=text("state = 'active'")),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    variant: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[str] = mapped_column(String(64))
    uri: Mapped[str] = mapped_column(Text)  # s3://bucket/prefix/checkpoints/<variant>/<version>/ or file://...
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default=CheckpointState.STAGED)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    validated_at: Mapped[datetime | None]
    activated_at: Mapped[datetime | None]
    retired_at: Mapped[datetime | None]
    # What the publish said: the version is meant to decode differently from the one it replaces
    # (judged on the eval set, not against the serving version), or to bring another tokenizer.
    expect_change: Mapped[bool] = mapped_column(default=False, server_default=text("false"))
    tokenizer_change: Mapped[bool] = mapped_column(default=False, server_default=text("false"))
    source: Mapped[str | None] = mapped_column(Text)  # "seed <dir>", "publish <dir>" or "store"
    report: Mapped[str | None] = mapped_column(Text)  # the validation's figures, one line


class CheckpointActivation(Base):
    """One stretch of a version serving its variant: `yue2 checkpoints history` (what served when)."""

    __tablename__ = "checkpoint_activations"
    __table_args__ = (Index("ix_checkpoint_activations_variant", "variant", "started_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    variant: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(64))
    how: Mapped[str] = mapped_column(String(32))  # seed | activate | rollback | load-failed rollback
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]


class WorkerProcess(Base):
    """What each worker process serves, written by its heartbeat thread (which runs while the
    process decodes): how the watchdog finds the workers of a variant and sees a swap finish, and
    why a worker is down."""

    __tablename__ = "worker_processes"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)  # the Celery node name
    variant: Mapped[str] = mapped_column(String(64), index=True)
    checkpoint: Mapped[str] = mapped_column(String(128))
    weights_sha256: Mapped[str | None] = mapped_column(String(64))
    pid: Mapped[int] = mapped_column(Integer)
    # The process table `pid` belongs to (`core.procs.pid_space`): a pid names a process only there.
    pid_space: Mapped[str | None] = mapped_column(String(80))
    swap_version: Mapped[str | None] = mapped_column(String(64))
    swap_state: Mapped[str | None] = mapped_column(String(16))  # loading | serving | failed
    swap_error: Mapped[str | None] = mapped_column(Text)
    # Written by the watchdog only: the version this worker should load next. The worker's report
    # thread polls it, so the request reaches a worker whatever it is doing (a row outlives a
    # remote-control message, which reaches only the workers up at that moment).
    swap_request: Mapped[str | None] = mapped_column(String(64))
    # Set while the worker is down because it could not load its checkpoint (it serves nothing and
    # is not counted as live); the reason, one line.
    load_error: Mapped[str | None] = mapped_column(Text)
    heartbeat_at: Mapped[datetime]


class WorkerPlacement(Base):
    """Where a worker process last ran: written as it starts serving, never deleted (unlike its
    `worker_processes` row), so an A/B report weeks later can still tell whether two arms' workers
    held separate, equal hardware (`experiments.placement`). A node name restarted elsewhere
    overwrites it: the record is the latest start's."""

    __tablename__ = "worker_placements"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)  # the Celery node name, as in jobs.worker
    host: Mapped[str] = mapped_column(String(200))  # socket.gethostname()
    # The running kernel's boot id: one per machine, shared by its containers (whose hostnames differ).
    machine: Mapped[str | None] = mapped_column(String(64))
    cpus: Mapped[list[int]] = mapped_column(JSON)  # os.sched_getaffinity(0), sorted
    cpu_count: Mapped[int] = mapped_column(Integer)
    cpu_model: Mapped[str | None] = mapped_column(String(200))  # /proc/cpuinfo "model name"
    device: Mapped[str] = mapped_column(String(32))  # cpu | cuda:N (N as this process numbers it)
    device_name: Mapped[str | None] = mapped_column(String(200))  # torch.cuda.get_device_name
    device_uuid: Mapped[str | None] = mapped_column(String(64))  # the GPU's own id, whatever N says
    recorded_at: Mapped[datetime]


class ExperimentMode(StrEnum):
    """`split`: each request runs on one variant (hash of its custom_id); `paired`: on every variant."""

    SPLIT = "split"
    PAIRED = "paired"


class Experiment(Base):
    """An A/B experiment: batches created under it have their variants assigned by it."""

    __tablename__ = "experiments"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    mode: Mapped[str] = mapped_column(String(16))
    arms: Mapped[dict[str, Any]]  # {"variants": [{"variant": "base", "weight": 1.0}, ...]}; the first is control
    created_at: Mapped[datetime]
