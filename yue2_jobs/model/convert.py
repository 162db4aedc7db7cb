"""Import a BART checkpoint into YuE2 (and export YuE2's AR path back to BART).

The encoder and AR branch have BART's exact shapes, so the import is a renaming plus
fusing q/k/v into one projection; the NAR branch starts as a copy of the AR branch's top
layer (`init_drafter_from_ar`) and the confidence head fresh, ready for `yue2 train-drafter`.
Export is the inverse and lets Hugging Face's own `generate` run on the very same weights (the
benchmark's baseline).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from yue2_jobs.errors import CheckpointError, CheckpointFileMissingError, PickleWeightsRefusedError
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


# What `config.json`'s architectures may name: BART's seq2seq model with its LM head, or without it
# (`BartModel`), whose head a tied config derives from the shared embedding; the weight check below
# refuses an untied `BartModel`, whose head would be random.
_SEQ2SEQ_ARCHITECTURES = ("BartForConditionalGeneration", "BartModel")
_EXPECTED = "a BART seq2seq model (model_type 'bart', BartForConditionalGeneration)"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_SHOWN = 3  # offending names a message lists before "and N more": it stays one readable line
# Special tokens that summarisation reads or writes: one of them past the embedding is refused, never dropped.
_KEPT_SPECIALS = ("bos", "eos", "pad", "unk")


@dataclass(frozen=True)
class BartImport:
    """What `convert_bart_checkpoint` wrote; `weights` counts the BART tensors carried over."""

    src: Path
    out: Path
    weights: int
    dropped: tuple[str, ...] = ()  # special tokens left out of the written tokenizer, as "<mask> (id 50264)"

    @property
    def message(self) -> str:
        # a dropped token changes how its literal text tokenizes: the user learns it here, not from odd output
        dropped = (f"; dropped the tokenizer's {_listed(list(self.dropped))}: the model has no embedding row for "
                   f"{'it' if len(self.dropped) == 1 else 'them'}") if self.dropped else ""
        # the drafter is the one part not read from SRC (`init_drafter_from_ar`): say what it is
        return (f"wrote {self.out}: encoder and AR decoder from {self.src} ({self.weights} weights){dropped}; the "
                f"draft branch is untrained (NAR layers copied from the AR top layers, slot embeddings and "
                f"confidence head fresh): train it with `yue2 train-drafter`")


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own warnings and progress bars off, restored after: a broken source makes it print
    a line per weight, and the checks here say what matters in one line of their own."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _bart_config(src: Path) -> BartConfig:
    """`src`'s config, refused unless it is BART's seq2seq model (mBART and the rest name other types)."""
    path = src / "config.json"
    if not path.is_file():
        raise CheckpointFileMissingError(f"{src} has no config.json; convert-bart expects {_EXPECTED} saved with "
                                         f"save_pretrained", path=str(src))
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({_first_line(exc)})", path=str(path)) from exc
    raw = raw if isinstance(raw, dict) else {}
    model_type, archs = raw.get("model_type"), raw.get("architectures") or []
    archs = archs if isinstance(archs, list) else [archs]
    if model_type != "bart" or any(a not in _SEQ2SEQ_ARCHITECTURES for a in archs):
        found = (f"model_type {model_type!r}" if model_type else "no model_type") + (
            f" ({', '.join(map(str, archs))})" if archs else "")
        raise CheckpointError(f"{path} says {found}; convert-bart expects {_EXPECTED}", path=str(path))
    return BartConfig.from_dict(raw)


def _require_safetensors(src: Path) -> None:
    if (src / "model.safetensors").is_file() or (src / "model.safetensors.index.json").is_file():
        return
    pickles = sorted(p.name for p in src.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise PickleWeightsRefusedError(f"{src} holds its weights only as pickle ({_listed(pickles)}), which can run "
                                        f"code when loaded; convert-bart reads model.safetensors (re-save the model "
                                        f"with save_pretrained, which writes it)", path=str(src))
    raise CheckpointFileMissingError(f"{src} has no model.safetensors; convert-bart expects {_EXPECTED} saved with "
                                     f"save_pretrained", path=str(src))


def _load_bart(src: Path) -> BartForConditionalGeneration:
    """`src`'s weights, refused unless every one the config asks for is there with its shape and nothing else.

    transformers 5.24 lists no key at all for a complete save_pretrained directory, tied or untied, nor
    for a `BartModel` whose config ties the head: it derives the tied copies (`lm_head.weight`, the
    encoder's and decoder's `embed_tokens`) and keeps `final_logits_bias` (a buffer) at BART's zeros
    without listing them. So no listed key is excused: each would be random or thrown away.
    """
    try:  # mismatched shapes reported, not raised, so that they are named like the rest
        # transformers types the call as returning the model alone; with output_loading_info it is a pair
        loaded = cast(tuple[BartForConditionalGeneration, dict[str, Any]], BartForConditionalGeneration.from_pretrained(
            src, use_safetensors=True, output_loading_info=True, ignore_mismatched_sizes=True))
    except Exception as exc:  # the loader's own errors (a truncated file, a bad header): one line
        raise CheckpointError(f"cannot load the BART weights in {src}: {_first_line(exc)}", path=str(src)) from exc
    bart, info = loaded
    problems = []
    for key, what in (("missing_keys", "missing"), ("unexpected_keys", "unexpected")):
        if info[key]:
            problems.append(f"{len(info[key])} {what} ({_listed(sorted(info[key]))})")
    if info["mismatched_keys"]:
        shapes = sorted(f"{name} is {list(got)}, not {list(want)}"
                        for name, got, want in info["mismatched_keys"])
        problems.append(f"{len(shapes)} of the wrong shape ({_listed(shapes)})")
    if info["error_msgs"]:
        problems.append(f"{len(info['error_msgs'])} load errors ({_listed(sorted(info['error_msgs']))})")
    if problems:
        raise CheckpointError(f"the weights in {src} do not match its config.json: {'; '.join(problems)}; convert-bart "
                              f"imports complete BART weights only, nothing left to random initialisation",
                              path=str(src))
    return bart.eval()


def _beyond_vocabulary(tokenizer: PreTrainedTokenizerBase, src: Path, vocab_size: int) -> dict[int, str]:
    """The tokens at ids `vocab_size` and up when each is a special token summarisation never uses (BART's
    `<mask>`: facebook/bart-large-cnn's tokenizer has it at 50264, its embedding 50264 rows), to be dropped;
    none when the tokenizer fits. Any other token there is refused: text would encode to it and the model
    has no row to look it up in."""
    if len(tokenizer) <= vocab_size:
        return {}
    beyond = {i: token for token, i in tokenizer.get_vocab().items() if i >= vocab_size}
    added, kept = tokenizer.added_tokens_decoder, {getattr(tokenizer, f"{n}_token_id") for n in _KEPT_SPECIALS}
    if beyond and all(i in added and added[i].special and i not in kept for i in beyond):
        return dict(sorted(beyond.items()))
    extra = [repr(t) for t in tokenizer.convert_ids_to_tokens(list(range(vocab_size, len(tokenizer))))]
    raise CheckpointError(f"the tokenizer in {src} has {len(tokenizer)} tokens but config.json's vocab_size is "
                          f"{vocab_size}: ids {vocab_size} and up ({_listed(extra)}) have no embedding row",
                          path=str(src))


def _content(value: object) -> object:
    """A special token as tokenizer_config.json writes it: the string, or an AddedToken's fields."""
    return value.get("content") if isinstance(value, dict) else value


def _edit_tokenizer_files(directory: Path, dropped: dict[int, str]) -> None:
    """Remove `dropped` from the tokenizer `save_pretrained` wrote in `directory`: tokenizer.json's added
    tokens and model vocabulary, and every mention in tokenizer_config.json."""
    names = set(dropped.values())
    path = directory / "tokenizer.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    body["added_tokens"] = [t for t in body.get("added_tokens", []) if t.get("id") not in dropped]
    vocab = body.get("model", {}).get("vocab")
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel; BART's vocab.json lists <mask> here too
        for i, token in dropped.items():
            if vocab.get(token) == i:
                del vocab[token]
    path.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    decoder, ids = config.get("added_tokens_decoder"), {str(i) for i in dropped}  # its keys are strings
    if isinstance(decoder, dict):
        config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if k not in ids}
    for key, value in list(config.items()):
        if key.endswith("_token") and _content(value) in names:
            config[key] = None  # None, not deleted: BART's tokenizer class would add its default <mask> back
        elif isinstance(value, list) and key in ("additional_special_tokens", "extra_special_tokens"):
            config[key] = [v for v in value if _content(v) not in names]
        elif isinstance(value, dict) and key == "extra_special_tokens":
            config[key] = {k: v for k, v in value.items() if _content(v) not in names}
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_tokenizer_without(tokenizer: PreTrainedTokenizerBase, dropped: dict[int, str], directory: Path,
                             src: Path, vocab_size: int) -> None:
    """Save `tokenizer` to `directory` without the `dropped` tokens, then load it back and refuse it unless
    it fits the embedding and the dropped tokens' own text encodes to ids that have rows."""
    tokenizer.save_pretrained(directory)
    shown = _listed([repr(t) for t in dropped.values()])
    if not (directory / "tokenizer.json").is_file():  # a tokenizer without the tokenizers library's file
        raise CheckpointError(f"the tokenizer in {src} has {shown} past config.json's vocab_size {vocab_size} and "
                              f"no tokenizer.json to drop it from", path=str(src))
    _edit_tokenizer_files(directory, dropped)
    try:
        written = AutoTokenizer.from_pretrained(directory)
        ids = written("a " + " ".join(dropped.values()) + " b").input_ids
    except Exception as exc:  # the edited files did not load: one line, like every other refusal
        raise CheckpointError(f"the tokenizer in {src} does not load once {shown} past config.json's vocab_size "
                              f"{vocab_size} is dropped: {_first_line(exc)}", path=str(src)) from exc
    if len(written) > vocab_size or max(ids) >= vocab_size:
        raise CheckpointError(f"the tokenizer in {src} does not fit config.json's vocab_size {vocab_size} once "
                              f"{shown} is dropped: {len(written)} tokens, and text encodes to ids up to {max(ids)}",
                              path=str(src))


