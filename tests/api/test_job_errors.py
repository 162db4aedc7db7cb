"""POST /v1/jobs through the ASGI app on the embedded stack (SQLite, the filesystem queue, local
storage; no server): every refusal is a 4xx in the OpenAI error shape naming the field (`param`)
and, for a limit, the limit; a valid job is stored with its decoding parameters resolved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from yue2_jobs.api.app import create_app
from yue2_jobs.auth import create_api_key
from yue2_jobs.core.config import Settings
from yue2_jobs.db.migrate import upgrade_head
from yue2_jobs.db.session import session_factory


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    home = Path(tmp_path_factory.mktemp("api"))
    settings = Settings(home=home, max_input_chars=200, max_new_tokens_limit=64)
    upgrade_head(settings.resolved_database_url)
    with session_factory(settings.resolved_database_url)() as session:
        key = create_api_key(session, tenant="acme")
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as c:
        yield c


@pytest.mark.parametrize(("body", "status", "param", "text"), [
    ({"input": "x", "max_new_tokens": 65}, 422, "max_new_tokens", "over the limit of 64 tokens"),
    ({"input": "x" * 201}, 413, "input", "over the limit of 200 characters"),
    ({"input": ""}, 422, "input", "must not be empty"),
    ({"input": "x", "mode": "beam"}, 422, "mode", "'auto'"),
    ({"input": "x", "unknown": 1}, 422, "unknown", "Extra inputs"),
    ({"kind": "generate", "input": "x"}, 422, "prompt", "required for a generate job"),
    (["x"], 422, "body", "must be a JSON object"),
])
def test_a_bad_job_is_a_4xx_naming_its_field(client: TestClient, body: object, status: int, param: str,
                                             text: str) -> None:
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and text in error["message"] and error["type"] == "invalid_request_error"


def test_a_valid_job_is_stored_with_its_parameters_resolved(client: TestClient) -> None:
    r = client.post("/v1/jobs", json={"input": "Close the pool.", "mode": "ar"})
    assert r.status_code == 201, r.text
    job = client.get(f"/v1/jobs/{r.json()['id']}").json()
    assert job["status"] == "queued" and job["params"] == {"mode": "ar", "max_new_tokens": 48,
                                                           "long_input": "truncate"}
