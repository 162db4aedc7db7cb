"""Single jobs: submit, read, cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Body, Response
from fastapi.responses import JSONResponse

from yue2_jobs.api.deps import SessionDep, StateDep, TenantDep
from yue2_jobs.api.idempotency import IdempotencyKeyHeader, fingerprint, run_once
from yue2_jobs.api.routes.enqueue import enqueue_later, enqueue_unpublished
from yue2_jobs.api.views import dumps, job_view
from yue2_jobs.db.models import JobStatus
from yue2_jobs.errors import ConflictError, NotFoundError
from yue2_jobs.jobs import service
from yue2_jobs.jobs.keys import file_key

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=201)
async def create_job(state: StateDep, session: SessionDep, tenant: TenantDep, background: BackgroundTasks,
                     body: Annotated[Any, Body()], idempotency_key: IdempotencyKeyHeader = None) -> JSONResponse:
    def create() -> dict[str, Any]:
        job, warnings = service.submit_job(session, tenant=tenant, body=body, settings=state.settings,
                                           storage=state.storage)
        enqueue_later(background, state, [(job.id, job.variant)])
        view = job_view(job, storage=state.storage, presign_expiry_s=state.settings.presign_expiry_s)
        if warnings:
            view["warnings"] = warnings
        return view

    def resume(job_id: str) -> dict[str, Any]:
        enqueue_unpublished(background, state, session, job_id=job_id)
        return job_view(service.get_job(session, tenant=tenant, job_id=job_id), storage=state.storage,
                        presign_expiry_s=state.settings.presign_expiry_s)

    return await run_once(state.sessions, session, owner=state.owner, kind="job", tenant=tenant, key=idempotency_key,
                          status=201, action=create, resume=resume,
                          fingerprint_of=lambda: fingerprint("POST", "/v1/jobs", body))


@router.get("/{job_id}", response_class=Response)
async def get_job(job_id: str, state: StateDep, tenant: TenantDep) -> Response:
    # The hot path of polling clients: see JobReader; JSON is written directly rather than
    # through a response model.
    job = await state.job_reader.get(tenant=tenant, job_id=job_id)
    view = job_view(job, storage=state.storage, presign_expiry_s=state.settings.presign_expiry_s)
    return Response(dumps(view), media_type="application/json")


@router.post("/{job_id}/cancel")
def cancel_job(job_id: str, state: StateDep, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    job = service.cancel_job(session, tenant=tenant, job_id=job_id)
    return job_view(job, storage=state.storage, presign_expiry_s=state.settings.presign_expiry_s)


RENDER_TYPES = {"svg": "image/svg+xml", "png": "image/png"}


@router.get("/{job_id}/files/{suffix}", response_class=Response)
def get_job_file(job_id: str, suffix: str, state: StateDep, session: SessionDep, tenant: TenantDep) -> Response:
    """A render job's image, through the API (no storage credentials or presigned URL needed)."""
    job = service.get_job(session, tenant=tenant, job_id=job_id)
    wanted = job.params.get("output", "both") if job.kind == "render_font" else None
    if suffix not in RENDER_TYPES or wanted not in (suffix, "both"):
        raise NotFoundError(f"job {job_id!r} has no {suffix!r} file")
    if job.status != JobStatus.SUCCEEDED or not job.output_key:
        raise ConflictError(f"job {job_id!r} is {job.status}; its files exist once it has succeeded")
    return Response(state.storage.get(file_key(job.output_key, suffix)), media_type=RENDER_TYPES[suffix])
