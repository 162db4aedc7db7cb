"""The FastAPI app: routes, the request-size limit, error translation, /healthz and /metrics."""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from yue2_jobs.api.deps import AppState
from yue2_jobs.api.job_reader import JobReader
from yue2_jobs.api.routes import batches, experiments, jobs
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import session_factory
from yue2_jobs.errors import (
    AuthError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PipelineError,
    StorageError,
)
from yue2_jobs.queue import make_celery
from yue2_jobs.storage import storage_from_url


def _error(status: int, message: str, *, type_: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    # OpenAI's error shape, which its client turns into exceptions.
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}}, status)


class BodyLimitMiddleware:
    """413 for a body over the limit, whether it declares a Content-Length or streams chunks."""

    def __init__(self, app: ASGIApp, *, json_limit: int, file_limit: int) -> None:
        self.app, self.json_limit, self.file_limit = app, json_limit, file_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_file = scope["path"] == "/v1/files"
        limit, field = (self.file_limit, "file") if is_file else (self.json_limit, "request body")
        declared = dict(scope["headers"]).get(b"content-length")
        too_big = _error(413, f"{field} is over the limit of {limit:,} bytes", type_="invalid_request_error",
                         param=field, code="limit_exceeded")
        if declared is not None and int(declared) > limit + (64 * 1024 if is_file else 0):
            await too_big(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit + (64 * 1024 if is_file else 0):  # multipart framing around the file
                raise _TooLarge
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _TooLarge:
            await too_big(scope, receive, send)


class _TooLarge(Exception):
    pass


class MetricsMiddleware:
    """Request counts and latency by route template; plain ASGI (BaseHTTPMiddleware costs ~1 ms)."""

    def __init__(self, app: ASGIApp, *, requests: Counter, latency: Histogram) -> None:
        self.app, self.requests, self.latency = app, requests, latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.latency.labels(scope["method"], route).observe(time.perf_counter() - t0)
            self.requests.labels(scope["method"], route, str(status)).inc()


def create_app(settings: Settings) -> FastAPI:
    app = FastAPI(title="yue2-jobs", version="0.1.0")
    sessions = session_factory(settings.resolved_database_url)
    app.state.yue2 = AppState(
        settings=settings, sessions=sessions, job_reader=JobReader(settings.resolved_database_url, sessions),
        storage=storage_from_url(settings.resolved_storage_url, endpoint_url=settings.s3_endpoint_url,
                                 region=settings.s3_region),
        celery=make_celery(settings))
    registry = CollectorRegistry()
    requests = Counter("yue2_api_requests", "API requests", ["method", "route", "status"], registry=registry)
    latency = Histogram("yue2_api_request_seconds", "API request latency", ["method", "route"], registry=registry,
                        buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
    jobs_by_status = Gauge("yue2_jobs", "Jobs in Postgres by status", ["status"], registry=registry)

    app.add_middleware(MetricsMiddleware, requests=requests, latency=latency)  # type: ignore[arg-type]
    app.add_middleware(BodyLimitMiddleware, json_limit=settings.max_request_bytes,  # type: ignore[arg-type]
                       file_limit=settings.max_file_bytes)

    @app.exception_handler(PipelineError)
    async def pipeline_error(_: Request, exc: PipelineError) -> JSONResponse:
        if isinstance(exc, InvalidRequestError):
            return _error(exc.status, str(exc), type_="invalid_request_error", param=exc.field, code=exc.code)
        if isinstance(exc, NotFoundError):
            return _error(404, str(exc), type_="not_found_error")
        if isinstance(exc, AuthError):
            return _error(401, str(exc), type_="authentication_error")
        if isinstance(exc, ConflictError):
            return _error(409, str(exc), type_="conflict_error")
        if isinstance(exc, StorageError) or exc.retryable:
            return _error(503, str(exc), type_="service_unavailable")
        return _error(500, str(exc), type_="server_error")

    @app.exception_handler(OperationalError)
    async def database_unavailable(_: Request, exc: OperationalError) -> JSONResponse:
        # foreign error translated at the boundary: the caller may retry
        return _error(503, f"database unavailable: {type(exc.orig).__name__}", type_="service_unavailable")

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"] if p != "body") or "body"
        return _error(422, f"{field}: {err['msg']}", type_="invalid_request_error", param=field)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        state: AppState = app.state.yue2
        checks: dict[str, str] = {}
        try:
            with state.sessions() as session:
                session.execute(text("SELECT 1"))
            checks["database"] = "ok"
        except Exception as exc:
            checks["database"] = f"error: {type(exc).__name__}"
        try:
            with state.celery.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
            checks["broker"] = "ok"
        except Exception as exc:
            checks["broker"] = f"error: {type(exc).__name__}"
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"status": "ok" if ok else "degraded", **checks}, 200 if ok else 503)

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        with app.state.yue2.sessions() as session:
            for status, n in session.execute(select(Job.status, func.count()).group_by(Job.status)).all():
                jobs_by_status.labels(status).set(n)
        return PlainTextResponse(generate_latest(registry).decode(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(jobs.router)
    app.include_router(batches.router)
    app.include_router(experiments.router)
    return app
