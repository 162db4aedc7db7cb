"""How engine steps run for one model: its decode-step weight layout, its captured CUDA graphs and
its compiled CPU step.

A `DecodeSession` owns one `Steps`; `generate`'s loop and the continuous engine both step through
`Steps.run`, which replays a captured graph (CUDA) or calls a compiled package (CPU, `compiled.py`)
when one covers the step and runs `engine_step` eagerly otherwise; both prefill through
`Steps.prefill`. Nothing here is stored on the model.
"""

from __future__ import annotations

import logging
import time

import torch

from yue2_jobs.decode.compiled import CompiledSteps, unavailable_reason
from yue2_jobs.decode.engine import StepShape, engine_step
from yue2_jobs.decode.graphs import DEFAULT_BUCKETS, StepGraphs
from yue2_jobs.decode.layout import StepLayout, WeightFormat
from yue2_jobs.decode.rows import Rows
from yue2_jobs.decode.sampling import SamplingParams
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration, Yue2KVCache

log = logging.getLogger(__name__)


class Steps:
    """The engine step of one model: layout (rebuilt only after the weights change), graphs and
    compiled packages (dropped when the weights change: they hold the weights they were built on)."""

    def __init__(self, model: Yue2ForConditionalGeneration, *, weights: WeightFormat = "float") -> None:
        self.model, self.weights = model, weights
        self._layout: StepLayout | None = None
        self.graphs: dict[StepShape, StepGraphs] = {}
        self.compiled: CompiledSteps | None = None

    def layout(self) -> StepLayout:
        """The decode-step weight layout of the model's current weights."""
        if self._layout is None or not self._layout.is_current(self.model):
            if self.compiled is not None and self._layout is not None:
                log.warning("the weights changed: the compiled CPU step is dropped (decoding eagerly)")
                self.compiled = None
            self._layout = StepLayout(self.model, weights=self.weights)
        return self._layout

    def compile(self) -> CompiledSteps | None:
        """Build (or load from the cache) the compiled CPU step of the greedy `ar` and `hybrid`
        shapes a session serves by default (`compiled.py`); None, with one log line saying why,
        where that is not available. `run` uses them from then on."""
        reason = unavailable_reason(self.model, weights=self.weights)
        if reason is None:
            self.layout()  # the packages are of these weights: a layout rebuilt later drops them
            k = self.model.config.nar_block_size
            params = SamplingParams.greedy(self.model.generation_config)
            shapes = [StepShape.of(k=k, drafts=d, params=params) for d in ("none", "nar")]
            start = time.perf_counter()
            try:
                self.compiled = CompiledSteps.build(self.model, shapes=shapes)
            except Exception as exc:  # any failure of export or the C++ build leaves eager steps, said once
                reason = f"building it failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            else:
                c = self.compiled
                limits = ", ".join(f"{s.drafts} up to {c.max_rows[s]} rows" for s in c.steps)
                log.info("compiled CPU step ready in %.1f s (built: %s; runs %s)", time.perf_counter() - start,
                         ", ".join(c.built) or "nothing, all cached", limits)
                return c
        log.warning("compiled CPU step not available (%s): decoding with the eager step", reason)
        self.compiled = None
        return None

    def covers(self, shape: StepShape, *, rows: int) -> bool:
        """Whether a graph or a compiled package runs `shape` (at its full, fixed width) for a
        working set of `rows` rows."""
        if shape.params.do_sample:
            return False
        graphs = self.captured(shape)
        if graphs is not None and graphs.bucket_for(rows) is not None:
            return True
        return self.compiled is not None and self.compiled.max_rows.get(shape, 0) >= rows

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> Yue2EncoderState:
        """The encoder and every layer's cross-attention K/V, through the session's weights (the
        same kernels, and in int8 the same int8 matrices, as the steps). Eager even where the
        step is compiled: see `compiled.py`."""
        return self.model.encode(input_ids, attention_mask, layout=self.layout())

    def capture(self, *, max_rows: int, use_graphs: bool | None = None,
                min_lengths: tuple[bool, ...] = (False,)) -> list[StepGraphs]:
        """Capture what a worker decodes, greedy `ar` (width 1) and `hybrid` (width 1 + K), for
        row buckets up to `max_rows`; `run` replays them from then on. `use_graphs` None: graphs
        on CUDA only (False: a plain call stands in for the replay, for CPU tests).
        `min_lengths` (True): also the steps of rows with a minimum length (benchmarks use them)."""
        model = self.model
        k = model.config.nar_block_size
        buckets = (*(b for b in DEFAULT_BUCKETS if b < max_rows), max_rows)
        params = SamplingParams.greedy(model.generation_config)  # what the continuous engine runs
        layout = self.layout()
        self.graphs = {}
        for shape in (StepShape.of(k=k, drafts=d, params=params, ban_eos=b) for b in min_lengths
                      for d in ("none", "nar")):
            self.graphs[shape] = StepGraphs.capture(model, shape=shape, layout=layout, buckets=buckets,
                                                    use_graphs=use_graphs)
        return list(self.graphs.values())

    def captured(self, shape: StepShape) -> StepGraphs | None:
        """The graphs captured for `shape`, if any."""
        return self.graphs.get(shape)

    def run(self, rows: Rows, enc: Yue2EncoderState, caches: list[Yue2KVCache], *, layout: StepLayout,
            shape: StepShape, span: int, generator: torch.Generator | None = None,
            draft_q: list[torch.Tensor | None] | None = None) -> None:
        """One engine step (`engine_step`'s arguments): replayed from the graphs when they cover
        the shape and the rows, else eager. `layout` is `self.layout()`, which a loop asks for
        once (checking that the weights are current costs a pass over every parameter)."""
        graphs = None if shape.params.do_sample else self.captured(shape)
        if graphs is not None and graphs.run(rows, enc, caches):
            return
        if self.compiled is None or shape.params.do_sample or not self.compiled.run(shape, rows, enc, caches, span):
            engine_step(self.model, rows, enc, caches, layout=layout, shape=shape, span=span, generator=generator,
                        draft_q=draft_q)
