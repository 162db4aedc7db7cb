"""The decode step's weight layout: the AR and NAR branches' matrices as a decode step reads them.

A `DecodeSession` owns one (through `Steps`) and rebuilds it when the weights change; the model's
inference step methods take it as their `Yue2StepWeights`. A decode step multiplies a few rows
(M = rows x slots) by every matrix once, so on a CPU it is bound by reading the weights, and how
they are laid out and which kernel reads them is the step's largest lever. Measured on the 2-core
CPU (`benchmarks/peers.py`; docs/measured.md, "Decoding speed"):

- fp32: oneDNN's linear on weights packed once reads a matrix about twice as fast as MKL at
  every M (the BART-base vocabulary: 1.8 ms at M = 1 and 2.5 at M = 5, against MKL's best of 5.3
  and 4.9; an FFN matrix 0.06-0.07 against 0.10-0.27 ms), flat from one row to the verify pass's
  1 + K: that is what keeps a `hybrid` step near the cost of an `ar` one (MKL's small-M GEMM
  re-reads the matrix: the vocabulary at M = 5 took 12.4 ms). Matrices too small for oneDNN to
  pay (a call costs about 15 us) stay in cache and go through MKL.
- int8 (`Int8Matrix`): weights quantized per output channel, activations per row, exact int32
  sums (fbgemm's static-input int8 linear on x86 with exact sums, else `torch._int_mm`): the
  BART-base vocabulary in 0.6 ms at M = 1 and 0.8 at M = 5. A row's product does not depend on
  the other rows (fbgemm's dynamic int8 linear quantizes activations per tensor, so there it
  would). torchao's int8 configurations measured 4-8x slower than fp32 on this CPU.

On other devices every fp32/bf16 matrix is a view and every product is `x @ W.T` (cuBLAS has no
such cliffs, and CUDA graphs want one kernel per shape).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Literal

import torch
from torch import nn

from yue2_jobs.model.modeling_yue2 import Yue2DecoderLayer, Yue2ForConditionalGeneration, Yue2NarLayer

WeightFormat = Literal["float", "int8"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = ("float", "int8")


class DenseMatrix:
    """One float matrix with its bias: `x (M, in) -> (M, out)`, the kernel chosen for the CPU.

    `weight` (out, in) is the module's own tensor (a view, no copy). On the CPU a matrix of
    `ONEDNN_MIN_NUMEL` elements or more is packed once for oneDNN, whose product reads it about
    twice as fast as MKL's on this AMD CPU at every M (and gives each row the same result at any
    M); a smaller one, where a oneDNN call's overhead dominates, goes through MKL (one row reads
    an (in, out) copy where `io_copy` asks for one: the vocabulary projections)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, *, io_copy: bool, many_rows: bool = False) -> None:
        self.weight, self.bias = weight, bias  # (out, in), (out,)
        self.cpu = weight.device.type == "cpu"
        big = weight.numel() >= ONEDNN_MIN_NUMEL
        self.packed = _onednn_pack(weight, rows=PREFILL_ROWS if many_rows else 8) if self.cpu and (big or many_rows) \
            else None
        self.io = weight.t().contiguous() if io_copy and self.cpu and self.packed is None else None  # (in, out)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if x.shape[0] == 1 and self.io is not None:
            return torch.addmm(self.bias, x, self.io)
        # Small enough to stay in cache, so MKL's small-M GEMM re-reading it costs little; its
        # skinny-N `W @ x.T` would hand attention a transposed view, which sends SDPA to its slow
        # math path.
        return torch.addmm(self.bias, x, self.weight.t())


ONEDNN_MIN_NUMEL = 256 * 1024  # measured: 192 x 640 is faster through MKL, 192 x 4096 through oneDNN
# The prefill's matrices multiply every source token of a batch (M = B x S, hundreds to thousands
# of rows), where oneDNN's packed product is compute-bound at 440-500 GFLOP/s on the 2-core AMD
# CPU and MKL's at 200-220 at every size (192 x 576 at M = 2,048: 1.02 ms against 2.06), so they
# are packed whatever their size; tuned for this many rows.
PREFILL_ROWS = 2048


def _onednn_pack(weight: torch.Tensor, *, rows: int = 8) -> torch.Tensor | None:
    """`weight` (out, in) packed for oneDNN's fp32 linear (tuned for `rows` rows), or None where
    this torch has no oneDNN."""
    if weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)


