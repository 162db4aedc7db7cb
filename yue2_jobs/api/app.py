"""The FastAPI app: routes, request limits, error translation, /healthz and /metrics."""

from __future__ import annotations

import hmac
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DataError, IntegrityError, OperationalError, ProgrammingError
from starlette.exceptions import HTTPException as StarletteHTTPException

from yue2_jobs.api.deps import AppState, InFlight
from yue2_jobs.api.idempotency import Owner
from yue2_jobs.api.job_reader import JobReader
from yue2_jobs.api.middleware import BodyLimitMiddleware, HeaderLimitMiddleware, MetricsMiddleware, error_response
from yue2_jobs.api.openapi import install as install_openapi
from yue2_jobs.api.revocations import start_listener
from yue2_jobs.api.routes import batches, console, experiments, files, jobs, webhooks
from yue2_jobs.core.config import Settings
from yue2_jobs.core.safe import MAX_JSON_DEPTH
from yue2_jobs.db.models import CheckpointState, CheckpointVersion, Job
from yue2_jobs.db.session import NO_SCHEMA, is_missing_schema, session_factory
from yue2_jobs.errors import (
    AuthError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PipelineError,
    StorageError,
    StorageUnavailableError,
    TooManyRequestsError,
)
from yue2_jobs.jobs.capacity import stalled, unserved
from yue2_jobs.queue import make_celery
from yue2_jobs.storage import storage_from_url

log = logging.getLogger("yue2.api")


def _pipeline_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PipelineError)
    if isinstance(exc, InvalidRequestError):
        return error_response(exc.status, str(exc), type_="invalid_request_error", param=exc.field, code=exc.code)
    if isinstance(exc, NotFoundError):
        return error_response(404, str(exc), type_="not_found_error")
    if isinstance(exc, AuthError):
        return error_response(401, str(exc), type_="authentication_error")
    if isinstance(exc, ConflictError):
        return error_response(409, str(exc), type_="conflict_error")
    if isinstance(exc, TooManyRequestsError):
        response = error_response(429, str(exc), type_="rate_limit_error", code="too_many_requests_in_flight")
        response.headers["Retry-After"] = str(exc.retry_after_s)
        return response
    if isinstance(exc, StorageError) or exc.retryable:
        return error_response(503, str(exc), type_="service_unavailable")
    return error_response(500, str(exc), type_="server_error")


def _install_error_handlers(app: FastAPI) -> None:
    """Foreign errors are translated here: whatever validation missed is a 4xx or a 503, never a 500."""
    app.add_exception_handler(PipelineError, _pipeline_error)

    @app.exception_handler(OperationalError)
    async def database_unavailable(_: Request, exc: OperationalError) -> JSONResponse:
        if is_missing_schema(exc):  # SQLite's "no such table"
            return error_response(503, NO_SCHEMA, type_="service_unavailable")
        return error_response(503, f"database unavailable: {type(exc.orig).__name__}", type_="service_unavailable")

    @app.exception_handler(ProgrammingError)
    async def database_not_migrated(_: Request, exc: ProgrammingError) -> JSONResponse:
        if is_missing_schema(exc):  # Postgres' undefined_table
            return error_response(503, NO_SCHEMA, type_="service_unavailable")
        return error_response(500, f"database error: {type(exc.orig).__name__}", type_="server_error")

    @app.exception_handler(DataError)
    async def unstorable_value(_: Request, exc: DataError) -> JSONResponse:
        return error_response(400, f"a value in the request cannot be stored: {type(exc.orig).__name__}",
                              type_="invalid_request_error", code="invalid_value")

    @app.exception_handler(IntegrityError)
    async def conflicting_value(_: Request, exc: IntegrityError) -> JSONResponse:
        return error_response(409, f"the request conflicts with stored data: {type(exc.orig).__name__}",
                              type_="conflict_error")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own 4xx (a body that is not JSON or nests too deep to parse, an unknown route)
        # in the same OpenAI shape as ours.
        body_error = exc.status_code == 400
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = _unknown_route(request.url.path)
        response = error_response(exc.status_code, message if not body_error else
                                  f"the request body is not valid JSON or nests more than {MAX_JSON_DEPTH} levels",
                                  type_="invalid_request_error" if exc.status_code < 500 else "server_error",
                                  param="body" if body_error else None)
        response.headers.update(exc.headers or {})
        if exc.status_code == 405 and (methods := _allowed_methods(request)):
            response.headers["Allow"] = ", ".join(methods)  # Starlette names only the first route that matched
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"] if p != "body") or "body"
        return error_response(422, f"{field}: {err['msg']}", type_="invalid_request_error", param=field)


HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _allowed_methods(request: Request) -> list[str]:
    """Every method the API's document gives the request's path (for a 405's `Allow`)."""
    methods: set[str] = set()
    for template, operations in request.app.openapi()["paths"].items():
        pattern = "".join("[^/]+" if part.startswith("{") else re.escape(part)
                          for part in re.split(r"(\{[^/}]+\})", template))
        if re.fullmatch(pattern, request.url.path):
            methods.update(m.upper() for m in operations if m in HTTP_METHODS)
    return sorted(methods)


def _unknown_route(path: str) -> str:
    """A 404's message: a path missing its /v1 (an OpenAI client whose base_url lacks it) says so."""
    if not path.startswith("/v1/") and path not in ("/healthz", "/metrics"):
        return (f"no route {path}: API paths start with /v1 (did you mean /v1{path}?); an OpenAI client's "
                "base_url must end in /v1, e.g. http://127.0.0.1:8000/v1")
    return f"no route {path}; see /docs for the API's routes"


def checkpoint_gauges(session: Any, versions: Gauge, refused: Gauge) -> None:
    """The registry's versions by state, and why each variant's latest refused version was refused."""
    versions.clear()
    refused.clear()
    for variant, state, n in session.execute(select(CheckpointVersion.variant, CheckpointVersion.state, func.count())
                                             .group_by(CheckpointVersion.variant, CheckpointVersion.state)).all():
        versions.labels(variant, state).set(n)
    latest: set[str] = set()
    for row in session.execute(select(CheckpointVersion).where(CheckpointVersion.state == CheckpointState.FAILED)
                               .order_by(CheckpointVersion.created_at.desc())).scalars():
        if row.variant not in latest:
            latest.add(row.variant)
            refused.labels(row.variant, row.version, (row.error or "")[:200]).set(1)


def _stalled_public(waiting: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, int]], list[str]]:
    """What /healthz says of stalled variants: counts only. It answers anyone, so a worker's load
    error (paths, hosts) stays in its status row (`yue2 workers`)."""
    counts = {v: {"queued": int(w["queued"]), "workers_down": len(w["workers_down"])} for v, w in waiting.items()}
    problems = [f"variant {v!r}: {c['queued']} job(s) queued and no live worker" +
                (f" ({c['workers_down']} worker(s) down: they cannot load the checkpoint; `yue2 workers` says why)"
                 if c["workers_down"] else "") for v, c in counts.items()]
    return counts, problems


