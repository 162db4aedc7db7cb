"""The OpenAPI document describes what the API sends: the OpenAI error shape for every 4xx and 503
of every /v1 route, and a typed body for POST /v1/jobs (its live conformance is checked by
tests/conformance/test_openapi_conformance.py)."""

from __future__ import annotations

from pathlib import Path

from yue2_jobs.api.app import create_app
from yue2_jobs.core.config import Settings


def test_every_v1_route_documents_its_errors_and_jobs_have_a_typed_body(tmp_path: Path) -> None:
    doc = create_app(Settings(home=tmp_path)).openapi()
    error = {"$ref": "#/components/schemas/Error"}
    operations = [(path, method, op) for path, ops in doc["paths"].items() if path.startswith("/v1/")
                  for method, op in ops.items()]
    assert len(operations) >= 20
    for path, method, op in operations:
        for code in ("400", "401", "404", "409", "413", "422", "431", "503"):
            assert op["responses"][code]["content"]["application/json"]["schema"] == error, (method, path, code)
    body = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["anyOf"] == [{"$ref": f"#/components/schemas/{name}Job"} for name in ("Summarize", "Generate",
                                                                                       "Render")]
    schemas = doc["components"]["schemas"]
    summarize, generate, render = (schemas[f"{n}Job"] for n in ("Summarize", "Generate", "Render"))
    assert summarize["required"] == ["input"] and generate["required"] == ["kind", "prompt"]
    assert render["required"] == ["kind", "text"] and render["properties"]["kind"] == {"const": "render_font"}
    assert summarize["properties"]["input"]["maxLength"] == 100_000  # the server's limits, from its settings
    assert summarize["properties"]["variant"]["anyOf"][0] == {"enum": ["base", "legal"]}
    assert "HTTPValidationError" not in doc["components"]["schemas"]  # a shape this API never sends
