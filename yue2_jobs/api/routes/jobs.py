"""Single jobs: submit, read, cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Body, Response

from yue2_jobs.api.deps import SessionDep, StateDep, TenantDep
from yue2_jobs.api.routes.enqueue import enqueue_later
from yue2_jobs.api.views import dumps, job_view
from yue2_jobs.jobs import service

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=201)
def create_job(state: StateDep, session: SessionDep, tenant: TenantDep, background: BackgroundTasks,
               body: Annotated[Any, Body()]) -> dict[str, Any]:
    job = service.create_job(session, tenant=tenant, body=body, settings=state.settings, storage=state.storage)
    enqueue_later(background, state, [(job.id, job.variant)])
    return job_view(job, storage=state.storage, presign_expiry_s=state.settings.presign_expiry_s)


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
