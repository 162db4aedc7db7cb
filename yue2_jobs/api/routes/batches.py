"""Batches in the OpenAI Batch API shape, so the `openai` client works against them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from yue2_jobs.api.deps import SessionDep, StateDep, TenantDep
from yue2_jobs.api.idempotency import IdempotencyKeyHeader, fingerprint, run_once
from yue2_jobs.api.routes.enqueue import enqueue_later
from yue2_jobs.api.views import batch_view, list_view
from yue2_jobs.core.safe import SafeStr
from yue2_jobs.db.listing import DEFAULT_LIMIT
from yue2_jobs.jobs import batch_service
from yue2_jobs.jobs.batch_stats import batch_stats

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
def create_batch(req: BatchCreate, state: StateDep, session: SessionDep, tenant: TenantDep,
                 background: BackgroundTasks, idempotency_key: IdempotencyKeyHeader = None) -> JSONResponse:
    def create() -> dict[str, Any]:
        submitted = batch_service.submit(
            session, tenant=tenant, input_file_id=req.input_file_id, endpoint=req.endpoint,
            completion_window=req.completion_window, metadata=req.metadata, settings=state.settings,
            storage=state.storage, experiment_id=req.experiment_id or (req.metadata or {}).get("experiment_id"))
        enqueue_later(background, state, submitted.to_enqueue)
        return batch_view(submitted)

    return run_once(state.sessions, tenant=tenant, key=idempotency_key, status=200, action=create,
                    fingerprint_of=lambda: fingerprint("POST", "/v1/batches", req.model_dump()))


@router.get("")
def list_batches(session: SessionDep, tenant: TenantDep, limit: int = DEFAULT_LIMIT,
                 after: str | None = None) -> dict[str, Any]:
    states, has_more = batch_service.list_batches(session, tenant=tenant, limit=limit, after=after)
    return list_view([batch_view(s) for s in states], has_more=has_more)


@router.get("/{batch_id}")
def get_batch(batch_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return batch_view(batch_service.read(session, tenant=tenant, batch_id=batch_id))


@router.get("/{batch_id}/stats")
def get_batch_stats(batch_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    """For the console: counts by status, variant and checkpoint version; throughput and ETA."""
    return batch_stats(session, tenant=tenant, batch_id=batch_id)


@router.post("/{batch_id}/cancel")
def cancel_batch(batch_id: str, state: StateDep, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return batch_view(batch_service.cancel(session, tenant=tenant, batch_id=batch_id, storage=state.storage))


@router.post("/{batch_id}/retry_failed")
def retry_failed(batch_id: str, state: StateDep, session: SessionDep, tenant: TenantDep,
                 background: BackgroundTasks, idempotency_key: IdempotencyKeyHeader = None) -> JSONResponse:
    """A new batch of this ended batch's failed, expired and cancelled lines, linked by
    `metadata.retry_of`. A batch is retried at most once at a time (409 while its retry runs); a
    retry with the same `Idempotency-Key` gets the first answer back."""
    def retry() -> dict[str, Any]:
        retried = batch_service.retry_failed(session, tenant=tenant, batch_id=batch_id, settings=state.settings,
                                             storage=state.storage)
        enqueue_later(background, state, retried.to_enqueue)
        return batch_view(retried)

    return run_once(state.sessions, tenant=tenant, key=idempotency_key, status=200, action=retry,
                    fingerprint_of=lambda: fingerprint("POST", f"/v1/batches/{batch_id}/retry_failed", b""))
