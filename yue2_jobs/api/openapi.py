"""The OpenAPI document as the API behaves: every route's error responses in the OpenAI error shape
the API sends (FastAPI documents only its own 422 shape, which this API never sends), and the typed
body of POST /v1/jobs, built from the models `jobs.params.validate_job` checks it against and the
server's limits (the route keeps that validation, so a batch line and a job say the same thing)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from yue2_jobs.core.config import Settings

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
    408: "The request body was not complete in time after its headers; the connection is closed.",
    409: "The object's state forbids it, or an Idempotency-Key was used for another request.",
    413: "The body, or a field, is over its limit (the message names the limit).",
    422: "A field fails validation (the message names it).",
    429: "The tenant has its limit of requests in flight (YUE2_TENANT_MAX_IN_FLIGHT); retry after Retry-After.",
    431: "The request headers are over the limit.",
    503: "The database, the broker or storage is unavailable; retry later.",
}
ALL = tuple(WHY)
# Routes outside /v1 answer fewer errors: /healthz only its own 503, /metrics its 401 and 404.
OUTSIDE_V1 = {"/healthz": (413, 431, 503), "/metrics": (401, 404, 413, 431)}


# /healthz's own body, with 200 (ok) and 503 (degraded): each part's state, and the variants whose
# jobs wait with no live worker.
HEALTH = {
    "type": "object", "required": ["status", "database", "broker", "storage"],
    "properties": {
        "status": {"type": "string", "enum": ["ok", "degraded"]},
        "database": {"type": "string"}, "broker": {"type": "string"}, "storage": {"type": "string"},
        "variants_without_workers": {"type": "array", "items": {"type": "string"}},
        "variants_stalled": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["queued", "workers_down"],
            "properties": {"queued": {"type": "integer"}, "workers_down": {"type": "integer"}}}},
        "problems": {"type": "array", "items": {"type": "string"}},
    },
}


def _error_response(code: int) -> dict[str, Any]:
    schema = {"$ref": "#/components/schemas/Error"}
    return {"description": WHY[code], "content": {"application/json": {"schema": schema}}}


# A text that is not blank: a character that is neither whitespace (ECMA's \s, plus what Python's
# str.strip() also strips) nor NUL. (Every `SafeStr` field's own schema already refuses NUL.)
NOT_BLANK = r"^[^\x00]*[^\s\x00-\x1f\x85][^\x00]*$"


def _text(limit: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": limit, "pattern": NOT_BLANK}


def _job_bodies(settings: Settings) -> dict[str, Any]:
    """The three bodies POST /v1/jobs accepts, as exactly as JSON Schema can say it: what
    `validate_job` refuses, each schema refuses too (and the reverse)."""
    from yue2_jobs.decode.params import GREEDY_ONLY_MODES
    from yue2_jobs.fonts.params import RenderBody
    from yue2_jobs.jobs.params import JobBody

    def job(kind: str, text_field: str) -> dict[str, Any]:
        schema = JobBody.model_json_schema()
        props = schema["properties"]
        props.update(variant={"anyOf": [{"enum": sorted(settings.checkpoints)}, {"type": "null"}]},
                     max_new_tokens={"anyOf": [{"type": "integer", "minimum": 1,
                                                "maximum": settings.max_new_tokens_limit}, {"type": "null"}]})
        props[text_field] = _text(settings.max_input_chars)
        props["kind"] = {"enum": [kind, None]} if kind == "summarize" else {"const": kind}
        schema["required"] = [text_field] if kind == "summarize" else ["kind", text_field]
        schema["title"] = f"{kind.capitalize()}Job"
        # Sampling needs a mode that samples (ar, hybrid or auto).
        schema["not"] = {"required": ["do_sample", "mode"], "properties": {
            "do_sample": {"const": True}, "mode": {"enum": list(GREEDY_ONLY_MODES)}}}
        return schema

    render = RenderBody.model_json_schema()
    render["properties"].update(kind={"const": "render_font"}, text=_text(settings.render_max_chars))
    render["required"] = ["kind", "text"]
    render["title"] = "RenderJob"
    return {"SummarizeJob": job("summarize", "input"), "GenerateJob": job("generate", "prompt"),
            "RenderJob": render}


def _narrow_parameters(operation: dict[str, Any]) -> None:
    """List parameters as the listing code checks them (`db.listing`, `jobs.files`)."""
    from yue2_jobs.api.idempotency import MAX_KEY_CHARS
    from yue2_jobs.db.listing import DEFAULT_LIMIT, MAX_LIMIT
    from yue2_jobs.jobs.files import PURPOSES

    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "header" and parameter["name"] == "Idempotency-Key":  # api.idempotency
            parameter["schema"] = {"type": "string", "pattern": f"^[!-~]{{1,{MAX_KEY_CHARS}}}$"}
        if parameter.get("in") != "query":
            continue
        if parameter["name"] == "limit":
            parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}
        elif parameter["name"] == "purpose":
            parameter["schema"] = {"anyOf": [{"enum": list(PURPOSES)}, {"type": "null"}]}


def build(app: FastAPI) -> dict[str, Any]:
    from yue2_jobs.jobs.params import ENDPOINTS

    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    settings: Settings = app.state.yue2.settings
    components["Error"] = ERROR
    bodies = _job_bodies(settings)
    components.update(bodies)
    for path, operations in schema["paths"].items():
        codes = OUTSIDE_V1.get(path, ALL)
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for code in codes:
                responses[str(code)] = _error_response(code)
            _narrow_parameters(operation)
    health = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}}
    components["Health"] = HEALTH
    schema["paths"]["/healthz"]["get"]["responses"].update({
        "200": {"description": "Every part answers, and no variant's jobs wait with no live worker.", **health},
        "503": {"description": "Degraded: a part does not answer, or a variant's jobs have waited "
                "YUE2_HEALTH_STALL_S with no live worker (`problems` says which).", **health}})
    # The routes check these in their own words; the document states the same rules.
    upload = components["Body_upload_file_v1_files_post"]["properties"]
    upload["purpose"] = {"type": "string", "enum": ["batch"], "title": "Purpose"}
    components["Body_upload_file_v1_files_post"]["additionalProperties"] = False  # other fields: a 400
    batch = components["BatchCreate"]["properties"]
    batch["endpoint"] = {"type": "string", "enum": sorted(ENDPOINTS), "title": "Endpoint"}
    batch["completion_window"] = {"type": "string", "enum": ["24h"], "default": "24h", "title": "Completion Window"}
    # An experiment's arms are distinct served variants (`experiments.service`).
    components["Arm"]["properties"]["variant"] = {"type": "string", "enum": sorted(settings.checkpoints)}
    arms = components["ExperimentCreate"]["properties"]["variants"]
    arms["maxItems"] = min(arms.get("maxItems", len(settings.checkpoints)), len(settings.checkpoints))
    schema["paths"]["/v1/jobs"]["post"]["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {
            "description": "A summarize job (the default kind), a generate job or a render job.",
            "anyOf": [{"$ref": f"#/components/schemas/{name}"} for name in bodies]}}}}
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

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to replace the document
