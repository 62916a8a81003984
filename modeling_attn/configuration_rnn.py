"""Configuration of the classic RNN encoder-decoder with attention (Bahdanau et al. 2015; Luong et al. 2015).

The defaults are Bahdanau et al.'s RNNsearch ("Neural Machine Translation by Jointly Learning to Align and
Translate", Sec. 3 and Appendix A.2): 30k-word vocabularies, 620-dimensional embeddings, a bidirectional
GRU encoder and a GRU decoder of 1000 units, an additive alignment model of 1000 units and a maxout
readout of 500 units. Luong et al.'s decoder ("Effective Approaches to Attention-based Neural Machine
Translation", Sec. 3) and their score functions are documented variants.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from .loading import ModelTypeGuard
from .scores import SCORE_NAMES
from .validation import (
    EncoderDecoderConfigMixin,
    check_choice,
    check_layer_counts,
    check_positive,
    check_probability,
)

RNN_TYPES = ("gru", "lstm")
DECODER_STYLES = ("bahdanau", "luong")


@strict
class AttnRNNConfig(EncoderDecoderConfigMixin, ModelTypeGuard, PreTrainedConfig):
    r"""Configuration of [`AttnRNNModel`] and [`AttnRNNForConditionalGeneration`].

    Args:
        vocab_size: source vocabulary size (Bahdanau Sec. 4.1: the 30,000 most frequent words).
        decoder_vocab_size: target vocabulary size; defaults to `vocab_size`. Must equal it when
            `share_encoder_decoder_embeddings` is set.
        embedding_size: word embedding width m (Bahdanau A.2, 620).
        encoder_hidden_size: units per direction of the bidirectional encoder RNN (Bahdanau A.2.1, n = 1000);
            the annotations h_j = [h_j->; h_j<-] have twice this width.
        decoder_hidden_size: units of the decoder RNN (Bahdanau A.2.2, n = 1000).
        encoder_layers, decoder_layers: stacked RNN layers (1 in Bahdanau, 4 in Luong Sec. 4.1).
        rnn_type: "gru" (Bahdanau's gated units, Sec. A.1.1) or "lstm" (Luong Sec. 3).
        decoder_style: "bahdanau": attend with the previous state s_{i-1} and feed the context c_i into the
            RNN (Bahdanau Sec. 3.1); "luong": attend with the current state h_t and predict from the
            attentional hidden state tanh(W_c [c_t; h_t]) (Luong Sec. 3, Eq. 5).
        attention_score: the alignment model a(s, h) (`scores.py`): "additive" (Bahdanau A.1.2; Luong's
            "concat"), "general" (Luong Eq. 8, bilinear), "dot" (Luong Eq. 8) or "scaled_dot" (dot / sqrt(d),
            Vaswani et al. 2017 Eq. 1). "dot" and "scaled_dot" compare the decoder state with the annotations
            directly, so they need decoder_hidden_size == 2 * encoder_hidden_size.
        attention_size: hidden width n' of the additive score (Bahdanau A.2.2, 1000); unused by the others.
        readout_size: maxout units l of the Bahdanau readout (A.2.2, 500); unused by the Luong decoder, whose
            output layer reads the attentional hidden state (decoder_hidden_size units).
        input_feeding: feed the previous attentional hidden state into the next RNN input (Luong Sec. 3.3);
            Luong decoder only (Bahdanau's decoder always feeds its context).
        dropout: dropout on the embeddings, between stacked RNN layers and on the decoder output before the
            output projection (Luong Sec. 4.1 uses 0.2; Bahdanau none).
        (no label_smoothing: it is a training setting, given to `forward(..., smoothing=...)` or as Trainer's
            `label_smoothing_factor`; a `label_smoothing` in an older config.json is ignored with a warning and no
            longer changes the loss.)
        joint_vocabulary: source and target ids are one tokenizer's (a joint BPE vocabulary, Sennrich et al. 2016,
            as `attn train` builds), even with separate embedding matrices: `resize_token_embeddings` then resizes
            both sides and the output layer. Defaults to whether decoder_vocab_size equals vocab_size; False for
            two vocabularies (Marian's `resize_decoder_token_embeddings` then resizes the target side).
        share_encoder_decoder_embeddings: one embedding matrix for source and target (not in the papers).
        tie_word_embeddings: the output projection shares the target embedding matrix (not in the papers);
            needs the decoder output width (readout_size, or decoder_hidden_size for Luong) to equal
            embedding_size.
        use_cache: return and use the decoder state (`AttnRNNCache`) when decoding step by step.
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id: special token ids.
    """

    model_type = "attn_rnn"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {"hidden_size": "decoder_hidden_size", "num_hidden_layers": "decoder_layers"}

    vocab_size: int = 30000
    decoder_vocab_size: int | None = None
    embedding_size: int = 620
    encoder_hidden_size: int = 1000
    decoder_hidden_size: int = 1000
    encoder_layers: int = 1
    decoder_layers: int = 1
    rnn_type: str = "gru"
    decoder_style: str = "bahdanau"
    attention_score: str = "additive"
    attention_size: int = 1000
    readout_size: int = 500
    input_feeding: bool = False
    dropout: float | int = 0.0
    joint_vocabulary: bool | None = None
    share_encoder_decoder_embeddings: bool = False
    tie_word_embeddings: bool = False
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1

    @property
    def annotation_size(self) -> int:
        """Width of the encoder annotations h_j = [h_j->; h_j<-] (Bahdanau Sec. 3.2)."""
        return 2 * self.encoder_hidden_size

    @property
    def output_size(self) -> int:
        """Width of the decoder output that the output projection reads: the maxout readout t_i (Bahdanau
        A.2.2) or the attentional hidden state h~_t (Luong Eq. 5)."""
        return self.readout_size if self.decoder_style == "bahdanau" else self.decoder_hidden_size

    def validate_sizes(self):
        check_layer_counts(self, ("encoder_layers", "decoder_layers"))
        check_positive(
            self,
            (
                "vocab_size",
                "decoder_vocab_size",
                "embedding_size",
                "encoder_hidden_size",
                "decoder_hidden_size",
                "attention_size",
                "readout_size",
            ),
        )

    def validate_dropout(self):
        check_probability(self, ("dropout",))

    def validate_choices(self):
        check_choice(self, "rnn_type", RNN_TYPES)
        check_choice(self, "decoder_style", DECODER_STYLES)
        check_choice(self, "attention_score", SCORE_NAMES)

    def validate_variants(self):
        name = type(self).__name__
        if self.attention_score in ("dot", "scaled_dot") and self.decoder_hidden_size != self.annotation_size:
            raise ValueError(
                f"{name}.attention_score={self.attention_score!r} compares the decoder state with the encoder "
                f"annotations directly, so decoder_hidden_size ({self.decoder_hidden_size}) must equal "
                f"2 * encoder_hidden_size ({self.annotation_size}); use 'general' or 'additive' otherwise"
            )
        if self.input_feeding and self.decoder_style != "luong":
            raise ValueError(
                f"{name}.input_feeding is a variant of decoder_style='luong' (Luong Sec. 3.3), got decoder_style="
                f"{self.decoder_style!r}: the Bahdanau decoder already feeds its context into the RNN"
            )
        if self.tie_word_embeddings and self.output_size != self.embedding_size:
            field = "readout_size" if self.decoder_style == "bahdanau" else "decoder_hidden_size"
            raise ValueError(
                f"{name}.tie_word_embeddings needs the decoder output width {field} ({self.output_size}) to equal "
                f"embedding_size ({self.embedding_size})"
            )


__all__ = ["AttnRNNConfig"]
