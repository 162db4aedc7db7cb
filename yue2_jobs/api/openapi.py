"""The OpenAPI document as the API behaves: every route's error responses in the OpenAI error shape
the API sends (FastAPI documents only its own 422 shape, which this API never sends), and the typed
body of POST /v1/jobs, built from the same models `jobs.params.validate_job` checks it against
(the route keeps its own validation so that a batch line and a job say the same thing)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"], "description": "the field at fault, when one is"},
                       "code": {"type": ["string", "null"]}}}},
}
WHY = {
    400: "Invalid request: a field, a cursor or an Idempotency-Key, or a body that is not JSON.",
    401: "No API key, or one that is unknown, revoked or expired.",
    404: "No such object for this tenant.",
    409: "The object's state forbids it, or an Idempotency-Key was used for another request.",
    413: "The body, or a field, is over its limit (the message names the limit).",
    422: "A field fails validation (the message names it).",
    431: "The request headers are over the limit.",
    503: "The database, the broker or storage is unavailable; retry later.",
}
ALL = tuple(WHY)
# Routes outside /v1 answer fewer errors: /healthz only its own 503, /metrics its 401 and 404.
OUTSIDE_V1 = {"/healthz": (413, 431, 503), "/metrics": (401, 404, 413, 431)}


def _error_response(code: int) -> dict[str, Any]:
    schema = {"$ref": "#/components/schemas/Error"}
    return {"description": WHY[code], "content": {"application/json": {"schema": schema}}}


def _job_body_schemas() -> dict[str, Any]:
    from yue2_jobs.fonts.params import RenderBody
    from yue2_jobs.jobs.params import JobBody

    return {"JobBody": JobBody.model_json_schema(ref_template="#/components/schemas/{model}"),
            "RenderBody": RenderBody.model_json_schema(ref_template="#/components/schemas/{model}")}


def build(app: FastAPI) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR
    components.update(_job_body_schemas())
    for path, operations in schema["paths"].items():
        codes = OUTSIDE_V1.get(path, ALL)
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for code in codes:
                responses[str(code)] = _error_response(code)
    schema["paths"]["/v1/jobs"]["post"]["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {
            "description": "A summarize or generate job (JobBody), or a render job (RenderBody, kind render_font).",
            "anyOf": [{"$ref": "#/components/schemas/JobBody"}, {"$ref": "#/components/schemas/RenderBody"}]}}}}
    # FastAPI's validation-error shapes are referenced by nothing now.
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    return schema


def install(app: FastAPI) -> None:
    """Serve `build(app)` at /openapi.json (computed once)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
