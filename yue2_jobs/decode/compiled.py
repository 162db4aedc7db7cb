"""The CPU engine step compiled ahead of time (AOTInductor): no Python per operator.

On a GPU a decode step replays a CUDA graph (`graphs.py`); on the CPU a small model's eager step
is about 100 small operators at 3-20 us of Python and dispatch each, several times the arithmetic
(shipped base, batch 1: 410 us a step, of which the matrices and attention are about 140).
`CompiledSteps.build` exports `engine_step` (`torch.export`) for the greedy shapes a session serves
by default, `ar` (width 1) and `hybrid` (width 1 + K, never narrowed), with the rows (A), the
source length (S), the buffer and cache lengths and the attention span dynamic. Inductor freezes
the weights into each package (packs every matrix, fuses the elementwise work, compiles one C++
function), so a step is one call. It pays where dispatch dominates, at few rows: at many rows its
generated kernels cost more per row than the eager ones, so `build` times both on this machine and
the package runs working sets up to the largest row count where it was faster (`max_rows`, kept
beside the packages, per thread count). The prefill stays eager: its products have hundreds of rows, where the
eager oneDNN matrices (`layout.py`) measured faster than inductor's compiled prefill (shipped
base, 48 eval texts at batch 32: 0.11 s against 0.16).

Packages are cached under `YUE2_COMPILE_CACHE` (default `~/.cache/yue2/compiled`) by a key over
the torch version, the CPU capability, the config, the shape and a digest of the weights: a
weight change, a hot swap (a new session over new weights) or a new torch builds afresh, and
`Steps` drops its packages once the weights change under it. Building needs a C++ compiler;
loading a cached package does not. Greedy steps of other shapes (sampling, `hybrid_fast`, a
minimum length, other repetition controls, int8 matrices) run eagerly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from yue2_jobs.decode.engine import StepShape, engine_step
from yue2_jobs.decode.layout import StepLayout
from yue2_jobs.decode.rows import Rows
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration, Yue2KVCache

log = logging.getLogger(__name__)

COMPILE_ENV = "YUE2_COMPILE"
CACHE_ENV = "YUE2_COMPILE_CACHE"
_ROW_NAMES = tuple(f.name for f in fields(Rows))
_LONG = 1 << 16  # upper bound of every exported length (rows, source, buffers): far above any model's
# Freezing makes the weights constants, which inductor packs for its matrix kernels and folds.
# Autotuning the products (inductor's C++ GEMM template against ATen's, timed at build) about
# doubles the build (24 -> 48 s for base's two shapes on 2 cores) and pays: base's batch-1 `ar`
# step 173 -> 108 us, `hybrid` 627 -> 259 us.
INDUCTOR_CONFIGS: dict[str, Any] = {"freezing": True, "max_autotune_gemm": True}


def compile_enabled() -> bool:
    """`YUE2_COMPILE` (default on): 0, false, no or off turn the compiled CPU step off."""
    return os.environ.get(COMPILE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "yue2" / "compiled")


def unavailable_reason(model: Yue2ForConditionalGeneration, *, weights: str) -> str | None:
    """Why this model's steps cannot be compiled here (None: they can)."""
    p = model.shared.weight
    if not compile_enabled():
        return f"{COMPILE_ENV}=0"
    if p.device.type != "cpu":
        return f"the model is on {p.device.type} (the CPU step is what compiles; CUDA replays graphs)"
    if p.dtype != torch.float32:
        return f"the model is in {str(p.dtype).removeprefix('torch.')} (float32 compiles)"
    if weights != "float":
        return "int8 matrices run eagerly (their fbgemm kernels take no part in an exported graph)"
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None and shutil.which("c++") is None:
        return f"no C++ compiler ({cxx} not found): install g++ (the Dockerfiles do)"
    return None


class _PlainWeights:
    """The step's matrices as plain products of the model's own weights (`Yue2StepWeights`):
    what inductor freezes and packs itself. The draft vocabulary's rows of the output matrix are
    taken once here (`draft`), so the package holds them as a constant: taken inside the graph,
    they were gathered again at every step."""

    def __init__(self, model: Yue2ForConditionalGeneration, draft: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self.model, self.draft = model, draft

    def linear(self, x: torch.Tensor, module: nn.Linear) -> torch.Tensor:
        return F.linear(x, module.weight, module.bias)

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.model.output_weight(), self.model.final_logits_bias[0])

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.draft is None:
            return self.lm_logits(hidden)
        return F.linear(hidden, *self.draft)


