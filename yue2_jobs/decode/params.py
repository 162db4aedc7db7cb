"""How one request is decoded: the one decoding-parameter type of the project, and its defaults.

The API parses a job's body into a `DecodingParams` (`yue2_jobs.jobs.params`), the worker reads
it back from the job row once (`workers.record.load_inputs`), and the decode session takes it as
it is: `DecodeSession.generate(..., params)` and `DecodeRequest(params=...)`. The mode list and
every default live here and nowhere else; `Settings` reads its defaults from here. This module
imports no torch, so the API and the CLI use it without loading the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, get_args

Mode = Literal["auto", "ar", "hybrid", "hybrid_fast", "nar", "prompt_lookup"]
MODES: tuple[Mode, ...] = get_args(Mode)
AUTO: Mode = "auto"
GREEDY_ONLY_MODES: tuple[Mode, ...] = ("nar", "prompt_lookup")  # no sampling: their drafts are checked greedily
ENGINE_MODES: tuple[Mode, ...] = ("ar", "hybrid", AUTO)  # what the continuous-batching engine decodes

DEFAULT_MODE: Mode = AUTO  # `ar` and `hybrid` give the same tokens; `auto` runs whichever is faster
DEFAULT_MAX_NEW_TOKENS = 48  # a summary's length cap when a request names none
# `hybrid` verifies a NAR draft token only while the confidence head's joint p(accept) up to it
# is at least this: at batch 1 a verified slot costs almost nothing, at batch 32 it costs a token.
DEFAULT_MIN_ACCEPT_PROB = 0.05


@dataclass(frozen=True)
class DecodingParams:
    """Mode, length, sampling and repetition controls of one request.

    `mode`: `auto` (`ar` or `hybrid`, whichever the session measured faster; `ar` when sampling,
    since the two draw different tokens and a seed must reproduce its output), `ar`, `hybrid`
    (greedy output identical to `ar`), `hybrid_fast` (drafts with confidence >= `nar_threshold`
    kept unverified), `nar` (parallel refinement) or `prompt_lookup` (drafts copied from the
    input, verified). `max_new_tokens`: at most this many tokens, EOS included (more than the
    model's positions allow is an error, never silently cut). `do_sample=False` is greedy and
    ignores temperature, top_k and top_p (0 and 1.0: off); `seed` makes sampling repeatable.
    `repetition_penalty` and `no_repeat_ngram_size` None: the checkpoint's generation config, as
    in Hugging Face's `generate`.
    """

    mode: Mode = DEFAULT_MODE
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    nar_threshold: float | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None

    def __post_init__(self) -> None:
        checks = (
            (self.mode in MODES, f"mode must be one of {MODES}, got {self.mode!r}"),
            (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
             f"max_new_tokens must be >= 1, got {self.max_new_tokens}"),
            (self.temperature > 0, f"temperature must be > 0, got {self.temperature}"),
            (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.nar_threshold is None or 0.0 <= self.nar_threshold <= 1.0,
             f"nar_threshold must be between 0 and 1, got {self.nar_threshold}"),
            (self.repetition_penalty is None or self.repetition_penalty > 0,
             f"repetition_penalty must be > 0, got {self.repetition_penalty}"),
            (self.no_repeat_ngram_size is None or self.no_repeat_ngram_size >= 0,
             f"no_repeat_ngram_size must be >= 0, got {self.no_repeat_ngram_size}"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> DecodingParams:
        """The fields found in `values` (a job's stored parameters, say); other keys are not ours.
        None means the default, as a job's JSON leaves it."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def with_(self, **changes: Any) -> DecodingParams:
        """A copy with `changes` (checked again); a name that is not a field is a ValueError."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a decoding parameter; the fields are "
                             f"{', '.join(f.name for f in fields(self))}")
        return replace(self, **changes) if changes else self

    def stored(self) -> dict[str, Any]:
        """The JSON a job row keeps: the mode, the length and every field set to other than its
        default, which is what a request may send (`from_mapping` reads it back to an equal
        `DecodingParams`, and a client may send it again as a job body)."""
        default = DecodingParams()
        return {k: v for k, v in asdict(self).items()
                if k in ("mode", "max_new_tokens") or v != getattr(default, k)}

    @property
    def sets_repetition_controls(self) -> bool:
        """Whether this request overrides the checkpoint's repetition controls."""
        return self.repetition_penalty is not None or self.no_repeat_ngram_size is not None

    @property
    def engine_refusal(self) -> str | None:
        """Why the continuous-batching engine cannot decode it, None when it can: the one statement
        of which requests the engine runs (greedy `auto`/`ar`/`hybrid` with the checkpoint's
        repetition controls). The engine's admission check gives this reason as the request's
        error, and `engine_ok` is its yes/no, which the worker routes jobs by."""
        if self.mode not in ENGINE_MODES:
            return f"mode must be one of {ENGINE_MODES} for continuous batching, got {self.mode!r}"
        # The engine's rows share one greedy sampler built from the checkpoint's generation config.
        if self.do_sample or self.sets_repetition_controls:
            return ("the continuous-batching engine decodes greedily with the checkpoint's repetition controls; "
                    f"got do_sample={self.do_sample}, repetition_penalty={self.repetition_penalty}, "
                    f"no_repeat_ngram_size={self.no_repeat_ngram_size}")
        return None

    @property
    def engine_ok(self) -> bool:
        """Whether the continuous-batching engine decodes it (`engine_refusal` is None)."""
        return self.engine_refusal is None
