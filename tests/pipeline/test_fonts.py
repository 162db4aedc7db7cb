"""Render jobs on the shared pipeline (API, batches, Postgres, Redis, moto S3), on their own CPU
queue: a `fonts` worker renders them while no model worker runs at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from tests.pipeline.conftest import ROOT, new_key
from tests.pipeline.test_e2e import batch_jobs, result_lines, wait_batch
from yue2_jobs.client import ApiError, Client
from yue2_jobs.db.models import JobStatus
from yue2_jobs.fonts.render import RenderParams, render


def s3_object(s3: dict[str, str], key: str) -> tuple[bytes, str]:
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1")
    obj = client.get_object(Bucket=s3["bucket"], Key=f"out/{key}")
    return obj["Body"].read(), obj["ContentType"]


def test_render_jobs_run_on_the_fonts_queue_and_bad_items_fail_alone(
        api: Any, workers: Any, settings: Any, s3: dict[str, str], tmp_path: Path) -> None:
    key = new_key(settings, f"t-{uuid.uuid4().hex[:8]}")
    client = Client(api.url, key)
    worker = workers("--variant", "fonts")  # the only worker: no model worker is running
    lines = [{"custom_id": f"s{i}", "body": {"text": "你好，世界 Hello", "style": style, "pen_pressure": i / 3}}
             for i, style in enumerate(("print", "handwritten", "calligraphy", "rounded"))]
    lines += [{"custom_id": "missing", "body": {"text": "ok ✓ 😀"}},  # no font draws two of these
              {"custom_id": "svg-only", "body": {"text": "床前明月光", "output": "svg", "wrap_width": 128}},
              {"custom_id": "huge", "body": {"text": "永" * 2000, "font_size": 256, "wrap_width": 4096}}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({**ln, "method": "POST", "url": "/v1/render_font"}, ensure_ascii=False) + "\n"
                            for ln in lines))
    batch = client.create_batch(client.upload(path)["id"], endpoint="/v1/render_font")
    state = wait_batch(client, batch["id"], timeout=300, worker=worker)
    assert state["request_counts"] == {"total": 7, "completed": 5, "failed": 2}, worker.tail()
    jobs = {j.custom_id: j for j in batch_jobs(settings, batch["id"])}
    assert {j.variant for j in jobs.values()} == {"fonts"} and jobs["s0"].checkpoint.startswith("fonts@")
    assert jobs["missing"].status == JobStatus.FAILED
    assert "no font has a glyph for 2 character(s): U+2713 '✓', U+1F600 '😀'" in jobs["missing"].error["message"]
    assert jobs["huge"].status == JobStatus.FAILED and "over the limit of" in jobs["huge"].error["message"]

    out = {ln["custom_id"]: ln["response"]["body"] for ln in result_lines(client, state["output_file_id"])}
    assert set(out) == {"s0", "s1", "s2", "s3", "svg-only"}
    for i, style in enumerate(("print", "handwritten", "calligraphy", "rounded")):
        body = out[f"s{i}"]
        assert body["render"]["style"] == style and body["render"]["glyphs"] == 10
        direct = render(RenderParams(text="你好，世界 Hello", style=style, pen_pressure=i / 3))
        png, ctype = s3_object(s3, body["files"]["png"])
        assert ctype == "image/png" and png == direct.png  # the worker's bytes are the renderer's
        svg, ctype = s3_object(s3, body["files"]["svg"])
        assert ctype == "image/svg+xml" and svg.decode() == direct.svg
    assert set(out["svg-only"]["files"]) == {"svg"} and out["svg-only"]["render"]["lines"] > 1

    # GET /v1/jobs/{id} gives presigned URLs for the images; the API serves them too.
    view = client.job(jobs["s1"].id)
    assert set(view["files"]) == {"svg", "png"}
    png_s1 = s3_object(s3, out["s1"]["files"]["png"])[0]
    assert httpx.get(view["files"]["png"], timeout=10).content == png_s1
    assert client.job_file(jobs["s1"].id, "png") == png_s1
    for job_id, suffix, status in ((jobs["svg-only"].id, "png", 404), (jobs["missing"].id, "svg", 409),
                                   (jobs["s1"].id, "gif", 404)):
        with pytest.raises(ApiError) as err:
            client.job_file(job_id, suffix)
        assert err.value.status == status, (job_id, suffix)
    other = Client(api.url, new_key(settings, "another-tenant"))
    with pytest.raises(ApiError) as err:
        other.job_file(jobs["s1"].id, "png")
    assert err.value.status == 404

    # The CLI saves every image of the batch by custom_id.
    env = {**os.environ, "YUE2_API_URL": api.url, "YUE2_API_KEY": key}
    done = subprocess.run([sys.executable, "-m", "yue2_jobs", "results", batch["id"], "-o", str(tmp_path / "out.jsonl"),
                           "--files", str(tmp_path / "images")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == sorted(
        [f"s{i}.{x}" for i in range(4) for x in ("png", "svg")] + ["svg-only.svg"])
    assert (tmp_path / "images" / "s1.png").read_bytes() == png_s1


def test_render_job_limits_name_their_field(client: Client) -> None:
    for body, field in (({"kind": "render_font", "text": "x", "stroke_width": 21}, "stroke_width"),
                        ({"kind": "render_font", "text": "x", "pen_pressure": 1.5}, "pen_pressure"),
                        ({"kind": "render_font", "text": "x", "style": "gothic"}, "style"),
                        ({"kind": "render_font", "text": "x", "color": "red"}, "color"),
                        ({"kind": "render_font", "text": "x", "font_size": 1000}, "font_size"),
                        ({"kind": "render_font", "text": "  "}, "text"),
                        ({"kind": "render_font", "text": "x" * 2001}, "text"),
                        ({"kind": "render_font", "text": "x", "temperature": 0.5}, "temperature")):
        with pytest.raises(ApiError) as err:
            client.submit_job(body)
        assert err.value.status in (413, 422) and err.value.param == field, (body, err.value)
    job = client.submit_job({"kind": "render_font", "text": "好"})
    assert job["variant"] == "fonts" and job["status"] == "queued"


def test_render_batches_cannot_run_under_an_experiment(client: Client, tmp_path: Path) -> None:
    exp = client.create_experiment(variants=[{"variant": "base"}, {"variant": "legal"}], mode="paired")
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "body": {"text": "好"}}) + "\n")
    with pytest.raises(ApiError) as err:
        client.create_batch(client.upload(path)["id"], endpoint="/v1/render_font", experiment_id=exp["id"])
    assert err.value.status == 400 and err.value.param == "experiment_id"
