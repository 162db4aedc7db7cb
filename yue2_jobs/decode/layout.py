"""The decode step's weight layout: the AR and NAR branches' matrices as a decode step reads them.

A `DecodeSession` owns one (through `Steps`) and rebuilds it when the weights change; the model's
inference step methods take it as their `Yue2StepWeights`.
"""

from __future__ import annotations

import torch
from torch import nn

from yue2_jobs.model.modeling_yue2 import Yue2DecoderLayer, Yue2ForConditionalGeneration, Yue2NarLayer


class StepLayout:
    """The AR and NAR branches' matrices laid out for decode steps (few tokens per row).

    `linear(x, module)` equals `module(x)`. On the CPU, MKL's fp32 matrix-vector product reads
    an (in, out) row-major matrix faster than nn.Linear's (out, in) one (README, "Measured") when
    out >= in (QKV, cross-attention and output projections, FFN input, the tied vocabulary
    projection) and slower when out < in (FFN output), so the former get a transposed copy
    and the latter a view. A batch-1 decode step is bound by reading weights, which makes
    this its largest lever; the copies cost the AR branch's size again in memory. On other
    devices every matrix is a view.
    """

    def __init__(self, model: Yue2ForConditionalGeneration) -> None:
        self.key = weights_key(model)
        copy = model.shared.weight.device.type == "cpu"

        def layout(weight: torch.Tensor) -> torch.Tensor:  # (out, in) -> (in, out)
            out_features, in_features = weight.shape
            return weight.t().contiguous() if copy and out_features >= in_features else weight.t()

        self.matrices: dict[nn.Linear, torch.Tensor] = {}
        layers: list[Yue2DecoderLayer | Yue2NarLayer] = [*model.ar_layers(), *model.nar_blocks()]
        for layer in layers:
            for lin in (layer.self_attn.qkv_proj, layer.self_attn.out_proj, layer.encoder_attn.q_proj,
                        layer.encoder_attn.out_proj, layer.ffn.fc1, layer.ffn.fc2):
                self.matrices[lin] = layout(lin.weight.detach())
        self.vocab_matrix = layout(model.shared.weight.detach())  # (C, V)
        self.vocab_bias = model.final_logits_bias[0]  # (V,)

    def is_current(self, model: Yue2ForConditionalGeneration) -> bool:
        """Whether `model`'s weights are still the ones laid out here."""
        return self.key is not None and self.key == weights_key(model)

    def linear(self, x: torch.Tensor, module: nn.Linear) -> torch.Tensor:
        return torch.addmm(module.bias, x, self.matrices[module])  # (B, in) -> (B, out)

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.vocab_bias, hidden, self.vocab_matrix)  # (B, C) -> (B, V)


def weights_key(model: Yue2ForConditionalGeneration) -> tuple[tuple[int, int], ...] | None:
    """Changes whenever a weight is replaced or modified in place (optimizer steps, loading).

    None for weights created under `torch.inference_mode()`, which keep no version counter:
    their layout cannot be known to be current, so it is rebuilt on every use.
    """
    weights = (*model.decoder_layers.parameters(), *model.nar_layers.parameters(), model.shared.weight,
               model.final_logits_bias)
    if any(w.is_inference() for w in weights):
        return None
    return tuple((w.data_ptr(), w._version) for w in weights)
