"""Files and batches in the OpenAI Batch API shape, so the `openai` client works against them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Form, Response, UploadFile
from pydantic import BaseModel, Field

from yue2_jobs.api.deps import SessionDep, StateDep, TenantDep
from yue2_jobs.api.routes.enqueue import enqueue_later
from yue2_jobs.api.views import batch_view, file_view
from yue2_jobs.core.safe import SafeStr
from yue2_jobs.errors import LimitExceededError
from yue2_jobs.jobs import batch_service, service

router = APIRouter(prefix="/v1", tags=["batches"])


@router.post("/files")
def upload_file(state: StateDep, session: SessionDep, tenant: TenantDep, file: UploadFile,
                purpose: Annotated[str, Form()]) -> dict[str, Any]:
    data = file.file.read(state.settings.max_file_bytes + 1)
    if len(data) > state.settings.max_file_bytes:
        raise LimitExceededError(field="file", limit=state.settings.max_file_bytes, actual=len(data), unit="bytes")
    f = service.create_file(session, tenant=tenant, filename=file.filename or "upload.jsonl", purpose=purpose,
                            data=data, storage=state.storage)
    return file_view(f)


@router.get("/files/{file_id}")
def get_file(file_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return file_view(service.get_file(session, tenant=tenant, file_id=file_id))


@router.get("/files/{file_id}/content")
def get_file_content(file_id: str, state: StateDep, session: SessionDep, tenant: TenantDep) -> Response:
    f = service.get_file(session, tenant=tenant, file_id=file_id)
    return Response(state.storage.get(f.storage_key), media_type="application/jsonl")


MetadataKey = Annotated[SafeStr, Field(max_length=64)]
MetadataValue = Annotated[SafeStr, Field(max_length=512)]


class BatchCreate(BaseModel):
    """OpenAI's batch create body; metadata as OpenAI limits it (16 pairs, keys 64, values 512 characters)."""

    input_file_id: SafeStr = Field(max_length=64)
    endpoint: SafeStr = Field(max_length=64)
    completion_window: SafeStr = Field("24h", max_length=16)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(None, max_length=16)
    # An A/B experiment assigns the lines' variants; `metadata.experiment_id` works too (the openai client).
    experiment_id: SafeStr | None = Field(None, max_length=64)


@router.post("/batches")
def create_batch(req: BatchCreate, state: StateDep, session: SessionDep, tenant: TenantDep,
                 background: BackgroundTasks) -> dict[str, Any]:
    submitted = batch_service.submit(
        session, tenant=tenant, input_file_id=req.input_file_id, endpoint=req.endpoint,
        completion_window=req.completion_window, metadata=req.metadata, settings=state.settings,
        storage=state.storage, experiment_id=req.experiment_id or (req.metadata or {}).get("experiment_id"))
    enqueue_later(background, state, submitted.to_enqueue)
    return batch_view(submitted)


@router.get("/batches/{batch_id}")
def get_batch(batch_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return batch_view(batch_service.read(session, tenant=tenant, batch_id=batch_id))


@router.post("/batches/{batch_id}/cancel")
def cancel_batch(batch_id: str, state: StateDep, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return batch_view(batch_service.cancel(session, tenant=tenant, batch_id=batch_id, storage=state.storage))