class _StepModule(nn.Module):
    """`engine_step` of one shape over flat tensors (the exported signature):
    rows (16 fields), caches ((k, v) per AR layer), cross K/V (AR, NAR), mask (A, 1, 1, S), and a
    tensor whose length is the attention span."""

    def __init__(self, model: Yue2ForConditionalGeneration, shape: StepShape) -> None:
        super().__init__()
        self.model, self.shape = model, shape
        ids = model.draft_vocab
        if ids is not None:  # (V_d, C) and (V_d,): buffers, so freezing makes them constants
            self.register_buffer("draft_weight", model.output_weight().detach()[ids].clone())
            self.register_buffer("draft_bias", model.final_logits_bias.detach()[0, ids].clone())

    def forward(self, rows: tuple[torch.Tensor, ...], caches: tuple[tuple[torch.Tensor, torch.Tensor], ...],
                cross: tuple[tuple[torch.Tensor, torch.Tensor], ...],
                nar_cross: tuple[tuple[torch.Tensor, torch.Tensor], ...], mask: torch.Tensor,
                span_like: torch.Tensor) -> torch.Tensor:
        r = Rows(**dict(zip(_ROW_NAMES, rows, strict=True)))
        kv = [_cache_of(k, v) for k, v in caches]
        enc = Yue2EncoderState(hidden=mask, mask=mask, cross_kv=list(cross), nar_cross_kv=list(nar_cross))
        draft = None if self.model.draft_vocab is None else (self.get_buffer("draft_weight"),
                                                              self.get_buffer("draft_bias"))
        engine_step(self.model, r, enc, kv, layout=_PlainWeights(self.model, draft), shape=self.shape,
                    span=span_like.shape[0])
        return r.committed.clone()  # an output, so the graph has one; the state is written in place


def _cache_of(k: torch.Tensor, v: torch.Tensor) -> Yue2KVCache:
    cache = Yue2KVCache.__new__(Yue2KVCache)  # wraps existing tensors: nothing to allocate
    cache.k, cache.v = k, v
    return cache


@dataclass
class CompiledSteps:
    """Loaded AOTInductor packages of one model's engine step, by shape, and where each pays."""

    steps: dict[StepShape, Any] = field(default_factory=dict)
    max_rows: dict[StepShape, int] = field(default_factory=dict)  # the package runs sets up to this many rows
    build_s: float = 0.0  # seconds spent building (exporting and compiling) this time
    load_s: float = 0.0  # seconds spent loading packages (cached or just built)
    built: list[str] = field(default_factory=list)  # the packages built this time (the rest were cached)

    @classmethod
    def build(cls, model: Yue2ForConditionalGeneration, *, shapes: list[StepShape], directory: Path | None = None,
              calibrate: bool = True) -> CompiledSteps:
        """Each shape's step, from the cache or built into it, with the row limit measured here
        (`calibrate` False: no limit). Raises what export or compilation raised (the caller logs it
        and decodes eagerly)."""
        out = cls()
        directory = directory or cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        base = _key_base(model)
        for shape in shapes:
            key = hashlib.sha256(json.dumps({**base, "shape": _shape_name(shape)}, sort_keys=True).encode())
            path = directory / f"step-{_shape_name(shape)}-{key.hexdigest()[:24]}.pt2"
            out.steps[shape] = out._package(path, lambda s=shape: _export_step(model, s))
            # Where the package pays depends on the threads it gets as well (a worker may have 1).
            limits = path.with_suffix(f".rows-{torch.get_num_threads()}threads.json")
            out.max_rows[shape] = _calibrated(limits, model, shape, out.steps[shape]) if calibrate else _LONG
        return out

    def _package(self, path: Path, export: Any) -> Any:
        if not path.exists():
            start = time.perf_counter()
            program = export()
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # built aside, then moved in whole
                part = Path(tmp) / path.name
                torch._inductor.aoti_compile_and_package(program, package_path=str(part),
                                                         inductor_configs=dict(INDUCTOR_CONFIGS))
                os.replace(part, path)
            self.build_s += time.perf_counter() - start
            self.built.append(path.name)
        start = time.perf_counter()
        runner = torch._inductor.aoti_load_package(str(path))
        self.load_s += time.perf_counter() - start
        return runner

    def run(self, shape: StepShape, rows: Rows, enc: Yue2EncoderState, caches: list[Yue2KVCache],
            span: int) -> bool:
        """One step through the package of `shape`; False (nothing done) when there is none."""
        runner = self.steps.get(shape)
        if runner is None or rows.buf.shape[0] > self.max_rows[shape]:
            return False
        _call(runner, rows, enc, caches, span)
        return True