def _load_tokenizer(src: Path, config: BartConfig) -> tuple[PreTrainedTokenizerBase, dict[int, str]]:
    """`src`'s tokenizer, refused unless it loads, fits the embedding and names the config's special ids:
    one that does not would fail (or index past the embedding) only once the model is served. With it, the
    unused special tokens past the embedding (`_beyond_vocabulary`) that the written tokenizer leaves out."""
    if (src / "tokenizer.json").is_file():
        files = "tokenizer.json"
    elif (src / "vocab.json").is_file() and (src / "merges.txt").is_file():
        files = "vocab.json and merges.txt"
    else:
        half = [n for n in ("vocab.json", "merges.txt") if (src / n).is_file()]
        has = f" (only {half[0]})" if half else ""
        raise CheckpointFileMissingError(f"{src} has no tokenizer{has}: convert-bart needs tokenizer.json, or "
                                         f"vocab.json and merges.txt, saved beside the model by the tokenizer's "
                                         f"save_pretrained", path=str(src))
    try:
        tokenizer = AutoTokenizer.from_pretrained(src)
    except Exception as exc:  # the tokenizer library's own errors: one line naming the files read
        raise CheckpointError(f"cannot load the tokenizer in {src} ({files}): {_first_line(exc)}",
                              path=str(src)) from exc
    dropped = _beyond_vocabulary(tokenizer, src, config.vocab_size)
    for name in ("bos", "eos", "pad"):
        want, got = getattr(config, f"{name}_token_id"), getattr(tokenizer, f"{name}_token_id")
        if want is not None and got != want:
            token = getattr(tokenizer, f"{name}_token")
            has = f"{name} id {got} ({token!r})" if got is not None else f"no {name} token"
            raise CheckpointError(f"the tokenizer in {src} has {has} but config.json's {name}_token_id is {want}",
                                  path=str(src))
    return tokenizer, dropped


