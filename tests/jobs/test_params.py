"""What a job may ask for (`validate_job`): every refusal names its field (and its limit), every
default comes from `Settings`, which takes them from `DecodingParams` — no server needed."""

from __future__ import annotations

import pytest

from yue2_jobs.core.config import Settings
from yue2_jobs.decode.params import DEFAULT_MAX_NEW_TOKENS, DEFAULT_MODE, DecodingParams
from yue2_jobs.errors import InvalidRequestError, LimitExceededError
from yue2_jobs.jobs.params import validate_job


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(max_input_chars=100, max_new_tokens_limit=64, render_max_chars=20)


def test_defaults_are_decoding_params_own(settings: Settings) -> None:
    job = validate_job({"input": "A text."}, kind=None, settings=settings)
    assert (job.kind, job.text, job.variant, job.custom_id) == ("summarize", "A text.", "base", None)
    assert job.decoding == DecodingParams()
    assert (job.decoding.mode, job.decoding.max_new_tokens) == (DEFAULT_MODE, DEFAULT_MAX_NEW_TOKENS)
    assert (settings.default_mode, settings.default_max_new_tokens) == (DEFAULT_MODE, DEFAULT_MAX_NEW_TOKENS)
    # What the worker parses back from the stored row is the same value.
    assert DecodingParams.from_mapping(job.params) == job.decoding
    assert job.params == {"mode": "auto", "max_new_tokens": 48, "long_input": "truncate"}
    # A job's stored parameters are a valid job body again.
    again = validate_job({"input": "A text.", **job.params}, kind=None, settings=settings)
    assert again.decoding == job.decoding and again.params == job.params


def test_an_operator_default_and_a_request_value_reach_the_decoding_params(settings: Settings) -> None:
    ops = Settings(default_mode="ar", default_max_new_tokens=12)
    assert validate_job({"input": "x"}, kind=None, settings=ops).decoding == DecodingParams(mode="ar",
                                                                                            max_new_tokens=12)
    job = validate_job({"prompt": "x", "mode": "hybrid", "max_new_tokens": 7, "do_sample": True, "top_p": 0.5,
                        "seed": 3, "no_repeat_ngram_size": 2}, kind="generate", settings=settings)
    assert job.kind == "generate" and job.decoding == DecodingParams(
        mode="hybrid", max_new_tokens=7, do_sample=True, top_p=0.5, seed=3, no_repeat_ngram_size=2)
    assert DecodingParams.from_mapping(job.params) == job.decoding
    assert validate_job({"prompt": "x", **job.params}, kind="generate", settings=settings).decoding == job.decoding


@pytest.mark.parametrize(("body", "field", "status", "text"), [
    ({"input": "x", "colour": 1}, "colour", 422, "Extra inputs"),
    ({"input": ""}, "input", 422, "must not be empty"),
    ({"input": "   \n"}, "input", 422, "must not be empty"),
    ({"prompt": "x"}, "input", 422, "required for a summarize job"),
    ({"input": "x" * 101}, "input", 413, "over the limit of 100 characters"),
    ({"input": "x", "max_new_tokens": 65}, "max_new_tokens", 422, "over the limit of 64 tokens"),
    ({"input": "x", "max_new_tokens": 0}, "max_new_tokens", 422, "greater than or equal to 1"),
    ({"input": "x", "mode": "beam"}, "mode", 422, "'auto'"),
    ({"input": "x", "mode": "nar", "do_sample": True}, "do_sample", 422, "decodes greedily"),
    ({"input": "x", "temperature": 0}, "temperature", 422, "greater than 0"),
    ({"input": "x", "top_p": 1.5}, "top_p", 422, "less than or equal to 1"),
    ({"input": "x", "variant": "medical"}, "variant", 422, "not served"),
    ({"input": "x", "kind": "generate"}, "kind", 422, "does not match"),
    ({"input": "a\x00b"}, "input", 422, ""),
    ({"input": "x", "long_input": "split"}, "long_input", 422, "'truncate'"),
])
def test_each_refusal_names_its_field(settings: Settings, body: dict, field: str, status: int, text: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        validate_job(body, kind="summarize", settings=settings)
    assert (caught.value.field, caught.value.status) == (field, status)
    assert text in str(caught.value)


def test_a_batch_line_names_its_fields_under_body(settings: Settings) -> None:
    with pytest.raises(LimitExceededError) as caught:
        validate_job({"input": "x" * 101}, kind="summarize", settings=settings, field_prefix="body.")
    assert caught.value.field == "body.input" and caught.value.limit == 100 and caught.value.actual == 101
    with pytest.raises(InvalidRequestError, match="body must be a JSON object"):
        validate_job(["x"], kind="summarize", settings=settings, field_prefix="body.")


def test_too_deep_a_body_is_refused_before_parsing(settings: Settings) -> None:
    body: dict = {"input": "x"}
    for _ in range(200):
        body = {"custom": body}
    with pytest.raises(InvalidRequestError) as caught:
        validate_job(body, kind="summarize", settings=settings)
    assert caught.value.field == "body"


def test_render_jobs_have_their_own_rules(settings: Settings) -> None:
    job = validate_job({"kind": "render_font", "text": "你好"}, kind=None, settings=settings)
    assert job.kind == "render_font" and job.decoding is None and job.variant == "fonts"
    with pytest.raises(LimitExceededError) as caught:
        validate_job({"kind": "render_font", "text": "字" * 21}, kind=None, settings=settings)
    assert caught.value.field == "text" and caught.value.status == 413
    with pytest.raises(InvalidRequestError) as caught:
        validate_job({"kind": "render_font", "text": "x"}, kind="summarize", settings=settings)
    assert caught.value.field == "kind"
