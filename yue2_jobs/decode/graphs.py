"""The engine step replayed from CUDA graphs: one graph per row bucket (as vLLM and SGLang do).

A decode step of a small model on a GPU is bound by kernel launches and host work, not by the
weights: replaying a captured graph launches the whole step at once. `StepGraphs.capture` records
`engine_step` for each bucket (1, 2, 4, 8, ... rows) over static buffers sized for the model's
limits: per-row state, self-attention caches at full length, cross-attention K/V and the encoder
mask at the full source length (padding masked out). `run` copies a working set into the smallest
bucket that holds it (the extra rows idle: finished, so they commit nothing), replays, and copies
the state back; attention reads the full static cache length, masked per row.

Greedy decoding only (sampling draws from a generator, which a replay would repeat). The encoder
pass stays eager. `replay` can be swapped for a plain call of the step, which is how CPU tests run
every line here but the graph calls themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from yue2_jobs.decode.engine import StepShape, engine_step
from yue2_jobs.decode.layout import StepLayout
from yue2_jobs.decode.rows import Rows
from yue2_jobs.model.modeling_yue2 import Yue2EncoderState, Yue2ForConditionalGeneration, Yue2KVCache

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class _Bucket:
    rows: Rows
    caches: list[Yue2KVCache]
    enc: Yue2EncoderState  # static K/V (N, H, S_max, D) and mask (N, 1, 1, S_max)
    replay: Callable[[], None]


class StepGraphs:
    """Captured engine steps for one model and one `StepShape`, one per row bucket."""

    def __init__(self, model: Yue2ForConditionalGeneration, *, shape: StepShape, buckets: tuple[int, ...]) -> None:
        if shape.params.do_sample:
            raise ValueError("CUDA graphs replay greedy steps only; sampling runs eagerly")
        cfg = model.config
        k, limit = cfg.nar_block_size, cfg.max_position_embeddings - 1
        self.model, self.shape, self.k = model, shape, k
        self.t_buf, self.t_cache, self.s_max = 1 + limit + 2 * k + 2, 1 + limit + k + 1, cfg.max_position_embeddings
        self.buckets: dict[int, _Bucket] = {}
        self.sizes = tuple(sorted(buckets))
        self.capture_s = 0.0

    @classmethod
    def capture(cls, model: Yue2ForConditionalGeneration, *, shape: StepShape, layout: StepLayout,
                buckets: tuple[int, ...] = DEFAULT_BUCKETS, use_graphs: bool | None = None) -> StepGraphs:
        """Allocate each bucket's buffers and capture its step (`use_graphs` False: a plain call
        replays it, for CPU tests; None: graphs on CUDA only)."""
        graphs = cls(model, shape=shape, buckets=buckets)
        dev = model.shared.weight.device
        use = dev.type == "cuda" if use_graphs is None else use_graphs
        start = time.perf_counter()
        for n in graphs.sizes:
            rows, caches, enc = graphs._buffers(n, dev)

            def step(rows: Rows = rows, caches: list[Yue2KVCache] = caches, enc: Yue2EncoderState = enc) -> None:
                engine_step(model, rows, enc, caches, layout=layout, shape=shape, span=graphs.t_cache)

            graphs.buckets[n] = _Bucket(rows=rows, caches=caches, enc=enc,
                                        replay=graphed(step) if use else step)
        if use:
            torch.cuda.synchronize(dev)
        graphs.capture_s = time.perf_counter() - start
        return graphs

    def _buffers(self, n: int, dev: torch.device) -> tuple[Rows, list[Yue2KVCache], Yue2EncoderState]:
        cfg = self.model.config
        dtype = self.model.shared.weight.dtype
        h = cfg.decoder_attention_heads
        d = cfg.d_model // h
        rows = Rows.empty(n, k=self.k, t_buf=self.t_buf, device=dev)
        caches = self.model.new_caches(batch_size=n, max_len=self.t_cache)

        def kv() -> tuple[torch.Tensor, torch.Tensor]:
            return (torch.zeros(n, h, self.s_max, d, dtype=dtype, device=dev),
                    torch.zeros(n, h, self.s_max, d, dtype=dtype, device=dev))

        mask = torch.zeros(n, 1, 1, self.s_max, dtype=dtype, device=dev)
        enc = Yue2EncoderState(hidden=mask, mask=mask, cross_kv=[kv() for _ in range(cfg.decoder_layers)],
                               nar_cross_kv=[kv() for _ in range(cfg.nar_layers)])
        return rows, caches, enc

    @property
    def count(self) -> int:
        return len(self.buckets)

    def bucket_for(self, n: int) -> int | None:
        return next((b for b in self.sizes if b >= n), None)

    @torch.inference_mode()
    def run(self, rows: Rows, enc: Yue2EncoderState, caches: list[Yue2KVCache]) -> bool:
        """One step of the working set `rows` (A rows) through the smallest bucket that holds it;
        False (nothing done) when A exceeds the largest bucket: the caller steps eagerly."""
        a = rows.buf.shape[0]
        size = self.bucket_for(a)
        if size is None:
            return False
        b = self.buckets[size]
        _load(b, rows, enc, caches)
        b.replay()
        _store(b, rows, caches)
        return True


def graphed(step: Callable[[], None]) -> Callable[[], None]:
    """Capture `step` in a CUDA graph after warm-up runs on a side stream (PyTorch's recipe)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def _load(b: _Bucket, rows: Rows, enc: Yue2EncoderState, caches: list[Yue2KVCache]) -> None:
    """Copy a working set (A rows) into a bucket's buffers; the rest of the bucket idles."""
    a, t_buf = rows.buf.shape
    for f in fields(Rows):
        dst, src = getattr(b.rows, f.name), getattr(rows, f.name)
        if f.name == "buf":
            dst[:a, :t_buf].copy_(src)
        else:
            dst[:a].copy_(src)
    b.rows.finished[a:] = True
    for dst, src in zip(b.caches, caches, strict=True):
        t = src.k.shape[2]
        dst.k[:a, :, :t].copy_(src.k)
        dst.v[:a, :, :t].copy_(src.v)
    s = enc.cross_kv[0][0].shape[2]
    mask = b.enc.mask
    assert mask is not None
    mask.fill_(float("-inf"))
    if enc.mask is None:
        mask[:a, :, :, :s] = 0.0
    else:
        mask[:a, :, :, :s].copy_(enc.mask)
    for dst, src in zip([*b.enc.cross_kv, *b.enc.nar_cross_kv], [*enc.cross_kv, *enc.nar_cross_kv], strict=True):
        dst[0][:a, :, :s].copy_(src[0])
        dst[1][:a, :, :s].copy_(src[1])


def _store(b: _Bucket, rows: Rows, caches: list[Yue2KVCache]) -> None:
    """Copy the stepped state of the first A rows back to the working set."""
    a, t_buf = rows.buf.shape
    for f in fields(Rows):
        dst, src = getattr(rows, f.name), getattr(b.rows, f.name)
        dst.copy_(src[:a, :t_buf] if f.name == "buf" else src[:a])
    for dst, src in zip(caches, b.caches, strict=True):
        t = dst.k.shape[2]
        dst.k.copy_(src.k[:a, :, :t])
        dst.v.copy_(src.v[:a, :, :t])
