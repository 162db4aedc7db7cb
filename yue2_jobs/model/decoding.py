"""How one request is decoded: the one decoding-parameter type of the project.

`generate()` takes a `DecodingParams`; the API's pydantic models (`yue2_jobs.jobs.params`) and
the worker's runner build one. The mode list lives here and nowhere else. This module imports
no torch, so the API and the CLI can use it without loading the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, get_args

Mode = Literal["auto", "ar", "hybrid", "hybrid_fast", "nar", "prompt_lookup"]
MODES: tuple[str, ...] = get_args(Mode)
AUTO = "auto"
GREEDY_ONLY_MODES = ("nar", "prompt_lookup")  # no sampling: their drafts are checked greedily
ENGINE_MODES = ("ar", "hybrid", AUTO)  # what the continuous-batching engine decodes


@dataclass(frozen=True)
class DecodingParams:
    """Mode, length, sampling and repetition controls of one request.

    `mode`: `auto` (`ar` or `hybrid`, whichever the model measured faster), `ar`, `hybrid`
    (greedy output identical to `ar`), `hybrid_fast` (drafts with confidence >= `nar_threshold`
    kept unverified), `nar` (parallel refinement) or `prompt_lookup` (drafts copied from the
    input, verified). `max_new_tokens` None: the model's default. `do_sample=False` is greedy and
    ignores temperature, top_k and top_p (0 and 1.0: off); `seed` makes sampling repeatable.
    `repetition_penalty` and `no_repeat_ngram_size` None: the checkpoint's generation config, as
    in Hugging Face's `generate`.
    """

    mode: str = "hybrid"
    max_new_tokens: int | None = None
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
            (self.max_new_tokens is None or self.max_new_tokens >= 1,
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
        """A copy with `changes` (checked again)."""
        return replace(self, **changes) if changes else self

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def sets_repetition_controls(self) -> bool:
        """Whether this request overrides the checkpoint's repetition controls."""
        return self.repetition_penalty is not None or self.no_repeat_ngram_size is not None

    @property
    def engine_ok(self) -> bool:
        """Whether the continuous-batching engine decodes it: greedy `auto`/`ar`/`hybrid` with the
        checkpoint's repetition controls."""
        return self.mode in ENGINE_MODES and not self.do_sample and not self.sets_repetition_controls
