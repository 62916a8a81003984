"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017), as transformers models.

Paper sections in this file:
- Sec. 3.1 encoder and decoder stacks: `AttnTransformerEncoderLayer` (self-attention + feed-forward) and
  `AttnTransformerDecoderLayer` (masked self-attention + encoder-decoder attention + feed-forward), each
  sub-layer wrapped as LayerNorm(x + Dropout(Sublayer(x))) (post-LN, the paper) or x + Sublayer(LN(x))
  (pre-LN, `config.norm_first`).
- Sec. 3.2 attention: `attention.MultiHeadAttention`; Sec. 3.3 feed-forward FFN(x) = max(0, x W_1 + b_1) W_2 + b_2.
- Sec. 3.4 embeddings scaled by sqrt(d_model), shared between source, target and the pre-softmax projection.
- Sec. 3.5 sinusoidal positional encoding: `sinusoid_table`.
Deviations: the padding embedding row starts at zero (as fairseq); `norm_first`, the activation and
the positional layout are documented variants of `AttnTransformerConfig`. Decoding with a cache (dynamic or static,
encoder keys/values computed once) is explained in docs/model.md.

Shapes: B batch, S source length, T target length, E d_model, V vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticLayer
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPastAndCrossAttentions
from transformers.utils import is_torchdynamo_compiling
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .attention import MultiHeadAttention
from .beam_search import CompactBeamSearchMixin
from .compat import MASK_CACHE_ARGUMENT, with_cache
from .configuration_transformer import AttnTransformerConfig
from .constraints import LexicalConstraints  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .dropout import dropout
from .encoder_decoder import (
    EncoderDecoderForConditionalGeneration,
    EncoderDecoderModel,
    EncoderDecoderPreTrainedModel,
    embed_inputs,
)
from .flops import training_flops  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .generation import SourceRelativeLengthMixin
from .inputs import check_attention_mask, check_encoder_states
from .loading import SafetensorsOnly  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .loss import token_loss  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .masks import masked_softmax  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .padding_free import kept_rows, on_rows
from .pipeline_translation import TranslationPipeline  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .remote_code import save_with_remote_code  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .validation import check_positive  # noqa: F401  (compat.py: transformers 5.4-5.10)


