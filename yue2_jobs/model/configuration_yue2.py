"""YuE2 model configuration."""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import PretrainedConfig

# Named sizes. `tiny` is what the shipped checkpoints use (≤ 15 MB on disk in fp32);
# `small` and `base` are the shapes a GPU deployment would train.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=4096, d_model=192, encoder_layers=2, decoder_layers=2, nar_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=640, decoder_ffn_dim=640, max_position_embeddings=320,
    ),
    "small": dict(
        vocab_size=16384, d_model=384, encoder_layers=4, decoder_layers=4, nar_layers=2,
        encoder_attention_heads=6, decoder_attention_heads=6,
        encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_position_embeddings=512,
    ),
    "base": dict(
        vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6, nar_layers=2,
        encoder_attention_heads=12, decoder_attention_heads=12,
        encoder_ffn_dim=3072, decoder_ffn_dim=3072, max_position_embeddings=1024,
    ),
}


class Yue2Config(PretrainedConfig):
    r"""Configuration of a [`Yue2ForConditionalGeneration`] model.

    The encoder and the AR decoder branch have exactly BART's shapes and parameter
    semantics (post-LayerNorm blocks, learned positions offset by 2, optional embedding
    scaling), which is what lets `yue2 convert-bart` import a BART checkpoint unchanged.

    Args:
        vocab_size (`int`): Number of tokens; shared by the encoder, both decoder branches
            and the output projection.
        d_model (`int`): Width of every hidden state.
        encoder_layers (`int`): Number of encoder blocks.
        decoder_layers (`int`): Number of AR decoder blocks (causal self-attention,
            cross-attention, feed-forward).
        nar_layers (`int`): Number of NAR drafter blocks (self-attention among the k draft
            slots, cross-attention to the encoder, feed-forward).
        encoder_attention_heads (`int`): Heads in each encoder self-attention.
        decoder_attention_heads (`int`): Heads in each AR and NAR attention.
        encoder_ffn_dim (`int`): Inner width of the encoder feed-forward layers.
        decoder_ffn_dim (`int`): Inner width of the AR and NAR feed-forward layers.
        nar_block_size (`int`): k, the number of tokens the NAR branch drafts in one pass.
            Slot j drafted at position t predicts the token at t + 2 + j: the AR head at t
            already gives t + 1.
        nar_threshold (`float`): Minimum confidence-head probability for a draft token to
            count as accepted in the confidence-driven modes.
        confidence_hidden_dim (`int`): Hidden width of the confidence head MLP.
        draft_vocab_size (`int`): Size of the draft vocabulary, the shortlist of token ids the NAR
            branch may propose (the model's `draft_vocab` buffer, built by training from the
            ids that cover most of the checkpoint's own outputs). The drafts are projected onto
            these ids only, a fraction of the vocabulary's cost; verification still scores the
            whole vocabulary, so a token outside the shortlist is simply never drafted. 0: the
            whole vocabulary.
        max_position_embeddings (`int`): Longest encoder input and longest decoder
            sequence (start token included) the learned positions cover.
        activation_function (`str`): Feed-forward non-linearity (a key of
            `transformers.activations.ACT2FN`).
        dropout (`float`): Dropout on residual branches during training.
        attention_dropout (`float`): Dropout on attention probabilities during training.
        activation_dropout (`float`): Dropout after the feed-forward non-linearity.
        scale_embedding (`bool`): Multiply token embeddings by sqrt(d_model), as some BART
            checkpoints do.
        init_std (`float`): Standard deviation of the normal initialiser.
        pad_token_id (`int`): Padding token; never attended to and ignored by the loss.
        bos_token_id (`int`): Start-of-text token the tokenizer prepends to inputs.
        eos_token_id (`int`): End-of-text token; generation stops a row when it emits it.
        unk_token_id (`int`): Stand-in for unknown symbols (unused by byte-level BPE but
            kept for tokenizer compatibility).
        decoder_start_token_id (`int`): First decoder input token (BART uses EOS).
        tie_word_embeddings (`bool`): The output projection is the token embedding matrix (as in
            BART); False gives the model an `lm_head` of its own (a widened model needs one).

    Decoding defaults (`forced_bos_token_id`, `forced_eos_token_id`) live in the model's
    `generation_config` (generation_config.json), as transformers 5 requires.
    """

    model_type = "yue2"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["past_key_values"]

    def __init__(
        self,
        vocab_size: int = 4096,
        d_model: int = 192,
        encoder_layers: int = 2,
        decoder_layers: int = 2,
        nar_layers: int = 1,
        encoder_attention_heads: int = 4,
        decoder_attention_heads: int = 4,
        encoder_ffn_dim: int = 640,
        decoder_ffn_dim: int = 640,
        nar_block_size: int = 4,
        nar_threshold: float = 0.6,
        confidence_hidden_dim: int = 64,
        draft_vocab_size: int = 0,
        max_position_embeddings: int = 320,
        activation_function: str = "gelu",
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        scale_embedding: bool = False,
        init_std: float = 0.02,
        pad_token_id: int = 1,
        bos_token_id: int = 0,
        eos_token_id: int = 2,
        unk_token_id: int = 3,
        decoder_start_token_id: int = 2,
        is_encoder_decoder: bool = True,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        if d_model % encoder_attention_heads or d_model % decoder_attention_heads:
            raise ValueError(
                f"d_model ({d_model}) must be divisible by encoder_attention_heads "
                f"({encoder_attention_heads}) and decoder_attention_heads ({decoder_attention_heads})"
            )
        if nar_block_size < 1:
            raise ValueError(f"nar_block_size must be >= 1, got {nar_block_size}")
        if not 0 <= draft_vocab_size <= vocab_size:
            raise ValueError(f"draft_vocab_size must be in [0, vocab_size={vocab_size}], got {draft_vocab_size}")
        if not 0.0 <= nar_threshold <= 1.0:
            raise ValueError(f"nar_threshold must be in [0, 1], got {nar_threshold}")
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.nar_layers = nar_layers
        self.encoder_attention_heads = encoder_attention_heads
        self.decoder_attention_heads = decoder_attention_heads
        self.encoder_ffn_dim = encoder_ffn_dim
        self.decoder_ffn_dim = decoder_ffn_dim
        self.nar_block_size = nar_block_size
        self.nar_threshold = nar_threshold
        self.confidence_hidden_dim = confidence_hidden_dim
        self.draft_vocab_size = draft_vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.activation_function = activation_function
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.scale_embedding = scale_embedding
        self.init_std = init_std
        self.unk_token_id = unk_token_id
        # transformers' config decorator takes the token ids (and any other field) as keywords,
        # though the signature it exposes to type checkers lists only the base fields.
        special: dict[str, Any] = dict(pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                                       eos_token_id=eos_token_id, decoder_start_token_id=decoder_start_token_id,
                                       tie_word_embeddings=tie_word_embeddings)
        super().__init__(is_encoder_decoder=is_encoder_decoder, **special, **kwargs)

    def replaced(self, **overrides: Any) -> Yue2Config:
        """A copy with some fields changed, checked as a new config is (a reshaped drafter, a grown model)."""
        fields = {k: v for k, v in self.to_dict().items()
                  if k not in ("architectures", "transformers_version", "model_type", "dtype", "torch_dtype")}
        return type(self)(**{**fields, **overrides})

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> Yue2Config:
        """Build a config from a named preset (`tiny`, `small`, `base`), fields overridable."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})
