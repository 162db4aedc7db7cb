"""What a job may ask for, and the limits it is checked against before anything is stored.

Every rejection is an `InvalidRequestError` naming the field (and, for limits, the limit), so an
HTTP 4xx, a batch's error line and the CLI all say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from yue2_jobs.core.config import Settings
from yue2_jobs.core.safe import SafeStr, check_depth
from yue2_jobs.decode.params import GREEDY_ONLY_MODES, DecodingParams, Mode
from yue2_jobs.errors import InvalidRequestError, LimitExceededError

M = TypeVar("M", bound=BaseModel)
LongInput = Literal["truncate", "reject", "chunk"]
# What a job that names no `long_input` gets, when the API stores it and when a worker reads a
# row that lacks it (rows from before migration 0005): one default, so the two cannot drift.
DEFAULT_LONG_INPUT: LongInput = "truncate"
KINDS = ("summarize", "generate", "render_font")
MAX_NO_REPEAT_NGRAM = 16
ENDPOINTS = {"/v1/summarize": "summarize", "/v1/generate": "generate", "/v1/render_font": "render_font"}
TEXT_FIELD = {"summarize": "input", "generate": "prompt", "render_font": "text"}


class DecodingBody(BaseModel):
    """Decoding parameters a job (or one line of a batch) may set, with the API's limits; None
    means the server default. A validated job's parameters build a `DecodingParams`."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode | None = None
    max_new_tokens: int | None = Field(None, ge=1)
    do_sample: bool = False
    temperature: float = Field(1.0, gt=0, le=10)
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    nar_threshold: float | None = Field(None, ge=0, le=1)
    # Hugging Face generate's repetition controls (None: the checkpoint's generation config).
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    no_repeat_ngram_size: int | None = Field(None, ge=1, le=MAX_NO_REPEAT_NGRAM)
    # An input longer than the checkpoint reads: cut it (recorded on the job), fail the job, or
    # summarise it window by window and then the partial summaries (map-reduce).
    long_input: LongInput | None = None


class JobBody(DecodingBody):
    """The body of POST /v1/jobs, or of one batch line: the text, the variant and decoding parameters."""

    kind: Literal["summarize", "generate", "render_font"] | None = None
    input: SafeStr | None = None
    prompt: SafeStr | None = None
    variant: SafeStr | None = Field(None, max_length=64)
    custom_id: SafeStr | None = Field(None, max_length=512)


@dataclass(frozen=True)
class ValidatedJob:
    """A job that passed `validate_job`. `decoding`: a text job's decoding parameters, every
    default resolved (`Settings`); `params`: what is stored on the job row, from which the worker
    parses the same `DecodingParams` again (`workers.job_io.JobInput.of`)."""

    kind: str
    text: str
    variant: str
    custom_id: str | None
    params: dict[str, Any]
    decoding: DecodingParams | None = None


def _field_of(error: ErrorDetails) -> str:
    return ".".join(str(p) for p in error["loc"]) or "body"


