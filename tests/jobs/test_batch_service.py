"""The batch list as the console pages and searches it (`GET /v1/batches?search=`), on the
embedded stack: a case-insensitive match on the id, `metadata.name` or `metadata.source`, in which
% and _ are plain characters, paged by the same cursor as the unfiltered list."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.jobs.conftest import Submit

LINE = [{"custom_id": "a", "body": {"input": "text"}}]


def _search(client: TestClient, text: str, **params: Any) -> tuple[list[str], bool]:
    r = client.get("/v1/batches", params={"search": text, **params})
    assert r.status_code == 200, r.text
    return [b["id"] for b in r.json()["data"]], r.json()["has_more"]


def test_search_matches_the_name_source_or_id_whatever_the_case(api: tuple[TestClient, Any], submit: Submit) -> None:
    client, _ = api
    nightly = submit(LINE, {"name": "Nightly contracts"})
    nightly_retry = submit(LINE, {"name": "nightly contracts, again"})
    demo = submit(LINE, {"source": "make demo"})
    done = submit(LINE, {"name": "100% done_ok"})
    plain = submit(LINE)
    assert _search(client, "NIGHTLY") == ([nightly_retry, nightly], False)  # newest first, as the list
    assert _search(client, "demo") == ([demo], False)
    assert _search(client, plain[-12:].upper()) == ([plain], False)  # a piece of the id
    assert _search(client, "%") == ([done], False) and _search(client, "e_o") == ([done], False)  # no wildcards
    assert _search(client, "no such batch") == ([], False)
    assert len(client.get("/v1/batches", params={"search": ""}).json()["data"]) == 5  # empty: no filter
    first, more = _search(client, "nightly", limit=1)  # pages with the list's own cursor
    assert (first, more) == ([nightly_retry], True)
    assert _search(client, "nightly", limit=1, after=first[0]) == ([nightly], False)


def test_a_search_longer_than_a_metadata_value_is_refused_naming_the_limit(api: tuple[TestClient, Any]) -> None:
    client, _ = api
    r = client.get("/v1/batches", params={"search": "x" * 513})
    assert r.status_code == 400 and r.json()["error"]["param"] == "search", r.text
    assert "513" in r.json()["error"]["message"] and "512" in r.json()["error"]["message"]
    assert client.get("/v1/batches", params={"search": "x" * 512}).status_code == 200
    r = client.get("/v1/batches", params={"limit": 500})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit" and "100" in r.json()["error"]["message"]


def test_a_search_with_a_nul_is_refused_naming_the_field(api: tuple[TestClient, Any]) -> None:
    # As every text field: on Postgres a NUL would otherwise come back as a 400 naming nothing.
    client, _ = api
    r = client.get("/v1/batches", params={"search": "night\x00ly"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "search" and "NUL" in error["message"] and "position 5" in error["message"], error
