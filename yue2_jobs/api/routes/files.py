"""Files in the OpenAI Files API shape: upload, read, list, delete."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Request, Response, UploadFile
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from yue2_jobs.api.deps import SessionDep, StateDep, TenantDep
from yue2_jobs.api.idempotency import IdempotencyKeyHeader, fingerprint, run_once
from yue2_jobs.api.views import file_view, list_view
from yue2_jobs.db.listing import DEFAULT_LIMIT
from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.jobs import files
from yue2_jobs.storage import read_chunks

router = APIRouter(prefix="/v1/files", tags=["files"])
FORM_FIELDS = {"file", "purpose"}


@router.post("")
async def upload_file(request: Request, state: StateDep, session: SessionDep, tenant: TenantDep, file: UploadFile,
                      purpose: Annotated[str, Form()], idempotency_key: IdempotencyKeyHeader = None) -> JSONResponse:
    # The parsed form (Starlette keeps it): a field the document does not name is refused, not ignored.
    unknown = sorted(set((await request.form()).keys()) - FORM_FIELDS)
    if unknown:
        raise InvalidRequestError(f"unknown form fields {unknown}; send only {sorted(FORM_FIELDS)}",
                                  field=unknown[0], status=400)
    # The multipart parser has spooled the file to disk; it is read a piece at a time from there,
    # once to measure it and once into storage, never whole into memory (on a pool thread).
    measured = await run_in_threadpool(files.measure, file.file, max_bytes=state.settings.max_file_bytes)
    filename = file.filename or "upload.jsonl"

    def create() -> dict[str, Any]:
        file.file.seek(0)  # a run after a takeover reads it again
        return file_view(files.create_file(session, tenant=tenant, filename=filename, purpose=purpose,
                                           data=file.file, measured=measured, storage=state.storage))

    def resume(file_id: str) -> dict[str, Any]:
        return file_view(files.get_file(session, tenant=tenant, file_id=file_id))

    def fingerprint_of() -> str:
        return fingerprint("POST", "/v1/files", f"{purpose}\n{filename}\n{measured.sha256}".encode())

    return await run_once(state.sessions, session, owner=state.owner, kind="file", tenant=tenant, key=idempotency_key,
                          status=200, action=create, resume=resume, fingerprint_of=fingerprint_of)


@router.get("")
def list_files(session: SessionDep, tenant: TenantDep, limit: int = DEFAULT_LIMIT, after: str | None = None,
               order: Literal["asc", "desc"] = "desc", purpose: str | None = None) -> dict[str, Any]:
    found = files.list_files(session, tenant=tenant, limit=limit, after=after, order=order, purpose=purpose)
    return list_view([file_view(f) for f in found.rows], has_more=found.has_more)


@router.get("/{file_id}")
def get_file(file_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return file_view(files.get_file(session, tenant=tenant, file_id=file_id))


@router.get("/{file_id}/content")
def get_file_content(file_id: str, state: StateDep, session: SessionDep, tenant: TenantDep) -> Response:
    f = files.get_file(session, tenant=tenant, file_id=file_id)
    # Streamed: an output file of a 50,000-line batch can be hundreds of MB.
    return StreamingResponse(read_chunks(state.storage.open(f.storage_key)), media_type="application/jsonl")


@router.delete("/{file_id}")
def delete_file(file_id: str, state: StateDep, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    f = files.delete_file(session, tenant=tenant, file_id=file_id, storage=state.storage)
    return {"id": f.id, "object": "file", "deleted": True}