def _parse(model: type[M], body: dict[str, Any], field_prefix: str) -> M:
    """`body` as `model`; the first validation error becomes an InvalidRequestError naming its field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = field_prefix + _field_of(err)
        raise InvalidRequestError(f"{field}: {err['msg']}", field=field) from None


CHAT_FIELDS = ("model", "messages")  # what an OpenAI chat-completions body carries instead of our text field


def _refuse_chat_body(body: dict[str, Any], *, kind: str, field_prefix: str) -> None:
    """A chat-completions-shaped body is named as such, with the shape we take, instead of a
    bare "extra inputs are not permitted" on its first field."""
    text_field = TEXT_FIELD.get(kind, "input")
    found = [f for f in CHAT_FIELDS if f in body]
    if found and text_field not in body:
        raise InvalidRequestError(
            f"{field_prefix}{text_field} is required: a {kind} body is {{\"{text_field}\": \"...\"}} with optional "
            f"decoding fields (mode, max_new_tokens, ...); chat-style fields ({', '.join(found)}) are not "
            f"accepted", field=f"{field_prefix}{text_field}")


def validate_job(body: Any, *, kind: str | None, settings: Settings, field_prefix: str = "") -> ValidatedJob:
    """Check one job body; `kind` comes from the endpoint when the body does not carry it."""
    where = field_prefix.rstrip(".") or "body"
    if not isinstance(body, dict):
        raise InvalidRequestError(f"{where} must be a JSON object", field=where)
    check_depth(body, field=where)
    if (body.get("kind") or kind) == "render_font":
        return _validate_render(body, kind=kind, settings=settings, field_prefix=field_prefix)
    _refuse_chat_body(body, kind=body.get("kind") or kind or "summarize", field_prefix=field_prefix)
    parsed = _parse(JobBody, body, field_prefix)
    if parsed.kind and kind and parsed.kind != kind:
        raise InvalidRequestError(f"{field_prefix}kind {parsed.kind!r} does not match the endpoint's {kind!r}",
                                  field=f"{field_prefix}kind")
    kind = parsed.kind or kind or "summarize"
    text_field = TEXT_FIELD[kind]
    text = getattr(parsed, text_field)
    if text is None or not text.strip():
        raise InvalidRequestError(f"{field_prefix}{text_field} is required for a {kind} job and must not be empty",
                                  field=f"{field_prefix}{text_field}")
    if len(text) > settings.max_input_chars:
        raise LimitExceededError(field=f"{field_prefix}{text_field}", limit=settings.max_input_chars,
                                 actual=len(text), unit="characters")
    variant = parsed.variant or settings.default_variant
    if variant not in settings.checkpoints:
        raise InvalidRequestError(f"{field_prefix}variant {variant!r} is not served; choose one of "
                                  f"{sorted(settings.checkpoints)}", field=f"{field_prefix}variant")
    max_new = parsed.max_new_tokens or settings.default_max_new_tokens
    if max_new > settings.max_new_tokens_limit:
        raise LimitExceededError(field=f"{field_prefix}max_new_tokens", limit=settings.max_new_tokens_limit,
                                 actual=max_new, unit="tokens", status=422)
    mode = parsed.mode or settings.default_mode
    if parsed.do_sample and mode in GREEDY_ONLY_MODES:
        raise InvalidRequestError(f"{field_prefix}mode {mode!r} decodes greedily; do_sample needs ar or hybrid",
                                  field=f"{field_prefix}do_sample")
    given = parsed.model_dump(include=set(DecodingBody.model_fields) - {"long_input"}, exclude_none=True)
    try:
        decoding = DecodingParams.from_mapping({**given, "mode": mode, "max_new_tokens": max_new})
    except ValueError as exc:  # the body's limits are within DecodingParams' own, so this is a bug, named as one
        raise InvalidRequestError(f"{field_prefix}decoding parameters: {exc}", field=f"{field_prefix}body") from None
    # The row keeps the DecodingParams itself (the worker parses it back: workers.job_io.JobInput.of).
    params = {**decoding.stored(), "long_input": parsed.long_input or DEFAULT_LONG_INPUT}
    return ValidatedJob(kind=kind, text=text, variant=variant, custom_id=parsed.custom_id, params=params,
                        decoding=decoding)


def _validate_render(body: dict[str, Any], *, kind: str | None, settings: Settings, field_prefix: str
                     ) -> ValidatedJob:
    from yue2_jobs.fonts.params import FONTS_VARIANT, RenderBody

    if kind not in (None, "render_font"):
        raise InvalidRequestError(f"{field_prefix}kind 'render_font' does not match the endpoint's {kind!r}",
                                  field=f"{field_prefix}kind")
    parsed = _parse(RenderBody, body, field_prefix)
    if not parsed.text.strip():
        raise InvalidRequestError(f"{field_prefix}text is required for a render_font job and must not be empty",
                                  field=f"{field_prefix}text")
    if len(parsed.text) > settings.render_max_chars:
        raise LimitExceededError(field=f"{field_prefix}text", limit=settings.render_max_chars,
                                 actual=len(parsed.text), unit="characters", status=413)
    params = parsed.model_dump(exclude={"kind", "custom_id", "text"})
    return ValidatedJob(kind="render_font", text=parsed.text, variant=FONTS_VARIANT, custom_id=parsed.custom_id,
                        params=params)
