"""JSON shapes the API returns: jobs (ours), files and batches (OpenAI's)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from yue2_jobs.db.models import Experiment, File, Job, JobStatus
from yue2_jobs.db.models_api import WebhookDelivery, WebhookEndpoint
from yue2_jobs.jobs.batch_service import BatchState
from yue2_jobs.jobs.batches import line_error
from yue2_jobs.jobs.keys import file_key
from yue2_jobs.jobs.outputs import decoding, facts_of, usage
from yue2_jobs.storage import Storage


def ts(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


def job_view(job: Job, *, storage: Storage, presign_expiry_s: int) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": job.id, "object": "yue2.job", "kind": job.kind, "status": job.status, "custom_id": job.custom_id,
        "batch_id": job.batch_id, "variant": job.variant, "checkpoint": job.checkpoint,
        "weights_sha256": job.weights_sha256, "params": job.params,
        "attempts": job.attempts, "error": job.error, "worker": job.worker,
        "created_at": ts(job.created_at), "started_at": ts(job.started_at), "finished_at": ts(job.finished_at),
        "input_truncated": bool(job.input_truncated),
        "usage": usage(input_tokens=job.input_tokens, input_tokens_used=job.input_tokens_used,
                       output_tokens=job.output_tokens),
        # As the job's output line says it (one rule for `decoding.mode`), plus tokens per decoder step.
        "decoding": {**decoding(facts_of(job)),
                     "tau": round(job.output_tokens / job.decoder_steps, 3)
                     if job.output_tokens and job.decoder_steps else None},
        "output": None, "output_url": None,
    }
    if job.status == JobStatus.SUCCEEDED and job.output_key:
        if job.output_text is not None:
            view["output"] = job.output_text
        view["output_url"] = storage.url(job.output_key, expires_s=presign_expiry_s)
        if job.kind == "render_font":  # the images beside the JSON
            fmt = job.params.get("output", "both")
            view["output"] = None
            view["files"] = {suffix: storage.url(file_key(job.output_key, suffix), expires_s=presign_expiry_s)
                             for suffix in ("svg", "png") if fmt in (suffix, "both")}
    return view


def batch_job_view(job: Job, *, storage: Storage, presign_expiry_s: int) -> dict[str, Any]:
    """A batch's job as the console's line browser lists it: the job, with the error its line has in
    the error file (a line cancelled before it ran has none stored)."""
    view = job_view(job, storage=storage, presign_expiry_s=presign_expiry_s)
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        view["error"] = line_error(job.error)
    return view


def file_view(f: File) -> dict[str, Any]:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": ts(f.created_at), "filename": f.filename,
            "purpose": f.purpose, "status": "processed", "status_details": None}


def batch_view(state: BatchState) -> dict[str, Any]:
    b, counts = state.batch, state.counts
    view: dict[str, Any] = {
        "id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": b.errors, "input_file_id": b.input_file_id,
        "completion_window": b.completion_window, "status": b.status, "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id, "created_at": ts(b.created_at), "in_progress_at": ts(b.in_progress_at),
        "expires_at": ts(b.expires_at), "finalizing_at": ts(b.finalizing_at), "completed_at": ts(b.completed_at),
        "failed_at": ts(b.failed_at), "expired_at": ts(b.expired_at), "cancelling_at": ts(b.cancelling_at),
        "cancelled_at": ts(b.cancelled_at),
        # Lines that will never run (cancelled, or expired) count as failed, as OpenAI counts them:
        # they are in the error file, and once the batch ends completed + failed = total.
        "request_counts": {"total": counts["total"], "completed": counts["completed"],
                           "failed": counts["failed"] + counts["cancelled"]},
        "metadata": b.metadata_, "experiment_id": b.experiment_id,
    }
    if state.warnings:
        view["warnings"] = state.warnings
    return view


def list_view(data: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """OpenAI's list object."""
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def webhook_view(endpoint: WebhookEndpoint, *, with_secret: bool = False) -> dict[str, Any]:
    view = {"id": endpoint.id, "object": "webhook_endpoint", "url": endpoint.url, "events": endpoint.events,
            "event_types": endpoint.events, "description": endpoint.description, "name": endpoint.description,
            "created_at": ts(endpoint.created_at), "signing_secret_hint": endpoint.secret[:10] + "..."}
    if with_secret:  # only in the answer to its creation; `signing_secret` is the openai client's name
        view["secret"] = view["signing_secret"] = endpoint.secret
    return view


def delivery_view(d: WebhookDelivery) -> dict[str, Any]:
    return {"id": d.id, "object": "webhook_delivery", "webhook_id": d.event_id, "event_type": d.event_type,
            "status": d.status, "attempts": d.attempts, "next_attempt_at": ts(d.next_attempt_at),
            "delivered_at": ts(d.delivered_at), "created_at": ts(d.created_at), "log": d.attempt_log,
            "payload": d.payload}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


def experiment_view(exp: Experiment) -> dict[str, Any]:
    return {"id": exp.id, "object": "yue2.experiment", "name": exp.name, "mode": exp.mode,
            "variants": exp.arms["variants"], "control": exp.arms["variants"][0]["variant"],
            "created_at": ts(exp.created_at)}
