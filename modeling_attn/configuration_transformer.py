"""Configuration of the encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The defaults are the paper's base model (Table 3, row "base"). Every flag that departs from the paper
names a documented variant that the tests cover.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from .loading import ModelTypeGuard
from .validation import (
    EncoderDecoderConfigMixin,
    check_choice,
    check_layer_counts,
    check_positive,
    check_probability,
)

POSITIONAL_LAYOUTS = ("interleaved", "halves")


@strict
class AttnTransformerConfig(EncoderDecoderConfigMixin, ModelTypeGuard, PreTrainedConfig):
    r"""Configuration of [`AttnTransformerModel`] and [`AttnTransformerForConditionalGeneration`].

    Args:
        vocab_size: source vocabulary size (the joint vocabulary when embeddings are shared; the paper
            uses a shared BPE vocabulary of about 37k tokens for EN-DE, Sec. 5.1).
        decoder_vocab_size: target vocabulary size; defaults to `vocab_size`. Must equal it when
            `share_encoder_decoder_embeddings` is set.
        d_model: model width (Sec. 3, 512 in the base model).
        encoder_layers, decoder_layers: number of layers N in each stack (Sec. 3.1, 6).
        num_heads: attention heads h (Sec. 3.2.2, 8); `d_model` must be divisible by it.
        d_ff: inner width of the position-wise feed-forward network (Sec. 3.3, 2048).
        dropout: residual dropout P_drop on each sub-layer output and on the embedding sums (Sec. 5.4, 0.1).
        attention_dropout: dropout on the attention weights (not in the paper; 0).
        activation_dropout: dropout after the feed-forward activation (not in the paper; 0).
        word_dropout: in training, each source and target input token is dropped with this probability: its
            embedding zeroed before the positions are added, the others scaled by 1 / (1 - p) (not in the paper;
            0; the word dropout of Sennrich et al. 2016's RNN systems, a regularizer for small data). Any position
            may be dropped, the decoder's start token included.
        activation_function: feed-forward activation; the paper uses ReLU (Eq. 2). Any name in
            `transformers.activations.ACT2FN` (e.g. "gelu", "swish" as in OPUS-MT Marian models).
        norm_first: pre-LayerNorm (LN before each sub-layer plus a final LN per stack; Xiong et al.
            2020, as `torch.nn.Transformer(norm_first=True)`) instead of the paper's post-LN
            `LayerNorm(x + Sublayer(x))` (Sec. 3.1).
        layer_norm_eps: LayerNorm epsilon.
        scale_embedding: multiply token embeddings by sqrt(d_model) (Sec. 3.4).
        positional_layout: sinusoidal positions (Sec. 3.5) with sin and cos "interleaved" on even and
            odd dimensions as in the paper, or as two "halves" [sin | cos] as fairseq and Marian do.
        max_position_embeddings: longest sequence the position table covers.
        joint_vocabulary: source and target ids are one tokenizer's (a joint BPE vocabulary, Sennrich et al. 2016,
            as `attn train` builds), even with separate embedding matrices: `resize_token_embeddings` then resizes
            both sides and the output layer. Defaults to whether decoder_vocab_size equals vocab_size; False for
            two vocabularies (Marian's `resize_decoder_token_embeddings` then resizes the target side).
        share_encoder_decoder_embeddings: one embedding matrix for source and target (Sec. 3.4).
        tie_word_embeddings: the pre-softmax projection shares the target embedding matrix (Sec. 3.4).
        final_logits_bias: add a fixed (1, decoder_vocab_size) bias to the logits, a saved buffer that is not
            trained (not in the paper; Marian / OPUS-MT models have one, see `app/convert_marian.py`).
        (no label_smoothing: epsilon_ls (Sec. 5.4 uses 0.1) is a training setting, given to
            `forward(..., smoothing=...)` or as Trainer's `label_smoothing_factor`; a `label_smoothing` in
            an older config.json is ignored with a warning and no longer changes the loss.)
        alignment_layer, alignment_heads: where word alignments are read from (`api/alignment.py`, the CTranslate2
            export) and what guided alignment training supervises: the cross-attention of decoder layer
            `alignment_layer` (0-based; negative counts from the last; None: the penultimate layer, or the only one,
            as Garg et al. 2019 "Jointly Learning to Align and Translate with Transformer Models" do), averaged over
            its first `alignment_heads` heads (0: all of them, Garg et al.'s unsupervised extraction; guided training
            supervises one head, as they do; fairseq's and CTranslate2's meaning of the two fields).
        use_cache: return and use the key/value cache when decoding.
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id: special token ids.
    """

    model_type = "attn_transformer"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "num_heads",
        "num_hidden_layers": "encoder_layers",
        "intermediate_size": "d_ff",
    }

    vocab_size: int = 37000
    decoder_vocab_size: int | None = None
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    num_heads: int = 8
    d_ff: int = 2048
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    word_dropout: float | int = 0.0
    activation_function: str = "relu"
    norm_first: bool = False
    layer_norm_eps: float = 1e-5
    scale_embedding: bool = True
    positional_layout: str = "interleaved"
    max_position_embeddings: int = 1024
    joint_vocabulary: bool | None = None
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    final_logits_bias: bool = False
    alignment_layer: int | None = None
    alignment_heads: int = 0
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1

    def __post_init__(self, **kwargs):
        if self.alignment_layer is None:  # Garg et al. 2019: the penultimate decoder layer
            self.alignment_layer = max(self.decoder_layers - 2, 0) if isinstance(self.decoder_layers, int) else 0
        super().__post_init__(**kwargs)

    def validate_sizes(self):
        check_layer_counts(self, ("encoder_layers", "decoder_layers"))
        check_positive(
            self,
            (
                "vocab_size",
                "decoder_vocab_size",
                "d_model",
                "num_heads",
                "d_ff",
                "max_position_embeddings",
            ),
        )
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"{type(self).__name__}.d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.d_model % 2 != 0:
            raise ValueError(
                f"{type(self).__name__}.d_model must be even for sinusoidal positions (Sec. 3.5), got {self.d_model}"
            )
        if self.layer_norm_eps <= 0:
            raise ValueError(f"{type(self).__name__}.layer_norm_eps must be positive, got {self.layer_norm_eps}")

    def validate_dropout(self):
        check_probability(self, ("dropout", "attention_dropout", "activation_dropout", "word_dropout"))

    def validate_choices(self):
        check_choice(self, "activation_function", ACT2FN.keys())
        check_choice(self, "positional_layout", POSITIONAL_LAYOUTS)

    def validate_alignment(self):
        name = type(self).__name__
        layer, heads = self.alignment_layer, self.alignment_heads
        if not all(isinstance(size, int) and size > 0 for size in (self.decoder_layers, self.num_heads)):
            return  # no layer or head to point at: `validate_sizes` names the size itself
        if (
            isinstance(layer, bool)
            or not isinstance(layer, int)
            or not -self.decoder_layers <= layer < self.decoder_layers
        ):
            raise ValueError(
                f"{name}.alignment_layer must be a decoder layer index in [{-self.decoder_layers}, "
                f"{self.decoder_layers}) (decoder_layers={self.decoder_layers}), got {layer!r}"
            )
        if isinstance(heads, bool) or not isinstance(heads, int) or not 0 <= heads <= self.num_heads:
            raise ValueError(
                f"{name}.alignment_heads must be 0 (all heads) or a number of heads up to num_heads="
                f"{self.num_heads}, got {heads!r}"
            )


__all__ = ["AttnTransformerConfig"]
