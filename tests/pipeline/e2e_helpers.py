"""What the end-to-end tests share: direct decodes to compare against, batch files, waits, results."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import boto3
from sqlalchemy import select

from tests.pipeline.conftest import wait_for
from tests.shipped import shipped_base
from yue2_jobs.client import Client
from yue2_jobs.db.models import Job
from yue2_jobs.db.session import session_factory


@cache
def direct_summaries(texts: tuple[str, ...], mode: str = "hybrid") -> dict[str, str]:
    """What calling the model directly gives, without the pipeline."""
    from yue2_jobs.decode.params import DecodingParams
    from yue2_jobs.decode.session import DecodeSession

    model, tokenizer = shipped_base()
    unique = sorted(set(texts))
    session = DecodeSession(model, tokenizer=tokenizer)
    return dict(zip(unique, session.summarize(unique, DecodingParams(mode=mode)), strict=True))


def write_batch(path: Path, texts: list[str], *, prefix: str = "r") -> dict[str, str]:
    lines = [{"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/summarize", "body": {"input": t}}
             for i, t in enumerate(texts)]
    path.write_text("".join(json.dumps(ln, ensure_ascii=False) + "\n" for ln in lines))
    return {ln["custom_id"]: ln["body"]["input"] for ln in lines}


def submit(client: Client, path: Path) -> str:
    return client.create_batch(client.upload(path)["id"])["id"]


def wait_batch(client: Client, batch_id: str, *, timeout: float, worker: Any = None) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        state = client.batch(batch_id)
        return state if state["status"] in ("completed", "cancelled", "failed") else None

    try:
        return wait_for(done, timeout=timeout, what=f"batch {batch_id}", interval=0.25)
    except AssertionError:
        raise AssertionError(f"batch not done: {client.batch(batch_id)}\nworker log:\n"
                             f"{worker.tail() if worker else ''}") from None


def result_lines(client: Client, file_id: str | None) -> list[dict[str, Any]]:
    if not file_id:
        return []
    return [json.loads(ln) for ln in client.file_content(file_id).decode().splitlines()]


def batch_jobs(settings: Any, batch_id: str) -> list[Job]:
    with session_factory(settings.resolved_database_url)() as session:
        return list(session.execute(select(Job).where(Job.batch_id == batch_id)).scalars())


def count_outputs(s3: dict[str, str], tenant: str, batch_id: str) -> int:
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=s3["bucket"],
                                                             Prefix=f"out/{tenant}/{batch_id}/job_")
    return sum(1 for page in pages for obj in page.get("Contents", []) if obj["Key"].endswith(".json"))


def check_outputs(lines: list[dict[str, Any]], by_custom_id: dict[str, str]) -> None:
    expected = direct_summaries(tuple(by_custom_id.values()))
    counts = Counter(ln["custom_id"] for ln in lines)
    assert max(counts.values()) == 1, "a custom_id appears twice in the output file"
    assert set(counts) == set(by_custom_id)
    for ln in lines:
        assert ln["error"] is None and ln["response"]["status_code"] == 200
        assert ln["response"]["body"]["output"] == expected[by_custom_id[ln["custom_id"]]], ln["custom_id"]