def sinusoid_table(num_positions: int, d_model: int, layout: str = "interleaved") -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (Sec. 3.5), as (P, E).

    layout "interleaved" puts sin on even and cos on odd dimensions (the paper); "halves" puts all sines
    first and all cosines second (fairseq, Marian), which is the same encoding with permuted dimensions.
    """
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    angles = positions * inv_freq  # (P, E/2)
    if layout == "interleaved":
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)
    else:
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return table.float()


class AttnTransformerPositionalEncoding(nn.Module):
    """Fixed sinusoidal positions (Sec. 3.5), kept as a non-persistent buffer: nothing to learn or save."""

    def __init__(self, config: AttnTransformerConfig):
        super().__init__()
        self.config = config
        self.register_buffer("table", self.build_table(), persistent=False)

    def build_table(self) -> torch.Tensor:
        return sinusoid_table(self.config.max_position_embeddings, self.config.d_model, self.config.positional_layout)

    def forward(self, length: int, offset: int | torch.Tensor = 0) -> torch.Tensor:
        """Encodings of positions offset .. offset+length-1, as (L, E).

        A tensor `offset` (the length of a static cache, which `torch.compile` must not read as a number) is looked
        up as a tensor of positions; its range is checked once for the whole cache (`check_static_cache`).
        """
        if isinstance(offset, torch.Tensor):
            return self.table.index_select(0, torch.arange(length, device=self.table.device) + offset)
        if offset + length > self.table.shape[0]:
            raise ValueError(
                f"sequence of {offset + length} positions exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}; raise it in the config or truncate the input"
            )
        return self.table[offset : offset + length]


def check_static_cache(cache: EncoderDecoderCache, num_positions: int, source_length: int) -> None:
    """Raise if a static self-attention cache holds more positions than the decoder has encodings for, or a static
    cross-attention cache is not exactly as long as the source (its unused slots would be attended to as keys).

    A dynamic cache is checked step by step as it grows; a static one is allocated once for its maximal length,
    so that compiled steps need no data-dependent check.
    """
    for layer in cache.self_attention_cache.layers:
        if isinstance(layer, StaticLayer) and layer.max_cache_len > num_positions:
            raise ValueError(
                f"a static cache of {layer.max_cache_len} positions exceeds max_position_embeddings={num_positions}: "
                f"generate with max_length <= {num_positions + 1} (the decoder start token included)"
            )
    for layer in cache.cross_attention_cache.layers:
        if isinstance(layer, StaticLayer) and layer.max_cache_len != source_length:
            raise ValueError(
                f"the static cross-attention cache holds {layer.max_cache_len} positions, the source has "
                f"{source_length}: size it to the encoder output (as generate(cache_implementation='static') does)"
            )


class AttnTransformerEncoderLayer(GradientCheckpointingLayer):
    """Self-attention then feed-forward, each in a residual connection with LayerNorm (Sec. 3.1)."""

    def __init__(self, config: AttnTransformerConfig, layer_idx: int):
        super().__init__()
        self.norm_first = config.norm_first
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.self_attn = MultiHeadAttention(config, layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_rows: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """`token_rows` (flat indices of the real tokens, `padding_free.kept_rows`) restricts the FFN to them, and in
        training the attention's projections too (`attention_rows`)."""
        kwargs["rows"] = self.attention_rows(token_rows)
        if self.norm_first:
            hidden_states = hidden_states + self._sa_block(
                self.self_attn_layer_norm(hidden_states), attention_mask, **kwargs
            )
            return hidden_states + self._ff_block(self.final_layer_norm(hidden_states), token_rows)
        hidden_states = self.self_attn_layer_norm(
            hidden_states + self._sa_block(hidden_states, attention_mask, **kwargs)
        )
        return self.final_layer_norm(hidden_states + self._ff_block(hidden_states, token_rows))

    def attention_rows(self, rows: torch.Tensor | None) -> torch.Tensor | None:
        """The rows the attention's projections run on: the real tokens in training, every position otherwise, so
        that evaluation and decoding outputs (padded positions included) are those of the full projections."""
        return rows if self.training else None

    def _sa_block(self, hidden_states, attention_mask, **kwargs):
        hidden_states, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        return dropout(hidden_states, self.dropout, self.training)

    def _ff_block(self, hidden_states, token_rows=None):
        return on_rows(self._feed_forward, hidden_states, token_rows)

    def _feed_forward(self, hidden_states):  # Eq. 2
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = dropout(hidden_states, self.activation_dropout, self.training)
        return dropout(self.fc2(hidden_states), self.dropout, self.training)


