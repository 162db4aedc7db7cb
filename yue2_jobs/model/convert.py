"""Import a BART checkpoint into YuE2 (and export YuE2's AR path back to BART).

The encoder and AR branch have BART's exact shapes, so the import is a renaming plus
fusing q/k/v into one projection; the NAR branch starts as a copy of the AR branch's top
layer (`init_drafter_from_ar`) and the confidence head fresh, ready for `yue2 train-drafter`.
Export is the inverse and lets Hugging Face's own `generate` run on the very same weights (the
benchmark's baseline).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration

from yue2_jobs.errors import CheckpointError
from yue2_jobs.model.checkpoint import save_checkpoint
from yue2_jobs.model.configuration_yue2 import Yue2Config
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration

# BART config fields that YuE2 mirrors one-to-one.
SHARED_FIELDS = (
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
    "activation_function", "dropout", "attention_dropout", "activation_dropout", "scale_embedding",
    "init_std", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
)
# Decoding defaults that both models keep in their generation_config.
GENERATION_FIELDS = ("decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id", "repetition_penalty",
                     "no_repeat_ngram_size")
# (YuE2 name pattern, BART name pattern) for parameters that map one to one.
_RENAMES = [
    (r"shared\.weight", r"model.shared.weight"),
    (r"final_logits_bias", r"final_logits_bias"),
    (r"(encoder|decoder)_embed_positions\.weight", r"model.\1.embed_positions.weight"),
    (r"(encoder|decoder)_layernorm_embedding\.(weight|bias)", r"model.\1.layernorm_embedding.\2"),
    (r"(encoder|decoder)_layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)",
     r"model.\1.layers.\2.self_attn.out_proj.\3"),
    (r"(encoder|decoder)_layers\.(\d+)\.(self_attn_layer_norm|final_layer_norm|encoder_attn_layer_norm)\.(weight|bias)",
     r"model.\1.layers.\2.\3.\4"),
    (r"(encoder|decoder)_layers\.(\d+)\.ffn\.(fc1|fc2)\.(weight|bias)", r"model.\1.layers.\2.\3.\4"),
    (r"decoder_layers\.(\d+)\.encoder_attn\.(q_proj|out_proj)\.(weight|bias)",
     r"model.decoder.layers.\1.encoder_attn.\2.\3"),
]
# (YuE2 fused name pattern, BART prefix template, parts fused in order)
_FUSED = [
    (r"(encoder|decoder)_layers\.(\d+)\.self_attn\.qkv_proj\.(weight|bias)",
     "model.{0}.layers.{1}.self_attn.{p}.{2}", ("q_proj", "k_proj", "v_proj")),
    (r"decoder_layers\.(\d+)\.encoder_attn\.kv_proj\.(weight|bias)",
     "model.decoder.layers.{0}.encoder_attn.{p}.{1}", ("k_proj", "v_proj")),
]


def _bart_names_for(name: str) -> list[str] | None:
    """The BART parameter name(s) behind one YuE2 AR/encoder parameter, or None for NAR parts."""
    for pattern, repl in _RENAMES:
        if re.fullmatch(pattern, name):
            return [re.sub(pattern, repl, name)]
    for pattern, template, parts in _FUSED:
        m = re.fullmatch(pattern, name)
        if m:
            return [template.format(*m.groups(), p=p) for p in parts]
    return None


def yue2_config_from_bart(bart: BartConfig, **overrides: object) -> Yue2Config:
    if getattr(bart, "normalize_before", False) or getattr(bart, "add_final_layer_norm", False):
        raise CheckpointError("pre-LayerNorm BART variants (mBART-style) are not supported")
    fields = {f: getattr(bart, f) for f in SHARED_FIELDS if hasattr(bart, f)}
    fields["tie_word_embeddings"] = getattr(bart, "tie_word_embeddings", True)
    # BART's fields arrive as a mapping of names the two configs share; Yue2Config checks them.
    return Yue2Config(**fields, **overrides)  # type: ignore[arg-type]


def yue2_from_bart(bart: BartForConditionalGeneration) -> Yue2ForConditionalGeneration:
    """A YuE2 model whose encoder and AR branch carry `bart`'s weights exactly."""
    src = bart.state_dict()
    model = Yue2ForConditionalGeneration(yue2_config_from_bart(bart.config))
    for field in GENERATION_FIELDS:
        setattr(model.generation_config, field, getattr(bart.generation_config, field, None))
    new_state = model.state_dict()
    for name in new_state:
        bart_names = _bart_names_for(name)
        if bart_names is None:
            continue  # the drafter: started from the AR branch below
        missing = [n for n in bart_names if n not in src]
        if missing:
            raise CheckpointError(f"BART checkpoint lacks {missing[0]}")
        new_state[name] = torch.cat([src[n] for n in bart_names], dim=0)
    if model.lm_head is not None:  # an untied BART: its own output matrix
        new_state["lm_head.weight"] = src["lm_head.weight"]
    model.load_state_dict(new_state)
    model.init_drafter_from_ar()
    return model.eval()


def bart_from_yue2(model: Yue2ForConditionalGeneration) -> BartForConditionalGeneration:
    """The AR path of `model` as a `BartForConditionalGeneration` with identical weights."""
    cfg = model.config
    bart = BartForConditionalGeneration(BartConfig(**{f: getattr(cfg, f) for f in SHARED_FIELDS},
                                                   tie_word_embeddings=model.lm_head is None))
    target = bart.state_dict()
    for name, tensor in model.state_dict().items():
        bart_names = _bart_names_for(name)
        if bart_names is None:
            continue
        for bart_name, part in zip(bart_names, tensor.chunk(len(bart_names), dim=0), strict=True):
            target[bart_name] = part.clone()
    target["lm_head.weight"] = model.output_weight().detach().clone()
    for side in ("encoder", "decoder"):
        target[f"model.{side}.embed_tokens.weight"] = target["model.shared.weight"]
    bart.load_state_dict(target)
    for field in GENERATION_FIELDS:
        setattr(bart.generation_config, field, getattr(model.generation_config, field))
    return bart.eval()


def convert_bart_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """`yue2 convert-bart SRC DST`: import a local BART directory as a YuE2 checkpoint."""
    src_path = Path(src)
    if not src_path.is_dir():
        raise CheckpointError(f"BART checkpoint directory {str(src_path)!r} does not exist", path=str(src_path))
    bart = BartForConditionalGeneration.from_pretrained(src_path, use_safetensors=True)
    model = yue2_from_bart(bart)
    tokenizer = None
    if (src_path / "tokenizer.json").is_file() or (src_path / "vocab.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(src_path)
    return save_checkpoint(model, tokenizer, dst)
