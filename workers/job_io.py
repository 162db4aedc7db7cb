"""What a runner takes and gives for one job. Kept apart from the model runner so that a worker
without a model (render jobs) or a test runner starts without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.jobs.params import DEFAULT_LONG_INPUT, LongInput

# A JSON object as stored in Postgres or written to storage (a job's params, a result to record):
# its values are of any JSON type, checked where they are read (`yue2_jobs.jobs.params`), so `Any`.
JSONObject = dict[str, Any]


@dataclass(frozen=True)
class JobInput:
    """One job as a runner reads it. `params`: as stored (a render job's are its render options).
    A text job's decoding parameters are parsed once, where its input is loaded (`of`), into
    `decoding`, which the decode session takes as it is."""

    id: str
    kind: str
    text: str
    params: JSONObject
    decoding: DecodingParams | None = None  # None: not a text job
    long_input: LongInput = DEFAULT_LONG_INPUT

    def __post_init__(self) -> None:
        if (self.decoding is None) != (self.kind == "render_font"):
            raise ValueError(f"job {self.id}: a {self.kind} job {'has no' if self.decoding is None else 'takes no'} "
                             "decoding parameters; build it with JobInput.of")

    @classmethod
    def of(cls, *, id: str, kind: str, text: str, params: JSONObject) -> JobInput:
        """A job from its row; a text job's stored parameters that no longer parse raise ValueError
        (the job fails alone)."""
        if kind == "render_font":
            return cls(id=id, kind=kind, text=text, params=params)
        return cls(id=id, kind=kind, text=text, params=params, decoding=DecodingParams.from_mapping(params),
                   long_input=params.get("long_input") or DEFAULT_LONG_INPUT)

    @property
    def decoding_params(self) -> DecodingParams:
        """`decoding`, for a runner that decodes text (a render job has none: a TypeError)."""
        if self.decoding is None:
            raise TypeError(f"job {self.id} is a {self.kind} job: it has no decoding parameters")
        return self.decoding


@dataclass(frozen=True)
class JobOutput:
    text: str
    input_tokens: int
    output_tokens: int
    decoder_steps: int
    nar_tokens: int
    files: tuple[tuple[str, bytes, str], ...] = ()  # (suffix, bytes, content type), stored beside the JSON
    extra: JSONObject | None = None  # merged into the job's output JSON
    mode: str | None = None  # the decoding mode that ran (what `auto` resolved to); None: `decoding.mode` null
    input_tokens_used: int | None = None  # None: all of input_tokens
    input_truncated: bool = False
    chunks: int | None = None  # long_input=chunk: windows summarised