class Int8Matrix:
    """One matrix in int8 (symmetric, per output channel): `x (M, in) fp32 -> (M, out) fp32`.

    x is quantized per row (symmetric, scale max|x_row| / L) to integers x_i, and
    y = (x_i @ W_q.T) * s_col * s_row + bias with exact int32 sums. On x86 the product is fbgemm's
    static-input int8 linear (input scale 1, so x_i enters it unrounded; one kernel from M = 1 to
    the verify pass's 1 + K slots, 0.6 -> 0.8 ms for the BART-base vocabulary on AVX-512 VNNI);
    elsewhere `torch._int_mm`. L is 127 (zero point 128) where fbgemm's sums are exact for 8-bit
    activations; on CPUs whose kernel adds u8 x s8 pairs in saturating int16 (AVX2 without VNNI)
    it is 63 (zero point 64: unsigned inputs up to 127, so a pair's sum stays within int16 and
    the sums stay exact), where `torch._int_mm` was about 10x slower than fp32
    (`fbgemm_activation_levels`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        w = weight.detach().float()
        self.scale = w.abs().amax(1).clamp(min=1e-12) / 127.0  # (out,)
        q = torch.round(w / self.scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()  # (out, in)
        self.bias = bias.detach().float().clone()  # (out,)
        self.packed = _fbgemm_pack(q, self.scale)
        self.levels = fbgemm_activation_levels() if self.packed is not None else 127
        self.q = q if self.packed is None else None
        self.out_features, self.in_features = q.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        s = x.abs().amax(-1, keepdim=True).div_(self.levels).clamp_(min=1e-30)  # (M, 1)
        xi = torch.div(x, s).round_()  # integers in [-levels, levels]
        if self.packed is not None:
            y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(xi, 1.0, self.levels + 1,
                                                                                  self.packed)
            return torch.addcmul(self.bias, y, s)  # y already carries s_col
        assert self.q is not None
        y = torch._int_mm(xi.to(torch.int8), self.q.t()).to(x.dtype)  # (M, out), exact
        return torch.addcmul(self.bias, y.mul_(s), self.scale)


def _fbgemm_pack(q: torch.Tensor, scale: torch.Tensor) -> Any | None:
    """fbgemm's packed int8 weight (x86 only), or None where the quantized engine lacks it or its
    sums are not exact on this CPU at any activation width."""
    if "fbgemm" not in torch.backends.quantized.supported_engines or not fbgemm_activation_levels():
        return None
    with warnings.catch_warnings():  # quantized tensors are deprecated as a user type; the kernel is not
        warnings.simplefilter("ignore")
        wq = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
        return torch.ops.quantized.linear_prepack(wq, None)


@functools.cache
def fbgemm_activation_levels() -> int:
    """The widest activation range (127 or 63, zero point one above it) for which fbgemm's int8
    product equals exact integer arithmetic here on the worst cases (every weight at +-127, every
    activation at the range's ends); 0 where neither does. Its AVX-512 VNNI kernels sum in int32;
    older x86 kernels add u8 x s8 pairs in saturating int16, which 8-bit inputs at zero point 128
    overflow (255 x 127 x 2) and 7-bit inputs at zero point 64 cannot (127 x 127 x 2 < 32,768)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return 0
    q = torch.full((16, 64), 127, dtype=torch.int8)
    q[1::2] = -127
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wq = torch._make_per_channel_quantized_tensor(q, torch.ones(16, dtype=torch.double),
                                                      torch.zeros(16, dtype=torch.long), 0)
        packed = torch.ops.quantized.linear_prepack(wq, None)
    for levels in (127, 63):
        x = torch.full((4, 64), float(levels))
        x[1], x[3, ::2] = -levels, -levels
        got = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(x, 1.0, levels + 1, packed)
        if torch.equal(got, x @ q.float().t()):
            return levels
    return 0


Matrix = DenseMatrix | Int8Matrix


class StepLayout:
    """The model's matrices laid out for inference: the AR and NAR branches' for decode steps
    (few tokens per row), and the encoder's and the cross-attention K/V projections for the prefill.

    `linear(x, module)` equals `module(x)` (to rounding), `lm_logits` the vocabulary projection,
    `draft_logits` the NAR branch's projection onto the draft vocabulary (the model's `draft_vocab`;
    all of the vocabulary when the model has none).
    `weights="int8"` (CPU only) quantizes every one of them; embeddings, norms and attention stay
    in the model's dtype.
    """

    def __init__(self, model: Yue2ForConditionalGeneration, *, weights: WeightFormat = "float") -> None:
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
        vocab = model.output_weight().detach()
        if weights == "int8" and vocab.device.type != "cpu":
            raise ValueError("int8 weights run on the CPU (torch._int_mm); on CUDA use bfloat16")
        self.key, self.weights = weights_key(model), weights

        def matrix(weight: torch.Tensor, bias: torch.Tensor, *, io_copy: bool = False,
                   many_rows: bool = False) -> Matrix:
            if weights == "int8":
                return Int8Matrix(weight, bias)
            return DenseMatrix(weight.detach(), bias.detach(), io_copy=io_copy, many_rows=many_rows)

        self.matrices: dict[nn.Linear, Matrix] = {}
        prefill: list[nn.Linear] = []  # multiplied once per input, by every source token
        for enc in model.enc_layers():
            prefill += [enc.self_attn.qkv_proj, enc.self_attn.out_proj, enc.ffn.fc1, enc.ffn.fc2]
        layers: list[Yue2DecoderLayer | Yue2NarLayer] = [*model.ar_layers(), *model.nar_blocks()]
        prefill += [layer.encoder_attn.kv_proj for layer in layers]  # the cross-attention K/V
        steps = [m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.out_proj,
                                                   layer.encoder_attn.q_proj, layer.encoder_attn.out_proj,
                                                   layer.ffn.fc1, layer.ffn.fc2)]
        for lin in prefill:
            self.matrices[lin] = matrix(lin.weight, lin.bias, many_rows=True)
        for lin in steps:
            self.matrices[lin] = matrix(lin.weight, lin.bias)
        # Whether a step should feed only the slots its drafts fill (`StepShape.narrowed`): where
        # every row fed costs work. It does through MKL's small-M product (base's 192 x 576 at 5
        # rows: 2.5x one row) and fbgemm's int8 one (BART-base's 768 x 2304: 0.146 ms at 5 rows,
        # 0.073 at one; base grown to 768 in int8, batch 1: 6-12 % faster narrowed, four paired
        # runs). oneDNN's packed fp32 product costs about the same at 1 to 5 rows (the vocabulary
        # at 768: 8-11 ms either way), and switching row counts step to step cost more than the
        # rows saved (base grown to 768, batch 1: 7 % slower narrowed, six paired runs).
        ar_linears = [m for layer in model.ar_layers() for m in (layer.self_attn.qkv_proj, layer.ffn.fc1)]
        # Only what was measured: fp32 through MKL, and int8 (bf16 on the CPU was not).
        self.narrow_pays = all(isinstance(m, Int8Matrix) or (isinstance(m, DenseMatrix) and m.cpu and m.packed is None
                                                             and m.weight.dtype == torch.float32)
                               for m in (self.matrices[lin] for lin in ar_linears))
        bias = model.final_logits_bias[0].detach()
        self.vocab = matrix(vocab, bias, io_copy=True)  # (V, C)
        ids = model.draft_vocab  # (V_d,) or None
        self.draft = self.vocab if ids is None else matrix(vocab[ids], bias[ids], io_copy=True)  # (V_d, C)

    def is_current(self, model: Yue2ForConditionalGeneration) -> bool:
        """Whether `model`'s weights are still the ones laid out here."""
        return self.key is not None and self.key == weights_key(model)

    def linear(self, x: torch.Tensor, module: nn.Linear) -> torch.Tensor:
        return self.matrices[module](x)  # (M, in) -> (M, out)

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.vocab(hidden)  # (M, C) -> (M, V)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.draft(hidden)  # (M, C) -> (M, V_d)



def weights_key(model: Yue2ForConditionalGeneration) -> tuple[tuple[int, int], ...] | None:
    """Changes whenever a weight is replaced or modified in place (optimizer steps, loading).

    None for weights created under `torch.inference_mode()`, which keep no version counter:
    their layout cannot be known to be current, so it is rebuilt on every use.
    """
    weights = (*model.encoder_layers.parameters(), *model.decoder_layers.parameters(),
               *model.nar_layers.parameters(), model.shared.weight,
               *([] if model.lm_head is None else [model.lm_head.weight]),
               model.final_logits_bias, *([] if model.draft_vocab is None else [model.draft_vocab]))
    if any(w.is_inference() for w in weights):
        return None
    return tuple((w.data_ptr(), w._version) for w in weights)
