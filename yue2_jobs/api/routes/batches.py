"""Batches in the OpenAI Batch API shape, so the `openai` client works against them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from yue2_jobs.api.deps import AppState, SessionDep, StateDep, TenantDep
from yue2_jobs.api.idempotency import IdempotencyKeyHeader, fingerprint, run_once
from yue2_jobs.api.routes.enqueue import enqueue_later, enqueue_unpublished
from yue2_jobs.api.views import batch_job_view, batch_view, list_view
from yue2_jobs.core.safe import SafeStr
from yue2_jobs.db.listing import DEFAULT_LIMIT
from yue2_jobs.db.models import JobStatus
from yue2_jobs.jobs import batch_service
from yue2_jobs.jobs.batch_stats import batch_jobs, batch_stats

router = APIRouter(prefix="/v1/batches", tags=["batches"])
MetadataKey = Annotated[SafeStr, Field(max_length=64)]
MetadataValue = Annotated[SafeStr, Field(max_length=512)]


class BatchCreate(BaseModel):
    """OpenAI's batch create body; metadata as OpenAI limits it (16 pairs, keys 64, values 512 characters)."""

    input_file_id: SafeStr = Field(max_length=64)
    endpoint: SafeStr = Field(max_length=64)
    completion_window: SafeStr = Field("24h", max_length=16)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(None, max_length=batch_service.MAX_METADATA_PAIRS)
    # An A/B experiment assigns the lines' variants; `metadata.experiment_id` works too (the openai client).
    experiment_id: SafeStr | None = Field(None, max_length=64)


@router.post("")
async def create_batch(req: BatchCreate, state: StateDep, session: SessionDep, tenant: TenantDep,
                       background: BackgroundTasks, idempotency_key: IdempotencyKeyHeader = None) -> JSONResponse:
    def create() -> dict[str, Any]:
        submitted = batch_service.submit(
            session, tenant=tenant, input_file_id=req.input_file_id, endpoint=req.endpoint,
            completion_window=req.completion_window, metadata=req.metadata, settings=state.settings,
            storage=state.storage, experiment_id=req.experiment_id or (req.metadata or {}).get("experiment_id"))
        enqueue_later(background, state, submitted.to_enqueue)
        return batch_view(submitted)

    return await run_once(state.sessions, session, owner=state.owner, kind="batch", tenant=tenant, key=idempotency_key,
                          status=200, action=create, resume=_resumer(state, session, tenant, background),
                          fingerprint_of=lambda: fingerprint("POST", "/v1/batches", req.model_dump()))


def _resumer(state: AppState, session: Session, tenant: str, background: BackgroundTasks) -> Callable[[str], Any]:
    """The answer for a batch whose creating request died after committing it (`api.idempotency`)."""
    def resume(batch_id: str) -> dict[str, Any]:
        enqueue_unpublished(background, state, session, batch_id=batch_id)
        return batch_view(batch_service.read(session, tenant=tenant, batch_id=batch_id))

    return resume


@router.get("")
def list_batches(session: SessionDep, tenant: TenantDep, limit: int = DEFAULT_LIMIT,
                 after: str | None = None, search: str | None = None) -> dict[str, Any]:
    """OpenAI's list; `search` (ours, for the console) keeps the batches whose id, `metadata.name`
    or `metadata.source` contains it."""
    states, has_more = batch_service.list_batches(session, tenant=tenant, limit=limit, after=after, search=search)
    return list_view([batch_view(s) for s in states], has_more=has_more)


@router.get("/{batch_id}")
def get_batch(batch_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return batch_view(batch_service.read(session, tenant=tenant, batch_id=batch_id))


@router.get("/{batch_id}/stats")
def get_batch_stats(batch_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    """For the console: counts by status, variant and checkpoint version; throughput and ETA."""
    return batch_stats(session, tenant=tenant, batch_id=batch_id)


@router.get("/{batch_id}/jobs")
def list_batch_jobs(batch_id: str, state: StateDep, session: SessionDep, tenant: TenantDep,
                    status: JobStatus | None = None,
                    limit: int = DEFAULT_LIMIT, after: str | None = None) -> dict[str, Any]:
    """For the console's line browser: the batch's jobs (one per line and variant) by custom_id,
    optionally of one status, a page of `limit` after the job `after`."""
    found = batch_jobs(session, tenant=tenant, batch_id=batch_id, status=status, limit=limit, after=after)
    return list_view([batch_job_view(j, storage=state.storage, presign_expiry_s=state.settings.presign_expiry_s)
                      for j in found.rows], has_more=found.has_more)


@router.post("/{batch_id}/cancel")
def cancel_batch(batch_id: str, state: StateDep, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return batch_view(batch_service.cancel(session, tenant=tenant, batch_id=batch_id, storage=state.storage))


@router.post("/{batch_id}/retry_failed")
async def retry_failed(batch_id: str, state: StateDep, session: SessionDep, tenant: TenantDep,
                       background: BackgroundTasks, idempotency_key: IdempotencyKeyHeader = None) -> JSONResponse:
    """A new batch of this ended batch's failed, expired and cancelled lines, linked by
    `metadata.retry_of`. A batch is retried at most once at a time (409 while its retry runs); a
    retry with the same `Idempotency-Key` gets the first answer back."""
    def retry() -> dict[str, Any]:
        retried = batch_service.retry_failed(session, tenant=tenant, batch_id=batch_id, settings=state.settings,
                                             storage=state.storage)
        enqueue_later(background, state, retried.to_enqueue)
        return batch_view(retried)

    return await run_once(state.sessions, session, owner=state.owner, kind="batch", tenant=tenant, key=idempotency_key,
                          status=200, action=retry, resume=_resumer(state, session, tenant, background),
                          fingerprint_of=lambda: fingerprint("POST", f"/v1/batches/{batch_id}/retry_failed", b""))
