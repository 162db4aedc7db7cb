"""`DecodeSession`: one loaded YuE2 model, ready to decode — the object a user (or a worker) holds.

Like CTranslate2's `Translator(path, device)`, a session owns everything a decode needs besides
the weights: the device and dtype it moved the model to, the decode-step weight layout and any
captured CUDA graphs or compiled CPU step (`Steps`), the `auto` mode chooser (what it measured on this device), and the
continuous-batching engines it built. Nothing is stored on the `nn.Module`, so two sessions over
one model do not share state by accident, and a hot swap is a new session.

    session = DecodeSession.load("checkpoints/base")             # verified against its manifest
    out = session.generate(input_ids, attention_mask, DecodingParams(mode="hybrid", max_new_tokens=48))
    texts = session.summarize(["A long text ..."])               # tokenize, generate, detokenize
    engine = session.engine(max_rows=32)                         # continuous batching, same chooser
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import PreTrainedTokenizerBase

from yue2_jobs.decode.auto_mode import ModeChooser
from yue2_jobs.decode.compiled import CompiledSteps
from yue2_jobs.decode.continuous import ContinuousBatcher
from yue2_jobs.decode.generate import DEFAULT_NAR_ITERATIONS, Yue2GenerateOutput, generate
from yue2_jobs.decode.graphs import StepGraphs
from yue2_jobs.decode.layout import WeightFormat
from yue2_jobs.decode.params import DEFAULT_MIN_ACCEPT_PROB, DecodingParams
from yue2_jobs.decode.steps import Steps
from yue2_jobs.model.checkpoint import load_verified
from yue2_jobs.model.device import resolve_device, resolve_dtype
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration


class DecodeSession:
    """A YuE2 model on one device and dtype, with its step layout, graphs, chooser and engines.

    `device` and `dtype` None keep the model where it is; names (`"auto"`, `"cpu"`, `"cuda"`,
    `"bfloat16"`, ...) are resolved as the worker's settings are (`model.device`), and the model
    is moved there and put in eval mode (a session decodes; it never trains). `dtype="int8"`
    (CPU only) keeps the model in float32 and decodes with int8 copies of its matrices (encoder,
    both decoder branches, vocabulary: `yue2_jobs.decode.layout.Int8Matrix`); embeddings, norms
    and attention stay float32, and so do `nar` mode's parallel passes. Moving the model
    elsewhere afterwards makes the session refuse to decode rather than decode on the wrong
    device or dtype: make a new session then. `tokenizer` is needed only by `summarize`.
    `weights_sha256`: the checkpoint's, when loaded from one.
    """

    def __init__(self, model: Yue2ForConditionalGeneration, *, tokenizer: PreTrainedTokenizerBase | None = None,
                 device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                 weights_sha256: str | None = None) -> None:
        here = model.shared.weight
        self.device = here.device if device is None else (
            resolve_device(device) if isinstance(device, str) else device)
        self.weights: WeightFormat = "float"
        if dtype == "int8":
            if self.device.type != "cpu":
                raise ValueError(f"dtype 'int8' runs on the CPU only, not on {self.device}; use bfloat16 there")
            self.weights, dtype = "int8", torch.float32
        self.dtype = here.dtype if dtype is None else (
            resolve_dtype(dtype, self.device) if isinstance(dtype, str) else dtype)
        if (here.device, here.dtype) != (self.device, self.dtype):
            # transformers types its `wraps`-decorated `to` as the unbound function
            model.to(self.device, dtype=self.dtype)  # type: ignore[arg-type]
        self.model, self.tokenizer, self.weights_sha256 = model.eval(), tokenizer, weights_sha256
        self.steps = Steps(model, weights=self.weights)
        self.chooser = ModeChooser()

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, device: str | torch.device | None = "auto",
             dtype: str | torch.dtype | None = "auto") -> DecodeSession:
        """A session over a local checkpoint, every file verified against its manifest first."""
        loaded = load_verified(Path(directory))
        return cls(loaded.model, tokenizer=loaded.tokenizer, device=device, dtype=dtype,
                   weights_sha256=loaded.weights_sha256)

    def _check_placement(self) -> None:
        here = self.model.shared.weight
        if (here.device, here.dtype) != (self.device, self.dtype):
            raise RuntimeError(f"the model was moved to {here.device}/{here.dtype} after this session put it on "
                               f"{self.device}/{self.dtype}; make a new DecodeSession for it")

    @property
    def precision(self) -> str:
        """What the decoder's matrices are stored in: `int8`, or the dtype's name (`float32`, ...)."""
        return "int8" if self.weights == "int8" else str(self.dtype).removeprefix("torch.")

    @property
    def max_input_tokens(self) -> int:
        """The longest encoder input: the tokenizer's limit or the model's positions, the smaller."""
        n = self.model.config.max_position_embeddings
        return min(self.tokenizer.model_max_length, n) if self.tokenizer is not None else n

    # ---- decoding ------------------------------------------------------------------------------

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 params: DecodingParams | None = None, *, min_accept_prob: float = DEFAULT_MIN_ACCEPT_PROB,
                 nar_iterations: int = DEFAULT_NAR_ITERATIONS, sync_every: int | None = None,
                 **overrides: Any) -> Yue2GenerateOutput:
        """Decode a batch (B, S) as `params` says (default: `DecodingParams()`); keyword arguments
        named like its fields (`mode="ar"`, `max_new_tokens=32`) override it, as Hugging Face's
        `generate` takes them. Returns `sequences` (B, 1 + n), per-row `stats` and the `mode` run
        (`yue2_jobs.decode.generate.generate`)."""
        params = (params or DecodingParams()).with_(**overrides)
        self._check_placement()
        return generate(self.steps, self.chooser, input_ids=input_ids.to(self.device),
                        attention_mask=None if attention_mask is None else attention_mask.to(self.device),
                        params=params, min_accept_prob=min_accept_prob, nar_iterations=nar_iterations,
                        sync_every=sync_every)

    @torch.inference_mode()
    def summarize(self, texts: list[str], params: DecodingParams | None = None, *,
                  batch_size: int = 32) -> list[str]:
        """Decoded texts in input order; inputs are length-sorted into batches to cut padding and
        cut to `max_input_tokens`. (`generate` gives each row's `SequenceStats`.)"""
        if self.tokenizer is None:
            raise ValueError("summarize needs a tokenizer: DecodeSession(model, tokenizer=...) or DecodeSession.load")
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: dict[int, str] = {}
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            enc = self.tokenizer([texts[i] for i in idx], truncation=True, max_length=self.max_input_tokens,
                                 padding=True, return_tensors="pt")
            res = self.generate(enc["input_ids"], enc["attention_mask"], params)
            decoded = self.tokenizer.batch_decode(res.sequences, skip_special_tokens=True)
            for i, text in zip(idx, decoded, strict=True):
                out[i] = text.strip()
        return [out[i] for i in range(len(texts))]

    def engine(self, *, max_rows: int = 32, max_tokens: int | None = None,
               policy: Literal["continuous", "static"] = "continuous",
               min_accept_prob: float = DEFAULT_MIN_ACCEPT_PROB) -> ContinuousBatcher[Any]:
        """A continuous-batching engine on this session's model, steps and chooser."""
        self._check_placement()
        return ContinuousBatcher(self.steps, self.chooser, max_rows=max_rows, max_tokens=max_tokens, policy=policy,
                                 min_accept_prob=min_accept_prob)

    def compile_steps(self) -> CompiledSteps | None:
        """Compile the CPU step ahead of time (`Steps.compile`; the prefill stays eager): built once per
        checkpoint version and cached on disk, used by `generate` and the engines from then on.
        None, with a log line saying why, where it is not available (`YUE2_COMPILE=0`, not the
        CPU, not float32, no C++ compiler, a build that failed): decoding stays eager."""
        self._check_placement()
        return self.steps.compile()

    def capture_graphs(self, *, max_rows: int, use_graphs: bool | None = None,
                       min_lengths: tuple[bool, ...] = (False,)) -> list[StepGraphs]:
        """Capture the serving steps in CUDA graphs (`Steps.capture`); both `generate` and the
        engines replay them from then on. Off CUDA there is nothing to capture (`use_graphs`
        None: nothing is done); `use_graphs=False` installs plain calls in their place, which is
        how CPU tests run the replay machinery."""
        self._check_placement()
        if use_graphs is None and self.device.type != "cuda":
            return []
        return self.steps.capture(max_rows=max_rows, use_graphs=use_graphs, min_lengths=min_lengths)
