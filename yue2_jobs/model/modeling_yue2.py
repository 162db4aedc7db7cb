"""YuE2: an encoder–decoder transformer with an AR decoder branch and a NAR drafter.

The whole forward pass lives here. Shapes: B batch, S encoder length, T decoder length,
K = nar_block_size draft slots, C = d_model, H heads, D = C // H head width, V vocab.

The encoder and AR branch are BART-shaped (post-LN blocks, learned positions offset by 2),
so a BART checkpoint converts losslessly. The NAR branch reads the AR hidden state at
position t plus the embedding of the token chosen there, and drafts tokens t+2 .. t+K+1 in
one pass; the confidence head scores each draft token. Both branches share the token
embedding and the tied output projection.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.utils import GENERATION_CONFIG_NAME

from yue2_jobs.model.configuration_yue2 import Yue2Config

POSITION_OFFSET = 2  # BART reserves the first two rows of its position table
# State-dict entries of the drafter (NAR branch, confidence head, draft vocabulary); every other
# entry is the encoder and AR branch, whose weights decide every `ar` output.
DRAFTER_PREFIXES = ("nar_slot_embed.", "nar_layernorm_embedding.", "nar_layers.", "confidence_head.", "draft_vocab")


def is_drafter_key(name: str) -> bool:
    """Whether a state-dict entry belongs to the drafter (training it never changes an `ar` output)."""
    return name.startswith(DRAFTER_PREFIXES)


@dataclass
class Yue2EncoderState:
    """What the decoder needs of the encoder: per-layer cross-attention keys and values."""

    hidden: torch.Tensor  # (B, S, C)
    mask: torch.Tensor | None  # (B, 1, 1, S) additive (0 or -inf); None when no key is padding
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per AR layer: (B, H, S, D) twice
    nar_cross_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per NAR layer

    def select(self, rows: torch.Tensor) -> Yue2EncoderState:
        """The state of some rows (B',) only: how a batch drops its finished rows."""
        def pick(kv: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return kv[0].index_select(0, rows), kv[1].index_select(0, rows)

        return Yue2EncoderState(
            hidden=self.hidden.index_select(0, rows),
            mask=None if self.mask is None else self.mask.index_select(0, rows),
            cross_kv=[pick(kv) for kv in self.cross_kv], nar_cross_kv=[pick(kv) for kv in self.nar_cross_kv],
        )


class Yue2KVCache:
    """Preallocated self-attention cache of one decoder layer (gpt-fast style)."""

    def __init__(self, *, batch_size: int, num_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (batch_size, num_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, T_max, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def update(self, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, H, T_new, D) at [start, start + T_new); return the filled prefix."""
        t = k.shape[2]
        self.k.narrow(2, start, t).copy_(k)
        self.v.narrow(2, start, t).copy_(v)
        return self.k.narrow(2, 0, start + t), self.v.narrow(2, 0, start + t)

    def scatter(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: int) -> tuple[torch.Tensor, ...]:
        """Write k, v (B, H, W, D) at per-row positions (B, W); return the first `span` positions.

        An indexed write rather than `scatter_`: a compiled step (`decode/compiled.py`) turns a
        scatter into a graph input into a copy of the whole cache, an index_put into a write in
        place."""
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]  # (B, 1)
        self.k[rows, :, positions] = k.transpose(1, 2)  # (B, W, H, D) at [row, :, position]
        self.v[rows, :, positions] = v.transpose(1, 2)
        return self.k.narrow(2, 0, span), self.v.narrow(2, 0, span)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only some rows (B',), in that order."""
        self.k, self.v = self.k.index_select(0, rows), self.v.index_select(0, rows)


class Yue2StepWeights(Protocol):
    """The matrices the inference step methods (`block_step`, `step`, `decode_block`,
    `draft_step`) multiply by. `linear(x, module)` must equal `module(x)`, `lm_logits(h)` the
    tied output projection and `draft_logits(h)` the model's `draft_logits(h)`; how the weights
    are laid out for that is the decoder's business (`yue2_jobs.decode.layout.StepLayout`), so the
    model stores no serving state."""

    def linear(self, x: torch.Tensor, module: nn.Linear) -> torch.Tensor: ...

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


def _drop(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that costs nothing at inference (F.dropout still dispatches an op)."""
    return F.dropout(x, p, True) if training and p > 0 else x


def _split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    b, t, c = x.shape
    return x.view(b, t, num_heads, c // num_heads).transpose(1, 2)  # (B, H, T, D)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)  # (B, T, C)


class Yue2SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, *, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                cache: Yue2KVCache | None = None, start: int = 0) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)  # (B, T, C) each
        q, k, v = (_split_heads(t, self.num_heads) for t in (q, k, v))  # (B, H, T, D)
        if cache is not None:
            k, v = cache.update(start, k, v)  # (B, H, start + T, D)
            t_new = q.shape[2]
            if t_new > 1:
                # Several new tokens at once: each sees the cache and the new tokens up to itself.
                key_pos = torch.arange(k.shape[2], device=x.device)
                query_pos = torch.arange(start, start + t_new, device=x.device)
                attn_mask, is_causal = key_pos[None, :] <= query_pos[:, None], False  # (T_new, T_all)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal)
        return self.out_proj(_merge_heads(y))

    def block_step(self, x: torch.Tensor, *, layout: Yue2StepWeights, cache: Yue2KVCache, positions: torch.Tensor,
                   span: int, mask: torch.Tensor) -> torch.Tensor:
        """W new tokens per row at per-row positions (B, W): x (B*W, C) -> (B*W, C).

        `mask` (B, 1, W, span) lets each query see the cache positions up to its own.
        """
        b, w = positions.shape
        qkv = layout.linear(x, self.qkv_proj).view(b, w, 3, self.num_heads, -1)  # (B, W, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, W, D) each
        k, v = cache.scatter(positions, k, v, span)  # (B, H, span, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, W, D)
        return layout.linear(y.transpose(1, 2).reshape(b * w, -1), self.out_proj)


class Yue2CrossAttention(nn.Module):
    """Attention from decoder queries to encoder states; K/V are computed once per input."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def project_kv(self, enc: torch.Tensor, *, layout: Yue2StepWeights | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, c = enc.shape
        kv = self.kv_proj(enc) if layout is None else layout.linear(enc.reshape(b * s, c), self.kv_proj)
        k, v = kv.reshape(b, s, 2 * c).chunk(2, dim=-1)  # (B, S, C) each
        return _split_heads(k, self.num_heads), _split_heads(v, self.num_heads)  # (B, H, S, D)

    def forward(self, x: torch.Tensor, *, kv: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None) -> torch.Tensor:
        q = _split_heads(self.q_proj(x), self.num_heads)  # (B, H, T, D)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask, dropout_p=p)
        return self.out_proj(_merge_heads(y))

    def block_step(self, x: torch.Tensor, *, layout: Yue2StepWeights, kv: tuple[torch.Tensor, torch.Tensor],
                   mask: torch.Tensor | None, width: int) -> torch.Tensor:
        """W queries per row: x (B*W, C) -> (B*W, C)."""
        bw = x.shape[0]
        q = layout.linear(x, self.q_proj).view(bw // width, width, self.num_heads, -1).transpose(1, 2)  # (B, H, W, D)
        y = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask)  # (B, H, W, D)
        return layout.linear(y.transpose(1, 2).reshape(bw, -1), self.out_proj)


class Yue2FeedForward(nn.Module):
    def __init__(self, d_model: int, ffn_dim: int, activation: str, activation_dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.act = ACT2FN[activation]
        self.activation_dropout = activation_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _drop(self.act(self.fc1(x)), self.activation_dropout, self.training)
        return self.fc2(h)


class Yue2EncoderLayer(nn.Module):
    def __init__(self, config: Yue2Config) -> None:
        super().__init__()
        c = config.d_model
        self.dropout: float = config.dropout
        self.self_attn = Yue2SelfAttention(c, config.encoder_attention_heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(c)
        self.ffn = Yue2FeedForward(c, config.encoder_ffn_dim, config.activation_function, config.activation_dropout)
        self.final_layer_norm = nn.LayerNorm(c)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.self_attn_layer_norm(x + _drop(self.self_attn(x, attn_mask=mask), self.dropout, self.training))
        return self.final_layer_norm(x + _drop(self.ffn(x), self.dropout, self.training))

    def infer(self, x: torch.Tensor, mask: torch.Tensor | None, *, layout: Yue2StepWeights, batch: tuple[int, int],
              lengths: list[int] | None = None) -> torch.Tensor:
        """`forward` at inference through the decode session's weights: x (B*S, C) -> (B*S, C)
        for the (B, S) = `batch` grid; or packed: x (N, C) holds only the real tokens, row after
        row, `lengths` of them per row. Packed, every product, norm and activation runs on real
        tokens only and each row attends over its own tokens (a padded batch of summaries is
        mostly padding, and attention costs the square of its length). A row's result is the
        same either way to rounding (tests/decode/test_layout.py), and the golden outputs
        (tests/decode/test_engine.py) are unchanged."""
        c = x.shape[1]
        attn, ln1, ln2, ffn = self.self_attn, self.self_attn_layer_norm, self.final_layer_norm, self.ffn
        qkv = layout.linear(x, attn.qkv_proj)  # (N, 3C)
        if lengths is None:
            b, s = batch
            q, k, v = qkv.view(b, s, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, S, D) each
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b * s, c)
        else:
            y = torch.empty_like(x)  # (N, C)
            for row, n, length in zip(qkv.split(lengths), y.split(lengths), lengths, strict=True):
                if length == 0:  # a row of padding only: nothing to attend from
                    continue
                q, k, v = row.view(1, length, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
                n.copy_(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(length, c))
        x = F.layer_norm(x + layout.linear(y, attn.out_proj), (c,), ln1.weight, ln1.bias, ln1.eps)
        h = ffn.act(layout.linear(x, ffn.fc1))  # (N, F)
        return F.layer_norm(x + layout.linear(h, ffn.fc2), (c,), ln2.weight, ln2.bias, ln2.eps)


class Yue2DecoderLayer(nn.Module):
    """AR block: causal self-attention (cached at inference), cross-attention, feed-forward."""

    def __init__(self, config: Yue2Config) -> None:
        super().__init__()
        c = config.d_model
        self.dropout: float = config.dropout
        self.self_attn = Yue2SelfAttention(c, config.decoder_attention_heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(c)
        self.encoder_attn = Yue2CrossAttention(c, config.decoder_attention_heads, config.attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(c)
        self.ffn = Yue2FeedForward(c, config.decoder_ffn_dim, config.activation_function, config.activation_dropout)
        self.final_layer_norm = nn.LayerNorm(c)

    def forward(self, x: torch.Tensor, *, cross_kv: tuple[torch.Tensor, torch.Tensor], enc_mask: torch.Tensor | None,
                cache: Yue2KVCache | None = None, start: int = 0) -> torch.Tensor:
        p, train = self.dropout, self.training
        a = self.self_attn(x, is_causal=cache is None, cache=cache, start=start)
        x = self.self_attn_layer_norm(x + _drop(a, p, train))
        x = self.encoder_attn_layer_norm(x + _drop(self.encoder_attn(x, kv=cross_kv, mask=enc_mask), p, train))
        return self.final_layer_norm(x + _drop(self.ffn(x), p, train))

    def block_step(self, x: torch.Tensor, *, layout: Yue2StepWeights, cross_kv: tuple[torch.Tensor, torch.Tensor],
                   enc_mask: torch.Tensor | None, cache: Yue2KVCache, positions: torch.Tensor, span: int,
                   self_mask: torch.Tensor) -> torch.Tensor:
        """Inference for W new tokens per row at per-row positions (B, W): x (B*W, C) -> (B*W, C).

        The same arithmetic as `forward`, on 2-D tensors through the functional ops: at a few
        tokens per row a decode step costs weight reads and op dispatch, not FLOPs, so every
        skipped reshape and module call counts.
        """
        c = (x.shape[-1],)
        ln1, ln2, ln3, ffn = self.self_attn_layer_norm, self.encoder_attn_layer_norm, self.final_layer_norm, self.ffn
        a = self.self_attn.block_step(x, layout=layout, cache=cache, positions=positions, span=span, mask=self_mask)
        x = F.layer_norm(x + a, c, ln1.weight, ln1.bias, ln1.eps)
        a = self.encoder_attn.block_step(x, layout=layout, kv=cross_kv, mask=enc_mask, width=positions.shape[1])
        x = F.layer_norm(x + a, c, ln2.weight, ln2.bias, ln2.eps)
        h = ffn.act(layout.linear(x, ffn.fc1))  # (B*W, F)
        return F.layer_norm(x + layout.linear(h, ffn.fc2), c, ln3.weight, ln3.bias, ln3.eps)


class Yue2NarLayer(nn.Module):
    """NAR block: bidirectional attention among the K draft slots of one position,
    cross-attention to the encoder, feed-forward."""

    def __init__(self, config: Yue2Config) -> None:
        super().__init__()
        c = config.d_model
        self.block_size: int = config.nar_block_size
        self.dropout: float = config.dropout
        self.self_attn = Yue2SelfAttention(c, config.decoder_attention_heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(c)
        self.encoder_attn = Yue2CrossAttention(c, config.decoder_attention_heads, config.attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(c)
        self.ffn = Yue2FeedForward(c, config.decoder_ffn_dim, config.activation_function, config.activation_dropout)
        self.final_layer_norm = nn.LayerNorm(c)

    def forward(self, x: torch.Tensor, *, cross_kv: tuple[torch.Tensor, torch.Tensor],
                enc_mask: torch.Tensor | None) -> torch.Tensor:
        b, tk, c = x.shape  # (B, T*K, C): queries of every position, K slots each
        p, train = self.dropout, self.training
        blocks = x.reshape(b * tk // self.block_size, self.block_size, c)  # (B*T, K, C)
        a = self.self_attn(blocks).reshape(b, tk, c)
        x = self.self_attn_layer_norm(x + _drop(a, p, train))
        # Cross-attention needs no per-position grouping: every query reads the same encoder.
        x = self.encoder_attn_layer_norm(x + _drop(self.encoder_attn(x, kv=cross_kv, mask=enc_mask), p, train))
        return self.final_layer_norm(x + _drop(self.ffn(x), p, train))


    def step(self, x: torch.Tensor, *, layout: Yue2StepWeights, cross_kv: tuple[torch.Tensor, torch.Tensor],
             enc_mask: torch.Tensor | None) -> torch.Tensor:
        """Inference for the K slots of one position per row: x (B*K, C) -> (B*K, C)."""
        bk, c = x.shape
        k, attn = self.block_size, self.self_attn
        ln1, ln2, ln3, ffn = self.self_attn_layer_norm, self.encoder_attn_layer_norm, self.final_layer_norm, self.ffn
        qkv = layout.linear(x, attn.qkv_proj).view(bk // k, k, 3, attn.num_heads, -1)  # (B, K, 3, H, D)
        q, kk, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, K, D) each
        y = F.scaled_dot_product_attention(q, kk, v).transpose(1, 2).reshape(bk, c)  # (B*K, C)
        x = F.layer_norm(x + layout.linear(y, attn.out_proj), (c,), ln1.weight, ln1.bias, ln1.eps)
        a = self.encoder_attn.block_step(x, layout=layout, kv=cross_kv, mask=enc_mask, width=k)
        x = F.layer_norm(x + a, (c,), ln2.weight, ln2.bias, ln2.eps)
        h = ffn.act(layout.linear(x, ffn.fc1))  # (B*K, F)
        return F.layer_norm(x + layout.linear(h, ffn.fc2), (c,), ln3.weight, ln3.bias, ln3.eps)


class Yue2ConfidenceHead(nn.Module):
    """p(accept) for each draft token, from the NAR hidden state and the draft's own certainty."""

    def __init__(self, config: Yue2Config) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.d_model + 2, config.confidence_hidden_dim)
        self.fc2 = nn.Linear(config.confidence_hidden_dim, 1)

    def forward(self, nar_hidden: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
        logp = draft_logits.float().log_softmax(-1)  # (..., V_d): over the draft vocabulary
        top_logp = logp.max(-1, keepdim=True).values  # (..., 1)
        entropy = -(logp.exp() * logp).sum(-1, keepdim=True)  # (..., 1)
        feats = torch.cat([nar_hidden, top_logp.to(nar_hidden.dtype), entropy.to(nar_hidden.dtype)], dim=-1)
        return self.fc2(F.gelu(self.fc1(feats))).squeeze(-1)  # (...) logits of p(accept)


class Yue2PreTrainedModel(PreTrainedModel):
    config: Yue2Config
    config_class = Yue2Config
    base_model_prefix = "yue2"
    main_input_name = "input_ids"
    # transformers declares it an instance attribute, so no ClassVar here.
    _no_split_modules = ["Yue2EncoderLayer", "Yue2DecoderLayer", "Yue2NarLayer"]  # noqa: RUF012
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, Yue2ForConditionalGeneration):
            init.zeros_(module.final_logits_bias)
            if module.draft_vocab is not None:
                init.copy_(module.draft_vocab, torch.arange(module.draft_vocab.shape[0]))
            # Sinusoids (scaled to the token embeddings' size) instead of noise: nearby positions
            # start out similar, so cross-attention learns to align and copy much sooner.
            for table in (module.encoder_embed_positions, module.decoder_embed_positions):
                init.copy_(table.weight, _sinusoids(*table.weight.shape) * self.config.init_std * math.sqrt(2))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike[Any] | None, *model_args: Any,
                        **kwargs: Any) -> Any:
        """Load a local YuE2 checkpoint; only safetensors weights (pickle files can run code).
        `yue2_jobs.model.checkpoint.load_checkpoint` verifies the files before it calls this."""
        if pretrained_model_name_or_path is None:
            raise ValueError("a YuE2 checkpoint directory is required")
        kwargs["use_safetensors"] = True
        model = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        if (Path(pretrained_model_name_or_path) / GENERATION_CONFIG_NAME).is_file():
            model.generation_config = GenerationConfig.from_pretrained(pretrained_model_name_or_path)
        return model

    def save_pretrained(self, save_directory: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
        """Save as Hugging Face does (safetensors) and add generation_config.json."""
        kwargs["safe_serialization"] = True
        super().save_pretrained(save_directory, *args, **kwargs)
        self.generation_config.save_pretrained(save_directory)


class Yue2ForConditionalGeneration(Yue2PreTrainedModel):
    """Encoder + AR decoder branch + NAR drafter + confidence head, one shared vocabulary."""

    def __init__(self, config: Yue2Config) -> None:
        super().__init__(config)
        c, positions = config.d_model, config.max_position_embeddings + POSITION_OFFSET
        self.embed_scale = math.sqrt(c) if config.scale_embedding else 1.0
        self.shared = nn.Embedding(config.vocab_size, c, padding_idx=config.pad_token_id)
        self.encoder_embed_positions = nn.Embedding(positions, c)
        self.encoder_layernorm_embedding = nn.LayerNorm(c)
        self.encoder_layers = nn.ModuleList(Yue2EncoderLayer(config) for _ in range(config.encoder_layers))
        self.decoder_embed_positions = nn.Embedding(positions, c)
        self.decoder_layernorm_embedding = nn.LayerNorm(c)
        self.decoder_layers = nn.ModuleList(Yue2DecoderLayer(config) for _ in range(config.decoder_layers))
        self.nar_slot_embed = nn.Embedding(config.nar_block_size, c)
        self.nar_layernorm_embedding = nn.LayerNorm(c)
        self.nar_layers = nn.ModuleList(Yue2NarLayer(config) for _ in range(config.nar_layers))
        self.confidence_head = Yue2ConfidenceHead(config)
        self.final_logits_bias = nn.Buffer(torch.zeros(1, config.vocab_size))
        # The output projection is the token embedding (tied, as in BART) unless the config unties
        # it: a widened model needs input embeddings replicated and output rows scaled down, two
        # scales one matrix cannot hold (`benchmarks/grown.py`).
        self.lm_head: nn.Linear | None = (
            None if config.tie_word_embeddings else nn.Linear(c, config.vocab_size, bias=False))
        # (V_d,) sorted token ids; None (a buffer slot the state dict skips): the whole vocabulary
        self.draft_vocab: torch.Tensor | None
        self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size) if config.draft_vocab_size else None)
        self.generation_config = default_generation_config(config)
        self.post_init()

    # ---- embeddings and output projection ------------------------------------------------

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def enc_layers(self) -> Sequence[Yue2EncoderLayer]:
        """`encoder_layers` as what they are."""
        return cast("Sequence[Yue2EncoderLayer]", self.encoder_layers)

    def ar_layers(self) -> Sequence[Yue2DecoderLayer]:
        """`decoder_layers` as what they are (an `nn.ModuleList` is typed as holding any module)."""
        return cast("Sequence[Yue2DecoderLayer]", self.decoder_layers)

    def nar_blocks(self) -> Sequence[Yue2NarLayer]:
        """`nar_layers` as what they are."""
        return cast("Sequence[Yue2NarLayer]", self.nar_layers)

    def set_input_embeddings(self, value: nn.Module) -> None:
        if not isinstance(value, nn.Embedding):
            raise TypeError(f"the input embeddings must be an nn.Embedding, got {type(value).__name__}")
        self.shared = value

    def _embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.shared(ids)
        return x * self.embed_scale if self.embed_scale != 1.0 else x

    def output_weight(self) -> torch.Tensor:
        """(V, C): the output projection's matrix, the token embedding unless the config unties them."""
        return self.shared.weight if self.lm_head is None else self.lm_head.weight

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output projection: (..., C) -> (..., V)."""
        return F.linear(hidden, self.output_weight(), self.final_logits_bias[0])

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The NAR branch's output projection: (..., C) -> (..., V_d), onto the draft vocabulary
        (`draft_vocab`; column i scores token `draft_vocab[i]`), or (..., V) without one."""
        if self.draft_vocab is None:
            return self.lm_logits(hidden)
        ids = self.draft_vocab
        return F.linear(hidden, self.output_weight()[ids], self.final_logits_bias[0, ids])

    def set_draft_vocab(self, ids: torch.Tensor | Sequence[int] | None) -> None:
        """Restrict what the NAR branch drafts to these token ids (None: the whole vocabulary).
        The config's `draft_vocab_size` follows, so the checkpoint saved next loads with them."""
        if ids is None:
            self.draft_vocab = None
            self.config.draft_vocab_size = 0
            return
        unique = torch.as_tensor(ids, dtype=torch.long).unique(sorted=True)
        if unique.numel() == 0 or int(unique[0]) < 0 or int(unique[-1]) >= self.config.vocab_size:
            raise ValueError(f"a draft vocabulary needs 1 or more ids in [0, {self.config.vocab_size})")
        self.draft_vocab = unique.to(self.shared.weight.device)
        self.config.draft_vocab_size = int(unique.numel())

    def _check_length(self, length: int, what: str) -> None:
        if length > self.config.max_position_embeddings:
            raise ValueError(
                f"{what} has {length} tokens; the limit (max_position_embeddings) is "
                f"{self.config.max_position_embeddings}"
            )

    # ---- encoder ---------------------------------------------------------------------------

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
               layout: Yue2StepWeights | None = None) -> Yue2EncoderState:
        """The encoder and every decoder layer's cross-attention K/V. `layout`: at inference, the
        decode session's weights (`Yue2StepWeights`), which hold the encoder's matrices too."""
        s = input_ids.shape[1]
        self._check_length(s, "input_ids")
        if attention_mask is None:
            attention_mask = input_ids.ne(self.config.pad_token_id)
        keep = attention_mask.bool()
        mask = None  # padding-free batches skip masking in every attention call
        if not bool(keep.all()):
            mask = torch.zeros(keep.shape, dtype=self.shared.weight.dtype, device=keep.device)
            mask = mask.masked_fill(~keep, float("-inf"))[:, None, None, :]  # (B, 1, 1, S)
        pos = self.encoder_embed_positions.weight[POSITION_OFFSET : s + POSITION_OFFSET]  # (S, C)
        if layout is not None:
            x = self._encode_inference(input_ids, keep, mask, layout=layout)
        else:
            x = self._embed_tokens(input_ids) + pos  # (B, S, C)
            x = _drop(self.encoder_layernorm_embedding(x), self.config.dropout, self.training)
            for layer in self.enc_layers():
                x = layer(x, mask)
        return Yue2EncoderState(
            hidden=x, mask=mask,
            cross_kv=[layer.encoder_attn.project_kv(x, layout=layout) for layer in self.ar_layers()],
            nar_cross_kv=[layer.encoder_attn.project_kv(x, layout=layout) for layer in self.nar_blocks()],
        )

    def _encode_inference(self, input_ids: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor | None, *,
                          layout: Yue2StepWeights) -> torch.Tensor:
        """The encoder's layers through `layout` (B, S) -> (B, S, C); with padding, on the real
        tokens only (`Yue2EncoderLayer.infer`), their hidden states put back with zeros where
        padding (masked wherever the state is read)."""
        b, s = input_ids.shape
        c = self.config.d_model
        ln = self.encoder_layernorm_embedding
        # Packed on the CPU only: a row-by-row attention loop and a host read would cost a GPU more.
        packed = mask is not None and input_ids.device.type == "cpu"
        tokens = keep.reshape(-1).nonzero().squeeze(1) if packed else None  # (N,) flat positions
        flat = input_ids.reshape(-1) if tokens is None else input_ids.reshape(-1).index_select(0, tokens)
        at = torch.arange(b * s, device=input_ids.device) if tokens is None else tokens
        x = self._embed_tokens(flat) + self.encoder_embed_positions.weight[at % s + POSITION_OFFSET]  # (N, C)
        x = F.layer_norm(x, (c,), ln.weight, ln.bias, ln.eps)
        lengths = None if tokens is None else keep.sum(1).tolist()
        for layer in self.enc_layers():
            x = layer.infer(x, mask, layout=layout, batch=(b, s), lengths=lengths)
        if tokens is not None:
            x = x.new_zeros(b * s, c).index_copy_(0, tokens, x)
        return x.view(b, s, c)

    # ---- AR branch -------------------------------------------------------------------------

    def decode(self, decoder_input_ids: torch.Tensor, enc: Yue2EncoderState, *,
               caches: list[Yue2KVCache] | None = None, start: int = 0) -> torch.Tensor:
        """AR decoder over tokens at positions [start, start + T); returns hidden (B, T, C).

        Without caches the pass is causal over the whole sequence (training, scoring).
        """
        t = decoder_input_ids.shape[1]
        self._check_length(start + t, "decoder sequence")
        pos = self.decoder_embed_positions.weight[start + POSITION_OFFSET : start + t + POSITION_OFFSET]  # (T, C)
        x = self._embed_tokens(decoder_input_ids) + pos  # (B, T, C)
        x = _drop(self.decoder_layernorm_embedding(x), self.config.dropout, self.training)
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, cross_kv=enc.cross_kv[i], enc_mask=enc.mask,
                      cache=None if caches is None else caches[i], start=start)
        return x

    def decode_block(self, tokens: torch.Tensor, enc: Yue2EncoderState, *, caches: list[Yue2KVCache],
                     positions: torch.Tensor, layout: Yue2StepWeights, span: int | None = None) -> torch.Tensor:
        """AR inference over W tokens per row at per-row positions: tokens, positions (B, W) -> hidden (B, W, C).

        What hybrid verification runs: rows sit at different lengths, so each writes its cache
        at its own positions and each query sees the cache up to its own position (a query
        never sees a position after it, so stale entries there from rejected drafts are
        harmless). Positions past the position table (drafts beyond the length limit, which
        are never accepted) read its last row instead of failing. `span` (1 + the largest
        position), when the caller knows it, saves reading it back from the device.
        """
        b, w = tokens.shape
        ln = self.decoder_layernorm_embedding
        limit = self.config.max_position_embeddings - 1
        x = F.embedding(tokens.reshape(-1), self.shared.weight)  # (B*W, C)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        pos = positions.clamp(max=limit).reshape(-1) + POSITION_OFFSET  # (B*W,)
        x = x + F.embedding(pos, self.decoder_embed_positions.weight)
        x = F.layer_norm(x, (x.shape[-1],), ln.weight, ln.bias, ln.eps)
        span = min(int(positions.max()) + 1 if span is None else span, caches[0].k.shape[2])
        key_pos = torch.arange(span, device=tokens.device)
        self_mask = (key_pos <= positions[:, :, None])[:, None]  # (B, 1, W, span)
        for i, layer in enumerate(self.ar_layers()):
            x = layer.block_step(x, layout=layout, cross_kv=enc.cross_kv[i], enc_mask=enc.mask, cache=caches[i],
                                 positions=positions, span=span, self_mask=self_mask)
        return x.view(b, w, -1)

    def new_caches(self, *, batch_size: int, max_len: int) -> list[Yue2KVCache]:
        cfg = self.config
        p = self.shared.weight
        return [
            Yue2KVCache(batch_size=batch_size, num_heads=cfg.decoder_attention_heads, max_len=max_len,
                        head_dim=cfg.d_model // cfg.decoder_attention_heads, dtype=p.dtype, device=p.device)
            for _ in range(cfg.decoder_layers)
        ]

    # ---- NAR branch --------------------------------------------------------------------------

    def draft_hidden(self, ar_hidden: torch.Tensor, next_tokens: torch.Tensor,
                     enc: Yue2EncoderState) -> torch.Tensor:
        """NAR hidden states of the K draft slots after each position, in one pass.

        ar_hidden (B, T, C): AR hidden state at positions t; next_tokens (B, T): the token
        chosen at t + 1 (AR argmax at inference, the AR's own choice in training).
        Returns (B, T, K, C); slot j drafts the token at t + 2 + j.
        """
        b, t, c = ar_hidden.shape
        k = self.config.nar_block_size
        base = ar_hidden + self._embed_tokens(next_tokens)  # (B, T, C)
        x = base[:, :, None, :] + self.nar_slot_embed.weight  # (B, T, K, C)
        x = _drop(self.nar_layernorm_embedding(x), self.config.dropout, self.training)
        x = x.reshape(b, t * k, c)  # (B, T*K, C)
        for i, layer in enumerate(self.nar_layers):
            x = layer(x, cross_kv=enc.nar_cross_kv[i], enc_mask=enc.mask)
        return x.reshape(b, t, k, c)

    def draft(self, ar_hidden: torch.Tensor, next_tokens: torch.Tensor,
              enc: Yue2EncoderState) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits (B, T, K, V_d) over the draft vocabulary for tokens t+2 .. t+K+1, and
        confidence logits (B, T, K)."""
        x = self.draft_hidden(ar_hidden, next_tokens, enc)  # (B, T, K, C)
        logits = self.draft_logits(x)  # (B, T, K, V_d)
        return logits, self.confidence_head(x, logits)

    def draft_tokens(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """The token ids (...) the draft logits (..., V_d) choose greedily."""
        best = draft_logits.argmax(-1)
        return best if self.draft_vocab is None else self.draft_vocab[best]

    def draft_step(self, hidden: torch.Tensor, next_tokens: torch.Tensor, enc: Yue2EncoderState, *,
                   layout: Yue2StepWeights) -> tuple[torch.Tensor, torch.Tensor]:
        """`draft` for one position per row at inference: hidden (B, C), next_tokens (B,) ->
        draft logits (B, K, V_d) and confidence logits (B, K), through the decode-step layout."""
        b, c = hidden.shape
        k, ln = self.config.nar_block_size, self.nar_layernorm_embedding
        x = hidden + F.embedding(next_tokens, self.shared.weight) * self.embed_scale  # (B, C)
        x = x[:, None, :] + self.nar_slot_embed.weight  # (B, K, C)
        x = F.layer_norm(x, (c,), ln.weight, ln.bias, ln.eps).reshape(b * k, c)  # (B*K, C)
        for i, layer in enumerate(self.nar_blocks()):
            x = layer.step(x, layout=layout, cross_kv=enc.nar_cross_kv[i], enc_mask=enc.mask)
        logits = layout.draft_logits(x).reshape(b, k, -1)  # (B, K, V_d)
        return logits, self.confidence_head(x.view(b, k, c), logits)

    @torch.no_grad()
    def init_drafter_from_ar(self) -> None:
        """Start the drafter afresh from the AR branch: NAR layer i a copy of AR layer
        `decoder_layers - nar_layers + i` (the top ones: they already map a hidden state and a
        token to the next token's features, which is what slot 1 needs one position further on),
        the slot embeddings small and random, the confidence head re-initialised and the draft
        vocabulary the whole vocabulary. What a converted BART starts from, and `train-drafter
        --fresh`."""
        ar, nar = self.ar_layers(), self.nar_blocks()
        for i, layer in enumerate(nar):
            layer.load_state_dict(ar[max(0, len(ar) - len(nar) + i)].state_dict())
        self.nar_layernorm_embedding.reset_parameters()
        self.nar_slot_embed.weight.normal_(0.0, self.config.init_std)
        for module in self.confidence_head.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, self.config.init_std)
                module.bias.zero_()
        self.set_draft_vocab(None)

    # ---- the Hugging Face entry point ---------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        return_dict: bool | None = None,
        **kwargs: object,
    ) -> Seq2SeqLMOutput:
        """Teacher-forced AR pass: logits (B, T, V) and, with `labels`, the cross-entropy loss."""
        if input_ids is None:
            raise ValueError("input_ids is required")
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("pass decoder_input_ids or labels")
            decoder_input_ids = shift_tokens_right(labels, pad_token_id=self.config.pad_token_id,
                                                   decoder_start_token_id=self.config.decoder_start_token_id)
        enc = self.encode(input_ids, attention_mask)
        logits = self.lm_logits(self.decode(decoder_input_ids, enc))  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return Seq2SeqLMOutput(loss=loss, logits=logits, encoder_last_hidden_state=enc.hidden)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """YuE2 decodes outside the model: the model holds weights, a `DecodeSession` holds what a
        decode needs besides (device, dtype, step layout, CUDA graphs, the `auto` chooser)."""
        raise TypeError("Yue2ForConditionalGeneration has no generate(); decode with "
                        "yue2_jobs.decode.DecodeSession(model).generate(input_ids, attention_mask, params) "
                        "(params: yue2_jobs.decode.DecodingParams, or its fields as keywords)")


def _sinusoids(length: int, dim: int) -> torch.Tensor:
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # (L, 1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))  # (C/2,)
    table = torch.zeros(length, dim)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return table  # (L, C)


def default_generation_config(config: Yue2Config) -> GenerationConfig:
    """Greedy decoding that ends every row with EOS at the length limit, as BART does."""
    return GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
        forced_eos_token_id=config.eos_token_id, num_beams=1, do_sample=False,
    )


def shift_tokens_right(labels: torch.Tensor, *, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs for teacher forcing: start token, then labels shifted right (-100 -> pad)."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def register_auto_classes() -> None:
    """`yue2` in the transformers Auto classes (config, seq2seq model, tokenizer)."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

    AutoConfig.register("yue2", Yue2Config, exist_ok=True)
    AutoModelForSeq2SeqLM.register(Yue2Config, Yue2ForConditionalGeneration, exist_ok=True)
    AutoTokenizer.register(Yue2Config, fast_tokenizer_class=PreTrainedTokenizerFast, exist_ok=True)


register_auto_classes()  # importing the model file is enough to load its checkpoints with the Auto classes
