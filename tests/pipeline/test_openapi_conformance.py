"""Schemathesis against the live API (uvicorn on 127.0.0.1, the real Postgres, Redis and moto): every
operation of /openapi.json gets generated requests, valid and not, with a valid API key, and every
response must conform to the document (status codes, content types, headers, bodies) and never be a
5xx. Bounded: a fixed number of cases per operation, derandomized (the same cases every run).

Webhook registration is left out: a generated URL may name a public host, which the API would
resolve (DNS beyond this machine) and, were it public, register for deliveries; its URL rules have
their own tests on loopback (tests/pipeline/test_webhooks.py).
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
import redis

from tests.pipeline.conftest import ApiServer, make_settings, new_key

CASES_PER_OPERATION = 15
SKIPPED = {("POST", "/v1/webhooks")}


@pytest.fixture(scope="module")
def conformance_api(pipeline_env: dict[str, str]) -> Any:
    """The API on its own Redis database (db 7, flushed after), so no worker runs what it creates."""
    settings = make_settings(pipeline_env, broker_url=pipeline_env["YUE2_BROKER_URL"].rsplit("/", 1)[0] + "/7")
    server = ApiServer(settings)
    yield settings, server
    server.stop()
    redis.Redis.from_url(settings.broker_url).flushdb()


def test_every_response_conforms_to_the_openapi_document(conformance_api: Any) -> None:
    import hypothesis
    import schemathesis
    from hypothesis import HealthCheck, Phase
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        positive_data_acceptance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    # The response conformance checks, no 5xx, schema-invalid requests refused with a 4xx, and
    # schema-valid ones accepted (or a 404/409 for an id or a state the request cannot know).
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
              response_schema_conformance, negative_data_rejection, positive_data_acceptance]
    settings, server = conformance_api
    auth = {"Authorization": f"Bearer {new_key(settings, f't-{uuid.uuid4().hex[:8]}')}"}
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    failures: list[str] = []
    calls = 0
    operations = 0
    statuses: Counter[int] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in SKIPPED:
            continue
        operations += 1

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(max_examples=CASES_PER_OPERATION, derandomize=True, deadline=None, database=None,
                             phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            nonlocal calls
            calls += 1
            response = case.call(headers=auth, timeout=30)
            statuses[response.status_code] += 1
            # Two rules the document cannot state: an `after` that names none of the tenant's objects
            # is a 400 (unknown_cursor), and an experiment's arms must be different variants. Such
            # a request is checked for everything but its acceptance.
            arms = [a.get("variant") for a in case.body.get("variants", []) if isinstance(a, dict)] \
                if case.path == "/v1/experiments" and isinstance(case.body, dict) \
                and isinstance(case.body.get("variants"), list) else []
            unstated = "after" in (case.query or {}) or len(set(arms)) < len(arms)
            try:
                case.validate_response(response, checks=[c for c in checks if not (
                    unstated and c is positive_data_acceptance)], headers=auth)
            except (AssertionError, BaseExceptionGroup) as exc:  # collected, so one run reports them all
                failures.append(f"{case.method} {case.path} -> {response.status_code}: "
                                f"{str(exc)[:600]}")

        run()
    print(f"schemathesis: {calls} requests over {operations} operations, {len(failures)} failures; "
          f"statuses {dict(sorted(statuses.items()))}")
    assert calls >= 200 and not failures, "\n\n".join(failures[:20])
    assert sum(n for code, n in statuses.items() if code < 300) >= 20, "too few requests were accepted to test much"
