"""How engine steps run for one model: its decode-step weight layout and its captured CUDA graphs.

A `DecodeSession` owns one `Steps`; `generate`'s loop and the continuous engine both step through
`Steps.run`, which replays a captured graph when one covers the step and runs `engine_step`
eagerly otherwise. Nothing here is stored on the model.
"""

from __future__ import annotations

import torch

from yue2_jobs.decode.engine import StepShape, engine_step
from yue2_jobs.decode.graphs import DEFAULT_BUCKETS, StepGraphs
from yue2_jobs.decode.layout import StepLayout, WeightFormat
from yue2_jobs.decode.rows import Rows
from yue2_jobs.decode.sampling import SamplingParams
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration, Yue2KVCache


class Steps:
    """The engine step of one model: layout (rebuilt only after the weights change) and graphs."""

    def __init__(self, model: Yue2ForConditionalGeneration, *, weights: WeightFormat = "float") -> None:
        self.model, self.weights = model, weights
        self._layout: StepLayout | None = None
        self.graphs: dict[StepShape, StepGraphs] = {}

    def layout(self) -> StepLayout:
        """The decode-step weight layout of the model's current weights."""
        if self._layout is None or not self._layout.is_current(self.model):
            self._layout = StepLayout(self.model, weights=self.weights)
        return self._layout

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
        if graphs is None or not graphs.run(rows, enc, caches):
            engine_step(self.model, rows, enc, caches, layout=layout, shape=shape, span=span, generator=generator,
                        draft_q=draft_q)
