"""Widen a YuE2 model without changing what it computes (Net2WiderNet for post-LN transformers).

What `benchmarks/grown.py` measures `hybrid` on: a shipped checkpoint grown to BART-base's width
(and beyond) decodes the shipped model's tokens with its real drafts, so its tau is real, while
every matrix a step reads has a BART's size, so its step costs are a BART's.

Every hidden feature is copied `r = d_model' / d_model` times (the copies side by side: feature
j of the grown model is feature j mod d_model), and every attention head with it (the head width
stays, so the softmax scale does too). A matrix reading hidden features divides its weights by the
number of copies of each feature it reads, so it sums to what it did; a matrix writing them
repeats its rows. Then the residual stream is the old one copied r times, which every LayerNorm
normalises to the same values (the mean and variance of r copies are the original's), and the
output logits are the old ones. Feed-forward units are copied unevenly to reach any inner width
(BART's 4 x d_model): a unit copied n times has its output weights divided by n.

Input embeddings are copied unscaled while the output rows must be divided by r, which one tied
matrix cannot do: the grown model unties its output projection. Vocabulary ids past the original
ones get random rows and a final bias of `MASKED_BIAS`, so they are never chosen; the tokenizer
never produces them. Depth is kept: a post-LN layer cannot be added as an exact identity (its
LayerNorm re-normalises whatever it adds to), so the grown model has the original's layers.
Sums over r times more terms round differently, so a decode can differ from the original's where
its top two logits tie within float rounding; `benchmarks/grown.py` counts those.
"""

from __future__ import annotations

import torch

from yue2_jobs.model.configuration_yue2 import Yue2Config
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration

MASKED_BIAS = -1.0e4  # far below any real logit (they are O(10)), finite so no kernel meets an inf


class _Map:
    """Which original unit each grown unit copies (`src`), and how many copies each original has."""

    def __init__(self, n: int, grown: int) -> None:
        if grown < n:
            raise ValueError(f"cannot shrink {n} units to {grown}")
        self.src = torch.arange(grown) % n  # every unit once, then again from the first: evenly as can be
        self.copies = torch.bincount(self.src, minlength=n).double()

    @classmethod
    def concat(cls, *maps: _Map) -> _Map:
        """Maps of consecutive blocks (q, k, v of a fused projection) as one."""
        out = cls.__new__(cls)
        offsets = [0]
        for m in maps[:-1]:
            offsets.append(offsets[-1] + len(m.copies))
        out.src = torch.cat([m.src + off for m, off in zip(maps, offsets, strict=True)])
        out.copies = torch.cat([m.copies for m in maps])
        return out


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, *, out: _Map, inp: _Map
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear layer reading copied inputs and writing copied outputs: same sums as before."""
    w = weight.double()[out.src][:, inp.src] / inp.copies[inp.src]  # (out', in')
    return w.to(weight.dtype), None if bias is None else bias[out.src].clone()


def _columns(table: torch.Tensor, hidden: _Map) -> torch.Tensor:
    """Rows that are hidden states (embeddings, LayerNorm parameters): their features copied."""
    return table[..., hidden.src].clone()


def grown_config(config: Yue2Config, *, d_model: int, ffn_dim: int, vocab_size: int) -> Yue2Config:
    if d_model % config.d_model:
        raise ValueError(f"d_model {d_model} is not a multiple of {config.d_model}")
    r = d_model // config.d_model
    return config.replaced(d_model=d_model, encoder_ffn_dim=ffn_dim, decoder_ffn_dim=ffn_dim, vocab_size=vocab_size,
                           encoder_attention_heads=r * config.encoder_attention_heads,
                           decoder_attention_heads=r * config.decoder_attention_heads, tie_word_embeddings=False)


@torch.no_grad()
def grow(model: Yue2ForConditionalGeneration, *, d_model: int, ffn_dim: int, vocab_size: int,
         seed: int = 0) -> Yue2ForConditionalGeneration:
    """`model` widened to `d_model` (a multiple of its own), feed-forward width `ffn_dim` (at least its
    own) and `vocab_size` ids (at least its own), computing the same logits (to float rounding)."""
    cfg = model.config
    if cfg.encoder_ffn_dim != cfg.decoder_ffn_dim:
        raise ValueError("growing needs one feed-forward width for the encoder and the decoder")
    new_cfg = grown_config(cfg, d_model=d_model, ffn_dim=ffn_dim, vocab_size=vocab_size)
    torch.manual_seed(seed)
    grown = Yue2ForConditionalGeneration(new_cfg).eval()  # extra vocabulary rows keep its random init
    hid, ffn = _Map(cfg.d_model, d_model), _Map(cfg.encoder_ffn_dim, ffn_dim)
    r = d_model // cfg.d_model
    fused = {"qkv_proj": _Map.concat(hid, hid, hid), "kv_proj": _Map.concat(hid, hid)}
    conf_in = _Map.concat(hid, _Map(2, 2))  # the confidence head reads the hidden state and two scalars
    state, new_state = model.state_dict(), grown.state_dict()
    v = cfg.vocab_size
    for name, t in state.items():
        leaf = name.rsplit(".", 2)
        if name == "draft_vocab":
            new_state[name] = t.clone()
        elif name == "final_logits_bias":
            new_state[name][:, :v] = t
            new_state[name][:, v:] = MASKED_BIAS
        elif name == "lm_head.weight":
            continue  # an untied source's output rows: grown with the embedding, below
        elif name == "shared.weight":
            # With scale_embedding the model multiplies embeddings by sqrt(d_model), which grows
            # by sqrt(r): the copied rows are divided by it, so the scaled inputs stay as they were.
            new_state[name][:v] = _columns(t, hid) / (r**0.5 if cfg.scale_embedding else 1.0)
            new_state["lm_head.weight"][:v] = _columns(model.output_weight(), hid) / r
        elif name == "confidence_head.fc1.weight" or name == "confidence_head.fc1.bias":
            w, b = _linear(state["confidence_head.fc1.weight"], state["confidence_head.fc1.bias"],
                           out=_Map(t.shape[0], t.shape[0]), inp=conf_in)
            new_state[name] = w if name.endswith("weight") else b
        elif name.startswith("confidence_head.fc2"):
            new_state[name] = t.clone()
        elif t.dim() == 2 and leaf[-2] in ("qkv_proj", "kv_proj", "q_proj", "out_proj", "fc1", "fc2"):
            out = fused.get(leaf[-2], ffn if leaf[-2] == "fc1" else hid)
            w, _ = _linear(t, None, out=out, inp=ffn if leaf[-2] == "fc2" else hid)
            new_state[name] = w
        elif name.endswith(".bias") and leaf[-2] in ("qkv_proj", "kv_proj", "q_proj", "out_proj", "fc1", "fc2"):
            new_state[name] = t[fused.get(leaf[-2], ffn if leaf[-2] == "fc1" else hid).src].clone()
        else:  # embeddings and LayerNorm parameters: hidden states, copied
            new_state[name] = _columns(t, hid)
    grown.set_draft_vocab(model.draft_vocab)
    grown.load_state_dict(new_state)
    grown.generation_config = model.generation_config
    return grown
