"""Byte-level BPE tokenizer for YuE2: any UTF-8 (CJK, emoji, control characters) round-trips.

Special tokens follow BART's ids (<s>=0, <pad>=1, </s>=2, <unk>=3) so the config's defaults
and a converted BART checkpoint agree. Encoded inputs are wrapped as `<s> ... </s>`.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>"]


def train_tokenizer(texts: Iterable[str], *, vocab_size: int, model_max_length: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` and wrap it for `AutoTokenizer`."""
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    return _wrap(tok, model_max_length)


def clean_copy(tokenizer: PreTrainedTokenizerBase, *, model_max_length: int) -> PreTrainedTokenizerFast:
    """The same vocabulary without the truncation/padding state that encoding calls leave behind.

    Calling a fast tokenizer with `truncation=True, max_length=N` sets that truncation on the
    backend, and `save_pretrained` would write it into tokenizer.json.
    """
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return _wrap(backend, model_max_length)


def _wrap(tok: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        padding_side="right",
    )