def _call(runner: Any, rows: Rows, enc: Yue2EncoderState, caches: list[Yue2KVCache], span: int) -> None:
    """One step through a loaded package, its inputs flattened in `_StepModule.forward`'s order.
    Straight to the loader: the package's own `__call__` parses its input and output tree specs
    from JSON on every call (about 100 us, half a batch-1 step)."""
    cross = enc.cross_kv[0][0]
    mask = enc.mask
    if mask is None:  # a padding-free set: a mask that masks nothing
        mask = torch.zeros(rows.buf.shape[0], 1, 1, cross.shape[2], dtype=cross.dtype)
    flat = [*rows.tensors().values(), *(t for c in caches for t in (c.k, c.v)),
            *(t for kv in [*enc.cross_kv, *enc.nar_cross_kv] for t in kv), mask, torch.empty(span)]
    runner.loader.boxed_run(flat)


def _shape_name(shape: StepShape) -> str:
    p = shape.params
    return (f"{shape.drafts}-w{shape.width}-rp{p.repetition_penalty:g}-ng{p.no_repeat_ngram_size}"
            f"{'-trust' if shape.trust else ''}{'-mineos' if shape.ban_eos else ''}")


def _key_base(model: Yue2ForConditionalGeneration) -> dict[str, Any]:
    """What a package depends on besides its shape: torch, the CPU (its model and instruction
    flags: inductor compiles for the build machine's, and a package loaded on a CPU without them
    dies of SIGILL, which nothing can catch), how inductor builds, the code it traced, the config
    and the weights."""
    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach().contiguous()
        digest.update(name.encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    if model.draft_vocab is not None:
        digest.update(model.draft_vocab.numpy().tobytes())
    return {"torch": torch.__version__, "cpu": _cpu_identity(), "inductor": INDUCTOR_CONFIGS, "code": _code_digest(),
            "config": model.config.to_json_string(use_diff=False), "weights": digest.hexdigest(),
            "generation": model.generation_config.to_json_string(use_diff=False)}


def _cpu_identity() -> str:
    """The CPU's model name and instruction flags (Linux), else what torch and platform say."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))][:2]
    seen = "\n".join(lines) or platform.processor() or platform.machine()
    return hashlib.sha256(f"{torch.backends.cpu.get_cpu_capability()}\n{seen}".encode()).hexdigest()[:16]


def _code_digest() -> str:
    """The source of every module whose code a package traced: a new release of them builds anew."""
    digest = hashlib.sha256()
    for name in ("yue2_jobs.decode.engine", "yue2_jobs.decode.rows", "yue2_jobs.decode.sampling",
                 "yue2_jobs.model.modeling_yue2", __name__):  # all imported by now (this module imports them)
        digest.update(Path(sys.modules[name].__file__ or "").read_bytes())
    return digest.hexdigest()[:16]


def _example_step(model: Yue2ForConditionalGeneration, shape: StepShape) -> tuple[Any, ...]:
    """Example inputs of a step: every dynamic length distinct (export would tie equal ones)."""
    cfg = model.config
    k, a, s, total = cfg.nar_block_size, 3, 57, 30
    t_buf, t_cache = total + 2 * k + 2, total + k + 1
    cpu = torch.device("cpu")
    rows = Rows.empty(a, k=k, t_buf=t_buf, device=cpu)
    idx = torch.arange(a)
    rows.start(idx, start_token=cfg.decoder_start_token_id, pad=cfg.pad_token_id, total=total, min_total=0,
               draft_on=shape.drafts == "nar", accept_p=0.05, trust_p=2.0)
    h = cfg.decoder_attention_heads
    d = cfg.d_model // h

    def kv(t: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(a, h, t, d), torch.zeros(a, h, t, d)

    return (tuple(rows.tensors().values()), tuple(kv(t_cache) for _ in range(cfg.decoder_layers)),
            tuple(kv(s) for _ in range(cfg.decoder_layers)), tuple(kv(s) for _ in range(cfg.nar_layers)),
            torch.zeros(a, 1, 1, s), torch.empty(t_cache - 12))


def _export_step(model: Yue2ForConditionalGeneration, shape: StepShape) -> Any:
    cfg = model.config
    k = cfg.nar_block_size  # a row decodes at least one token: total >= 2, so t_buf >= 2K + 4, t_cache >= K + 3
    a, s = Dim("rows", min=1, max=_LONG), Dim("source", min=1, max=_LONG)
    t_buf, t_cache = Dim("t_buf", min=2 * k + 4, max=_LONG), Dim("t_cache", min=k + 3, max=_LONG)
    span = Dim("span", min=1, max=_LONG)
    rows = tuple({0: a, 1: t_buf} if n == "buf" else {0: a} for n in _ROW_NAMES)
    caches = tuple(({0: a, 2: t_cache}, {0: a, 2: t_cache}) for _ in range(cfg.decoder_layers))

    def cross(n: int) -> tuple[tuple[dict[int, Dim], dict[int, Dim]], ...]:
        return tuple(({0: a, 2: s}, {0: a, 2: s}) for _ in range(n))

    dims = (rows, caches, cross(cfg.decoder_layers), cross(cfg.nar_layers), {0: a, 3: s}, {0: span})
    with torch.no_grad():
        return torch.export.export(_StepModule(model, shape).eval(), _example_step(model, shape),
                                   dynamic_shapes=dims, strict=False)


CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32, 64)


def _calibrated(path: Path, model: Yue2ForConditionalGeneration, shape: StepShape, runner: Any) -> int:
    """The largest working set (rows) at which the package's step beat the eager one here, from
    `path` or measured into it: rows 1, 2, 4, ... until the package is slower (0: never faster)."""
    if path.exists():
        return int(json.loads(path.read_text())["max_rows"])
    layout = StepLayout(model)

    def eager_step(rows: Rows, enc: Yue2EncoderState, caches: list[Yue2KVCache], span: int) -> None:
        # As the loops step it: narrowed to the drafts the rows hold where that pays (`loop.py`).
        narrowed = shape.narrowed(int(rows.n_drafts.max())) if layout.narrow_pays else shape
        engine_step(model, rows, enc, caches, layout=layout, shape=narrowed, span=span)

    best = 0
    for a in CALIBRATION_ROWS:
        eager = _step_seconds(model, shape, a, eager_step)
        package = _step_seconds(model, shape, a, lambda rows, enc, caches, span: _call(
            runner, rows, enc, caches, span))
        if package >= eager:
            break
        best = a
    part = path.with_name(f".{path.name}.{os.getpid()}")  # written aside, then moved in whole
    part.write_text(json.dumps({"max_rows": best, "shape": _shape_name(shape)}) + "\n")
    os.replace(part, path)
    return best


@torch.inference_mode()
def _step_seconds(model: Yue2ForConditionalGeneration, shape: StepShape, a: int, step: Any) -> float:
    """Seconds per step of `a` rows decoding from a random source of 128 tokens (or the model's
    limit): the best of 3 runs
    of 12 steps from the start (a row that finishes early only idles: the cost stays a step's)."""
    cfg = model.config
    k, s, total = cfg.nar_block_size, min(128, cfg.max_position_embeddings), min(64, cfg.max_position_embeddings)
    gen = torch.Generator().manual_seed(0)
    enc = model.encode(torch.randint(4, cfg.vocab_size, (a, s), generator=gen))
    enc = Yue2EncoderState(hidden=enc.hidden, mask=torch.zeros(a, 1, 1, s), cross_kv=enc.cross_kv,
                           nar_cross_kv=enc.nar_cross_kv)
    runs = []
    for _ in range(3):
        rows = Rows.empty(a, k=k, t_buf=total + 2 * k + 2, device=torch.device("cpu"))
        rows.start(torch.arange(a), start_token=cfg.decoder_start_token_id, pad=cfg.pad_token_id, total=total,
                   min_total=0, draft_on=shape.drafts == "nar", accept_p=0.0, trust_p=2.0)
        caches = model.new_caches(batch_size=a, max_len=total + k + 1)
        start, reach = time.perf_counter(), 0
        for _ in range(12):
            step(rows, enc, caches, min(total + k + 1, reach + shape.width))
            reach += shape.width
        runs.append(time.perf_counter() - start)
    return min(runs) / 12
