"""A/B experiments: create one, read it, read its report (JSON, or an HTML page with plots)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from yue2_jobs.api.deps import SessionDep, StateDep, TenantDep
from yue2_jobs.api.views import experiment_view
from yue2_jobs.core.safe import SafeStr
from yue2_jobs.experiments import service
from yue2_jobs.experiments.report import tenant_report

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])


class Arm(BaseModel):
    model_config = ConfigDict(extra="forbid")

    variant: SafeStr = Field(max_length=64)
    weight: float = Field(1.0, gt=0, le=1000)


class ExperimentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: SafeStr = Field("", max_length=service.MAX_NAME_CHARS)
    mode: Literal["split", "paired"] = "split"
    variants: list[Arm] = Field(min_length=2, max_length=service.MAX_VARIANTS)


@router.post("", status_code=201)
def create_experiment(req: ExperimentCreate, state: StateDep, session: SessionDep, tenant: TenantDep
                      ) -> dict[str, Any]:
    exp = service.create_experiment(session, tenant=tenant, name=req.name, mode=req.mode,
                                    variants=[a.model_dump() for a in req.variants], settings=state.settings)
    return experiment_view(exp)


@router.get("/{experiment_id}")
def get_experiment(experiment_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return experiment_view(service.get_experiment(session, tenant=tenant, experiment_id=experiment_id))


@router.get("/{experiment_id}/report", response_model=None)
async def get_report(experiment_id: str, state: StateDep, tenant: TenantDep,
                     format: Literal["json", "html"] = "json") -> dict[str, Any] | Response:
    # ROUGE and the bootstrap take a moment: off the event loop
    report = await run_in_threadpool(tenant_report, state.sessions, state.storage, tenant=tenant,
                                     experiment_id=experiment_id)
    if format == "html":
        from yue2_jobs.experiments.html import render_html

        return Response(await run_in_threadpool(render_html, report), media_type="text/html; charset=utf-8")
    return report