def _imported_count(model: Yue2ForConditionalGeneration) -> int:
    """The BART tensors `model` carries: those behind its encoder and AR branch, and an untied head."""
    names = {bart_name for name in model.state_dict() for bart_name in _bart_names_for(name) or []}
    return len(names) + (model.lm_head is not None)


def convert_bart_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> BartImport:
    """`yue2 convert-bart SRC DST`: import a local BART directory as a YuE2 checkpoint, or refuse it in one
    line (a `CheckpointError`) before writing anything. Nothing written is random: the draft branch is
    the only part not read from SRC, and `yue2_from_bart` starts it from the AR branch."""
    src_path, dst_path = Path(src), Path(dst)
    if not src_path.is_dir():
        raise CheckpointError(f"BART checkpoint directory {str(src_path)!r} does not exist", path=str(src_path))
    if dst_path.exists() and (not dst_path.is_dir() or any(dst_path.iterdir())):
        raise CheckpointError(f"{dst_path} already exists and is not an empty directory; convert-bart writes a new "
                              f"checkpoint directory", path=str(dst_path))
    config = _bart_config(src_path)
    _require_safetensors(src_path)
    with _quiet_transformers(), tempfile.TemporaryDirectory(prefix="yue2-convert-bart-") as scratch:
        tokenizer, dropped = _load_tokenizer(src_path, config)  # before the weights: the cheaper check
        if dropped:  # written and checked outside DST, so that a refusal still leaves nothing there
            _write_tokenizer_without(tokenizer, dropped, Path(scratch), src_path, config.vocab_size)
        model = yue2_from_bart(_load_bart(src_path))
        if dropped:  # the very files checked above: saving the reloaded tokenizer again would add fields
            shutil.copytree(scratch, dst_path, dirs_exist_ok=True)
        out = save_checkpoint(model, None if dropped else tokenizer, dst_path)  # its manifest lists them
    return BartImport(src=src_path, out=out, weights=_imported_count(model),
                      dropped=tuple(f"{token} (id {i})" for i, token in dropped.items()))