def _health(state: AppState) -> JSONResponse:
    checks: dict[str, Any] = {}
    waiting: dict[str, dict[str, Any]] = {}
    try:
        with state.sessions() as session:
            session.execute(text("SELECT 1"))
            missing = unserved(session, state.settings.checkpoints)
            checks["variants_without_workers"] = missing
            waiting = stalled(session, missing, waiting_s=state.settings.health_stall_s)
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {NO_SCHEMA}" if is_missing_schema(exc) else f"error: {type(exc).__name__}"
    try:
        state.storage.check()
        checks["storage"] = "ok"
    except StorageUnavailableError as exc:
        log.warning("health check: %s", exc)
        checks["storage"] = "error: unreachable"
    except StorageError as exc:  # the summary names no bucket or path: /healthz answers anyone
        log.warning("health check: %s", exc)
        checks["storage"] = f"error: {exc.summary} (the API's log says which and how to fix it)"
    except Exception as exc:
        checks["storage"] = f"error: {type(exc).__name__}"
    try:
        with state.celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    # No worker for a variant is only reported while nothing waits for one; jobs queued for a variant
    # that no live worker serves (none started, or each down on a checkpoint it cannot load) degrade.
    ok = all(checks[part] == "ok" for part in ("database", "broker", "storage"))
    if checks["database"] == "ok" and waiting:
        checks["variants_stalled"], checks["problems"] = _stalled_public(waiting)
        ok = False
    return JSONResponse({"status": "ok" if ok else "degraded", **checks}, 200 if ok else 503)


def create_app(settings: Settings) -> FastAPI:
    app = FastAPI(title="yue2-jobs", version="0.1.0")
    sessions = session_factory(settings.resolved_database_url)
    app.state.yue2 = AppState(
        settings=settings, sessions=sessions, job_reader=JobReader(settings.resolved_database_url, sessions),
        storage=storage_from_url(settings.resolved_storage_url, endpoint_url=settings.s3_endpoint_url,
                                 region=settings.s3_region),
        celery=make_celery(settings), in_flight=InFlight(settings.tenant_max_in_flight),
        owner=Owner(settings.resolved_database_url))
    registry = CollectorRegistry()
    requests = Counter("yue2_api_requests", "API requests", ["method", "route", "status"], registry=registry)
    latency = Histogram("yue2_api_request_seconds", "API request latency", ["method", "route"], registry=registry,
                        buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
    jobs_by_status = Gauge("yue2_jobs", "Jobs in Postgres by status", ["status"], registry=registry)
    versions = Gauge("yue2_checkpoint_versions", "Checkpoint versions by variant and state", ["variant", "state"],
                     registry=registry)
    refused = Gauge("yue2_checkpoint_validation_failed", "1 for the latest version of each variant that failed "
                    "validation, with the reason (it never serves)", ["variant", "version", "reason"],
                    registry=registry)

    app.add_middleware(MetricsMiddleware, requests=requests, latency=latency)
    app.add_middleware(BodyLimitMiddleware, json_limit=settings.max_request_bytes, file_limit=settings.max_file_bytes,
                       json_timeout_s=settings.request_body_timeout_s, file_timeout_s=settings.file_body_timeout_s)
    app.add_middleware(HeaderLimitMiddleware, limit=settings.max_header_bytes)
    _install_error_handlers(app)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        return _health(app.state.yue2)

    @app.get("/metrics", response_model=None)
    def metrics(request: Request) -> Response:
        # Job counts span every tenant: only the operator's token may read them.
        token = settings.metrics_token
        sent = request.headers.get("authorization", "")
        if token is None:
            return error_response(404, "/metrics is off: set YUE2_METRICS_TOKEN to serve it", type_="not_found_error")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return error_response(401, "/metrics needs `Authorization: Bearer <YUE2_METRICS_TOKEN>`",
                                  type_="authentication_error")
        with app.state.yue2.sessions() as session:
            for status, n in session.execute(select(Job.status, func.count()).group_by(Job.status)).all():
                jobs_by_status.labels(status).set(n)
            checkpoint_gauges(session, versions, refused)
        return PlainTextResponse(generate_latest(registry).decode(), media_type=CONTENT_TYPE_LATEST)

    for routes in (jobs, files, batches, experiments, console):
        app.include_router(routes.router)
    app.include_router(webhooks.router, prefix="/v1/webhooks")
    app.include_router(webhooks.router, prefix="/v1/webhook_endpoints", include_in_schema=False)
    install_openapi(app)
    start_listener(settings.broker_url)  # revoked API keys leave this process's cache within a second
    return app
