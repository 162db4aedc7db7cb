"""A succeeded job's output JSON: built from plain values (by the worker that ran it, and by the
batch finalizer) and its text read back, inline or from storage."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from yue2_jobs.storage import Storage


@dataclass(frozen=True)
class OutputFacts:
    """What a job's output JSON says beside the text: who ran it, how, at what token cost."""

    job_id: str
    kind: str
    custom_id: str | None
    variant: str
    checkpoint: str | None
    mode: str | None  # `decoding.mode`: the row's `decoded_mode` (see `decoding`)
    input_tokens: int | None
    input_tokens_used: int | None
    output_tokens: int | None
    decoder_steps: int | None
    nar_tokens: int | None
    chunks: int | None
    input_truncated: bool


def usage(*, input_tokens: int | None, input_tokens_used: int | None, output_tokens: int | None
          ) -> dict[str, int | None]:
    """Token counts: the input's, how much of it the encoder read (less when truncated), the output's."""
    return {"input_tokens": input_tokens, "input_tokens_used": input_tokens_used, "output_tokens": output_tokens}


def output_body(facts: OutputFacts, text: str) -> dict[str, Any]:
    """The JSON a succeeded job produced: stored at its output key and inlined in API answers."""
    return {"id": facts.job_id, "object": f"yue2.{facts.kind}", "custom_id": facts.custom_id,
            "variant": facts.variant, "checkpoint": facts.checkpoint, "output": text,
            "input_truncated": facts.input_truncated,
            "usage": usage(input_tokens=facts.input_tokens, input_tokens_used=facts.input_tokens_used,
                           output_tokens=facts.output_tokens),
            "decoding": decoding(facts)}


def decoding(facts: OutputFacts) -> dict[str, Any]:
    """`decoding` as a job's output JSON (stored, and its batch output line) and its view (GET
    /v1/jobs/{id}, which adds `tau`) all give it, so they cannot disagree.

    `mode` is the mode that ran, as the worker recorded it in `decoded_mode` (what `auto` resolved
    to: `ar` or `hybrid`), and null where none is recorded (a job that has not run, a row from
    before migration 0004, a runner that reports no mode). Never the mode asked for: `params.mode`
    already says that, and `auto`, the default, is never a mode that ran (docs/api.md: "the job
    reports the mode that ran as `decoding.mode`")."""
    return {"mode": facts.mode, "decoder_steps": facts.decoder_steps, "nar_tokens": facts.nar_tokens,
            "chunks": facts.chunks}


def facts_of(job: Any) -> OutputFacts:
    """The facts of a stored job row (ORM object or Core row), or of the values a worker records
    on it (`workers.record`): the one place a row's columns become what its outputs say."""
    return OutputFacts(job_id=job.id, kind=job.kind, custom_id=job.custom_id, variant=job.variant,
                       checkpoint=job.checkpoint, mode=job.decoded_mode,
                       input_tokens=job.input_tokens, input_tokens_used=job.input_tokens_used,
                       output_tokens=job.output_tokens, decoder_steps=job.decoder_steps, nar_tokens=job.nar_tokens,
                       chunks=job.chunks, input_truncated=bool(job.input_truncated))


def read_body(storage: Storage, output_key: str) -> dict[str, Any]:
    """A job's stored output JSON."""
    body: dict[str, Any] = json.loads(storage.get(output_key))
    return body


def read_text(storage: Storage, *, output_text: str | None, output_key: str | None) -> str:
    """A succeeded job's output text: inline in its row when short, else from its stored JSON."""
    if output_text is not None:
        return output_text
    return str(read_body(storage, output_key or "")["output"])