class AttnTransformerDecoderLayer(AttnTransformerEncoderLayer):
    """Masked self-attention, encoder-decoder attention, then feed-forward (Sec. 3.1)."""

    def __init__(self, config: AttnTransformerConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = MultiHeadAttention(config, layer_idx, is_causal=True)
        self.encoder_attn = MultiHeadAttention(config, layer_idx, is_cross_attention=True)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        token_rows: torch.Tensor | None = None,
        source_rows: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """`token_rows` and `source_rows`: the real target and source tokens (the encoder layer's `forward`)."""
        cross = dict(
            encoder_hidden_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            source_rows=self.attention_rows(source_rows),
        )
        kwargs["rows"] = self.attention_rows(token_rows)
        if self.norm_first:
            hidden_states = hidden_states + self._sa_block(
                self.self_attn_layer_norm(hidden_states), attention_mask, past_key_values=past_key_values, **kwargs
            )
            hidden_states = hidden_states + self._mha_block(
                self.encoder_attn_layer_norm(hidden_states), past_key_values=past_key_values, **cross, **kwargs
            )
            return hidden_states + self._ff_block(self.final_layer_norm(hidden_states), token_rows)
        hidden_states = self.self_attn_layer_norm(
            hidden_states + self._sa_block(hidden_states, attention_mask, past_key_values=past_key_values, **kwargs)
        )
        hidden_states = self.encoder_attn_layer_norm(
            hidden_states + self._mha_block(hidden_states, past_key_values=past_key_values, **cross, **kwargs)
        )
        return self.final_layer_norm(hidden_states + self._ff_block(hidden_states, token_rows))

    def _mha_block(self, hidden_states, **kwargs):
        hidden_states, _ = self.encoder_attn(hidden_states, **kwargs)
        return dropout(hidden_states, self.dropout, self.training)


class AttnTransformerPreTrainedModel(EncoderDecoderPreTrainedModel):
    config: AttnTransformerConfig
    config_class = AttnTransformerConfig
    supports_gradient_checkpointing = True
    _no_split_modules = ["AttnTransformerEncoderLayer", "AttnTransformerDecoderLayer"]
    _supports_sdpa = True
    # torch.compile(fullgraph=True) holds for forward and for decoding steps with a static cache
    # (tests/test_static_cache.py)
    _can_compile_fullgraph = True

    @staticmethod
    def heads() -> tuple[type, type]:
        return AttnTransformerModel, AttnTransformerForConditionalGeneration

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-uniform linear layers (as tensor2tensor and torch.nn.Transformer), N(0, d_model^-0.5)
        embeddings (so that, scaled by sqrt(d_model), they have unit variance), unit LayerNorms."""
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, AttnTransformerPositionalEncoding):
            init.copy_(module.table, module.build_table())
        elif getattr(module, "final_logits_bias", None) is not None:
            init.zeros_(module.final_logits_bias)


class AttnTransformerStack(AttnTransformerPreTrainedModel):
    """What the encoder and decoder stacks share.

    Embeddings + positions, N layers (+ a final LayerNorm when pre-LN).
    """

    def __init__(self, config: AttnTransformerConfig, vocab_field: str, layer_class: type, num_layers: int):
        super().__init__(config)
        self.vocab_field = vocab_field  # the config field that holds this stack's vocabulary size
        self.embed_tokens = nn.Embedding(getattr(config, vocab_field), config.d_model, config.pad_token_id)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = AttnTransformerPositionalEncoding(config)
        self.layers = nn.ModuleList([layer_class(config, i) for i in range(num_layers)])
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def resize_token_embeddings(self, *args, **kwargs) -> nn.Embedding:
        raise NotImplementedError(
            f"{type(self).__name__}.resize_token_embeddings: resize the whole model's vocabulary instead "
            "(model.resize_token_embeddings, or resize_decoder_token_embeddings for a separate target vocabulary): "
            "this stack's embeddings may be tied to the other stack's and to the output layer"
        )

    def _embed(self, input_ids, inputs_embeds, offset: int, name: str) -> torch.Tensor:
        """Token embeddings * sqrt(d_model) (Sec. 3.4) + positions (Sec. 3.5), then dropout (Sec. 5.4); in training
        whole tokens are dropped first with probability `config.word_dropout` (0 in the paper)."""
        config = self.config
        vocab_size = getattr(config, self.vocab_field)
        inputs_embeds = embed_inputs(
            self, input_ids, inputs_embeds, vocab_size, name, self.embed_scale, config.word_dropout
        )
        hidden_states = inputs_embeds + self.embed_positions(inputs_embeds.shape[1], offset).to(inputs_embeds.dtype)
        return dropout(hidden_states, config.dropout, self.training)


class AttnTransformerEncoder(AttnTransformerStack):
    """The encoder stack: embeddings + positions, N encoder layers (+ a final LayerNorm when pre-LN)."""

    _can_record_outputs = {"hidden_states": AttnTransformerEncoderLayer, "attentions": MultiHeadAttention}

    def __init__(self, config: AttnTransformerConfig):
        super().__init__(config, "vocab_size", AttnTransformerEncoderLayer, config.encoder_layers)

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        hidden_states = self._embed(input_ids, inputs_embeds, 0, "")
        check_attention_mask(attention_mask, hidden_states.shape[:2], "attention_mask", require_token=True)
        token_rows = kept_rows(attention_mask)
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, token_rows=token_rows, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class AttnTransformerDecoder(AttnTransformerStack):
    """The decoder stack: embeddings + positions, N decoder layers (+ a final LayerNorm when pre-LN)."""

    _can_record_outputs = {
        "hidden_states": AttnTransformerDecoderLayer,
        "attentions": OutputRecorder(MultiHeadAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(MultiHeadAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: AttnTransformerConfig):
        super().__init__(config, "decoder_vocab_size", AttnTransformerDecoderLayer, config.decoder_layers)

    def _past_length(self, past_key_values: EncoderDecoderCache | None, source_length: int) -> int | torch.Tensor:
        """Positions already in the self-attention cache: a number, or a 0-d tensor for a static cache (whose
        sizes are checked here, once: it must fit the position table, and its cross-attention part the source)."""
        if past_key_values is None:
            return 0
        if not isinstance(past_key_values, EncoderDecoderCache):
            raise TypeError(
                f"past_key_values must be an EncoderDecoderCache (self- and cross-attention caches), got "
                f"{type(past_key_values).__name__}"
            )
        check_static_cache(past_key_values, self.config.max_position_embeddings, source_length)
        return past_key_values.get_seq_length()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if encoder_hidden_states is None:
            raise ValueError("AttnTransformerDecoder needs encoder_hidden_states: it attends to the encoder output")
        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = self._past_length(past_key_values, encoder_hidden_states.shape[1])
        hidden_states = self._embed(input_ids, inputs_embeds, past_length, "decoder_")
        check_encoder_states(encoder_hidden_states, hidden_states.shape[0], self.config.d_model)
        padding_mask = attention_mask is not None and attention_mask.dim() == 2  # else a prepared 4D mask
        if padding_mask and not is_torchdynamo_compiling():
            check_attention_mask(
                attention_mask,
                (hidden_states.shape[0], int(past_length) + hidden_states.shape[1]),
                "decoder_attention_mask",
            )
        check_attention_mask(encoder_attention_mask, encoder_hidden_states.shape[:2], "attention_mask (source)")

        # the current positions' part of a (B, past + T) decoder mask
        token_rows = kept_rows(attention_mask[:, past_length:] if padding_mask else None)
        source_padding = self.training and encoder_attention_mask is not None and encoder_attention_mask.dim() == 2
        source_rows = kept_rows(encoder_attention_mask if source_padding else None)  # for `attention_rows`
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            **{MASK_CACHE_ARGUMENT: past_key_values.self_attention_cache if past_key_values is not None else None},
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, for gradient checkpointing
                encoder_attention_mask=encoder_attention_mask,
                past_key_values=past_key_values,
                token_rows=token_rows,
                source_rows=source_rows,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return with_cache(
            BaseModelOutputWithPastAndCrossAttentions,
            past_key_values if use_cache else None,
            last_hidden_state=hidden_states,
        )


class AttnTransformerModel(EncoderDecoderModel, AttnTransformerPreTrainedModel):
    """Encoder and decoder without the output projection: returns the decoder's last hidden states."""

    def __init__(self, config: AttnTransformerConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:  # Sec. 3.4: one matrix for source and target
            self.share_embeddings(nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id))
        else:
            self.share_embeddings(None)
        self.encoder = AttnTransformerEncoder(config)
        self.decoder = AttnTransformerDecoder(config)
        self.post_init()


class AttnTransformerForConditionalGeneration(
    SourceRelativeLengthMixin,
    CompactBeamSearchMixin,
    EncoderDecoderForConditionalGeneration,
    AttnTransformerPreTrainedModel,
    GenerationMixin,
):
    """The Transformer with its pre-softmax projection (tied to the target embeddings, Sec. 3.4): a translation model.

    `forward` and its loss (`labels`, `smoothing`, `skip_logits`) are `encoder_decoder.py`'s.
    """

    def __init__(self, config: AttnTransformerConfig):
        super().__init__(config)
        self.add_output_layer(AttnTransformerModel(config), config.d_model)
        self.post_init()

    def _reorder_cache(self, past_key_values: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        """Beam search: follow the surviving beams in the self-attention cache only.

        `beam_idx` picks beams of the same sentence, and every beam of a sentence attends to the same encoder
        output, so the cross-attention keys/values are unchanged by the reordering; transformers' default
        reorders them too, copying them at every step for nothing (bench/README.md).

        Static layers are reordered in place: their tensors keep the addresses a compiled step was built with.
        """
        cache = past_key_values.self_attention_cache
        for layer in cache.layers:
            if isinstance(layer, StaticLayer) and layer.is_initialized:
                beam_idx = beam_idx.to(layer.keys.device)
                layer.keys.copy_(layer.keys.index_select(0, beam_idx))
                layer.values.copy_(layer.values.index_select(0, beam_idx))
            else:
                layer.reorder_cache(beam_idx)
        return past_key_values


__all__ = [
    "AttnTransformerPreTrainedModel",
    "AttnTransformerModel",
    "AttnTransformerForConditionalGeneration",
    "sinusoid_table",
]
