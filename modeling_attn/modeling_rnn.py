"""The classic attention-based RNN encoder-decoder (Bahdanau et al. 2015; Luong et al. 2015), as transformers models.

Bahdanau et al. 2015, "Neural Machine Translation by Jointly Learning to Align and Translate":
- Sec. 3.2 / A.2.1 encoder: a bidirectional RNN, annotations h_j = [h_j->; h_j<-] (`AttnRNNEncoder`).
- Sec. 3.1 decoder, Eqs. 4-6: e_ij = a(s_{i-1}, h_j), alpha_ij = softmax_j(e_ij), c_i = sum_j alpha_ij h_j,
  s_i = f(s_{i-1}, y_{i-1}, c_i) (`AttnRNNDecoder._bahdanau_step`); A.2.2 initial state s_0 = tanh(W_s h_1<-),
  maxout readout t_i = max-out(U_o s_i + V_o E y_{i-1} + C_o c_i), p(y_i) = softmax(W_o t_i).
Luong et al. 2015, "Effective Approaches to Attention-based Neural Machine Translation":
- Sec. 3.1 global attention: a_t = softmax(score(h_t, h_s)) (Eqs. 7-8, `scores.py`), h~_t = tanh(W_c [c_t; h_t])
  (Eq. 5), p(y_t) = softmax(W_s h~_t) (Eq. 6) (`AttnRNNDecoder._luong_step`); Sec. 3.3 input feeding.

Deviations, each explained in docs/model.md: PyTorch's GRU reset gate; the readout reads s_i (Eq. 4; A.2.2 writes
s_{i-1}); stacked decoders attend with the top layer; Luong's decoder gets the bidirectional encoder and s_0, no local
attention (Sec. 3.2) or "location" score; uniform [-0.1, 0.1] init; the "scaled_dot" score. Decoding: `AttnRNNCache`.

Shapes: B batch, S source length, T target length, L decoder layers, H decoder units, V target vocabulary.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch import nn
from transformers import GenerationConfig
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPastAndCrossAttentions
from transformers.utils import can_return_tuple, is_torchdynamo_compiling

from .attention import attend
from .beam_search import CompactBeamSearchMixin
from .compat import with_cache
from .configuration_rnn import AttnRNNConfig
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
from .inputs import check_attention_mask
from .loading import SafetensorsOnly  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .loss import token_loss  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .masks import padding_mask
from .padding_free import on_rows  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .pipeline_translation import TranslationPipeline  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .recurrent import Recurrent, RNNState, step_loop
from .remote_code import save_with_remote_code  # noqa: F401  (compat.py: transformers 5.4-5.10)
from .scores import build_score
from .validation import check_positive  # noqa: F401  (compat.py: transformers 5.4-5.10)


class AttnRNNCache(Cache):
    """The decoder state carried from one generate() step to the next; nothing in it grows with the target.

    - `keys`: the encoder annotations projected by the score function, (B, S, *), computed once per sentence;
    - `hidden`, `cell`: the recurrent state of every decoder layer, (L, B, H) (`cell` only for an LSTM);
    - `feed`: Luong's attentional hidden state h~_{t-1}, (B, 1, H), with input feeding;
    - `steps`: target positions consumed so far (`get_seq_length`).

    The model's forward creates one when `use_cache` is true and updates it in place; generate() passes it
    back through `past_key_values` and, in beam search, calls `reorder_cache` with the surviving beams (fewer
    rows than it has when sentences leave the batch: `rows_can_leave`, see beam_search.py).
    """

    batch_dims = {"keys": 0, "hidden": 1, "cell": 1, "feed": 0}
    rows_can_leave = True

    def __init__(self):
        super().__init__(layers=[])
        self.reset()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(steps={self.steps}, batch_size={self.batch_size})"

    def reset(self) -> None:
        self.keys = self.hidden = self.cell = self.feed = None
        self.steps = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.steps

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def batch_size(self) -> int:
        return -1 if self.keys is None else self.keys.shape[0]

    @property
    def rnn_state(self) -> RNNState:
        return self.hidden if self.cell is None else (self.hidden, self.cell)

    def store(self, keys: torch.Tensor, state: RNNState, feed: torch.Tensor | None, new_steps: int) -> None:
        """Keep the state after `new_steps` more target positions."""
        self.keys = keys
        self.hidden, self.cell = state if isinstance(state, tuple) else (state, None)
        self.feed = feed
        self.steps += new_steps

    def _map(self, function) -> None:
        for name, dim in self.batch_dims.items():
            if (tensor := getattr(self, name)) is not None:
                setattr(self, name, function(tensor, dim))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row b of the new state is row beam_idx[b] of the old one (beam search keeps the best continuations)."""
        self._map(lambda tensor, dim: tensor.index_select(dim, beam_idx.to(tensor.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda tensor, dim: tensor.index_select(dim, indices.to(tensor.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda tensor, dim: tensor.repeat_interleave(repeats, dim=dim))

    @property
    def is_croppable(self) -> bool:
        return False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise NotImplementedError(
                "an RNN state cannot be rolled back to an earlier position; decode again instead"
            )


def _register_for_export(cache_class: type[AttnRNNCache]) -> None:
    """Make `cache_class` a pytree node (its tensors the children, `steps` the context), so that torch.export can
    take it as an input and return it as an output (as transformers registers its DynamicCache,
    `integrations.executorch.register_dynamic_cache_export_support`). Idempotent."""
    if cache_class in pytree.SUPPORTED_NODES:
        return
    names = tuple(cache_class.batch_dims)

    def unflatten(tensors, steps: int) -> AttnRNNCache:
        cache = cache_class()
        for name, tensor in zip(names, tensors, strict=True):
            setattr(cache, name, tensor)
        cache.steps = steps
        return cache

    def flatten_with_keys(cache: AttnRNNCache) -> tuple[list, int]:
        return [(pytree.GetAttrKey(name), getattr(cache, name)) for name in names], cache.steps

    pytree.register_pytree_node(
        cache_class,
        lambda cache: ([getattr(cache, name) for name in names], cache.steps),
        unflatten,
        serialized_type_name=f"{cache_class.__module__}.{cache_class.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
    )


_register_for_export(AttnRNNCache)


def _embed(module: nn.Module, input_ids, inputs_embeds, vocab_size: int, name: str) -> torch.Tensor:
    """Word embeddings E y (Bahdanau A.2), then dropout."""
    return dropout(
        embed_inputs(module, input_ids, inputs_embeds, vocab_size, name), module.config.dropout, module.training
    )


def _source_mask(attention_mask: torch.Tensor | None, shape: torch.Size) -> torch.Tensor | None:
    """The (B, S) boolean mask of the real source tokens (None: no padding). It must be right-padded with no row
    empty: the encoder packs each sentence. Checked in eager mode only (a traced forward cannot raise on values)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must be a (batch, length) padding mask for the RNN encoder, got shape "
            f"{tuple(attention_mask.shape)}"
        )
    check_attention_mask(attention_mask, shape, "attention_mask")
    mask = attention_mask.bool()
    if is_torchdynamo_compiling():
        return mask
    lengths = mask.sum(dim=1)
    if (lengths == 0).any():
        raise ValueError(
            f"attention_mask row {(lengths == 0).nonzero()[0].item()} masks every token; each source "
            "sentence needs at least one"
        )
    if not torch.equal(mask, torch.arange(shape[1], device=mask.device) < lengths[:, None]):
        raise ValueError("attention_mask must be right-padded (1s, then 0s): the RNN encoder packs each sentence")
    return mask


def _check_decoder_mask(attention_mask: torch.Tensor | None, expected: tuple[int, int]) -> None:
    """The decoder reads no padding mask: it is causal, so padding after the last token cannot change earlier
    outputs. A mask with padding before a token would be ignored, so it is refused."""
    if attention_mask is None:
        return
    if attention_mask.dim() != 2:
        raise ValueError(f"decoder_attention_mask must be (batch, length), got shape {tuple(attention_mask.shape)}")
    check_attention_mask(attention_mask, expected, "decoder_attention_mask")
    if is_torchdynamo_compiling():
        return
    mask = attention_mask.long()
    if (mask.cummin(dim=1).values != mask).any():
        raise ValueError(
            "decoder_attention_mask may only mark padding at the end: the RNN decoder cannot skip "
            "padding before a token"
        )


class AttnRNNEncoder(nn.Module):
    """Bidirectional RNN over the source (Bahdanau Sec. 3.2): annotations h_j = [h_j->; h_j<-], (B, S, 2 * He)."""

    def __init__(self, config: AttnRNNConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__()
        self.config = config
        self.embed_tokens = (
            embed_tokens if embed_tokens is not None else nn.Embedding(config.vocab_size, config.embedding_size)
        )
        self.rnn = Recurrent(
            config.rnn_type,
            config.embedding_size,
            config.encoder_hidden_size,
            num_layers=config.encoder_layers,
            dropout=config.dropout if config.encoder_layers > 1 else 0.0,
            bidirectional=True,
        )

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        embeds = _embed(self, input_ids, inputs_embeds, self.config.vocab_size, "")
        mask = _source_mask(attention_mask, embeds.shape[:2])
        # Each direction reads the real tokens only: the backward RNN starts at the last token, not at padding.
        annotations, _ = self.rnn(embeds, mask=mask)
        return BaseModelOutput(last_hidden_state=annotations)  # (B, S, 2 He), zero at padding


class AttnRNNDecoder(nn.Module):
    """Unidirectional RNN decoder with attention over the annotations, in Bahdanau's or Luong's style.

    Returns the vectors the output projection reads, (B, T, config.output_size): Bahdanau's maxout readout t_i
    or Luong's attentional hidden state h~_t; and, with `output_attentions`, the alignments (B, T, S).
    """

    def __init__(self, config: AttnRNNConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__()
        self.config = config
        self.embed_tokens = (
            embed_tokens
            if embed_tokens is not None
            else nn.Embedding(config.decoder_vocab_size, config.embedding_size)
        )
        # W_s (A.2.2), all decoder layers at once
        self.bridge = nn.Linear(
            config.encoder_hidden_size, config.decoder_layers * config.decoder_hidden_size, bias=False
        )
        self.score = build_score(
            config.attention_score, config.decoder_hidden_size, config.annotation_size, config.attention_size
        )
        if config.decoder_style == "bahdanau":
            feed_size = config.annotation_size  # c_i
        else:
            feed_size = config.decoder_hidden_size if config.input_feeding else 0  # h~_{t-1}
        self.rnn = Recurrent(
            config.rnn_type,
            config.embedding_size + feed_size,
            config.decoder_hidden_size,
            num_layers=config.decoder_layers,
            dropout=config.dropout if config.decoder_layers > 1 else 0.0,
        )
        if config.decoder_style == "bahdanau":  # [U_o C_o V_o] (A.2.2), 2 l outputs for the maxout
            self.readout = nn.Linear(
                config.decoder_hidden_size + config.annotation_size + config.embedding_size, 2 * config.readout_size
            )
        else:  # W_c (Eq. 5)
            self.attentional_proj = nn.Linear(
                config.annotation_size + config.decoder_hidden_size, config.decoder_hidden_size, bias=False
            )

    def initial_state(self, encoder_hidden_states: torch.Tensor) -> RNNState:
        """s_0 = tanh(W_s h_1<-) for every layer (A.2.2); LSTM memory cells start at zero."""
        backward_first = encoder_hidden_states[:, 0, self.config.encoder_hidden_size :]  # h_1<-, backward RNN's end
        hidden = torch.tanh(self.bridge(backward_first))  # (B, L * H)
        hidden = torch.stack(hidden.chunk(self.config.decoder_layers, dim=-1))  # (L, B, H)
        return (hidden, torch.zeros_like(hidden)) if self.config.rnn_type == "lstm" else hidden

    def _bahdanau_step(self, embed, state, keys, values, mask):
        """Target step i (Sec. 3.1).

        c_i from s_{i-1} (Eqs. 5-6), s_i = f(s_{i-1}, y_{i-1}, c_i), readout t_i (A.2.2).
        """
        top = state[0][-1] if isinstance(state, tuple) else state[-1]
        context, alignment = attend(self.score(top[:, None], keys), values, mask)  # (B, 1, 2 He), (B, 1, S)
        output, state = self.rnn(torch.cat([embed, context], dim=-1), state)  # s_i, (B, 1, H)
        readout = self.readout(torch.cat([output, context, embed], dim=-1))
        readout = readout.unflatten(-1, (self.config.readout_size, 2)).amax(dim=-1)  # maxout over pairs
        return readout, state, alignment

    def _luong_step(self, embeds, state, keys, values, mask, feed=None):
        """Target steps t (Sec. 3): h_t = RNN(h_{t-1}, [y_{t-1}; h~_{t-1}]), c_t from h_t (Eqs. 7-8),
        h~_t = tanh(W_c [c_t; h_t]) (Eq. 5). Without input feeding (`feed` None) h_t does not depend on the
        attention, and the whole target sequence runs in one call."""
        rnn_input = embeds if feed is None else torch.cat([embeds, feed], dim=-1)
        outputs, state = self.rnn(rnn_input, state)  # h_t, (B, T, H)
        context, alignment = attend(self.score(outputs, keys), values, mask)  # (B, T, 2 He), (B, T, S)
        attentional = torch.tanh(self.attentional_proj(torch.cat([context, outputs], dim=-1)))  # h~_t, (B, T, H)
        return attentional, state, alignment

    def _step_by_step(self, embeds, state, feed, keys, values, mask):
        """Bahdanau's decoder, or Luong's with input feeding, one target position at a time (`step_loop`): each
        state depends on the attention of the step before. Returns outputs (B, T, *), alignments (B, T, S), the
        state and the fed-back h~ after the last position."""

        def step(carry, position):  # carry: (state,) or, with input feeding, (state, h~_{t-1})
            embed = position[0][:, None]  # (B, 1, m)
            if self.config.decoder_style == "bahdanau":
                output, state, alignment = self._bahdanau_step(embed, carry[0], keys, values, mask)
                return (state,), (output[:, 0], alignment[:, 0])
            output, state, alignment = self._luong_step(embed, carry[0], keys, values, mask, carry[1])
            return (state, output), (output[:, 0].clone(), alignment[:, 0])  # input feeding (Sec. 3.3)

        carry, (outputs, alignments) = step_loop(step, (state,) if feed is None else (state, feed), (embeds,))
        return outputs, alignments, carry[0], carry[1] if feed is not None else None

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: AttnRNNCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if encoder_hidden_states is None:
            raise ValueError("AttnRNNDecoder needs encoder_hidden_states: it attends to the encoder annotations")
        if past_key_values is not None and not isinstance(past_key_values, AttnRNNCache):
            raise TypeError(
                f"past_key_values must be an AttnRNNCache (the decoder state), got {type(past_key_values).__name__}"
            )
        use_cache = self.config.use_cache if use_cache is None else use_cache
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        cache = past_key_values if past_key_values is not None else (AttnRNNCache() if use_cache else None)
        past_length = cache.steps if cache is not None else 0

        embeds = _embed(self, input_ids, inputs_embeds, self.config.decoder_vocab_size, "decoder_")  # (B, T, m)
        if embeds.shape[0] != encoder_hidden_states.shape[0]:
            raise ValueError(
                f"the decoder input has batch size {embeds.shape[0]} but the encoder output has "
                f"{encoder_hidden_states.shape[0]}"
            )
        _check_decoder_mask(attention_mask, (embeds.shape[0], past_length + embeds.shape[1]))
        check_attention_mask(encoder_attention_mask, encoder_hidden_states.shape[:2], "attention_mask (source)")
        mask = padding_mask(encoder_attention_mask) if encoder_attention_mask is not None else None  # (B, 1, S)
        values = encoder_hidden_states

        luong_feed = self.config.decoder_style == "luong" and self.config.input_feeding
        if past_length > 0:
            keys, state, feed = cache.keys, cache.rnn_state, cache.feed
        else:
            keys = self.score.project_keys(encoder_hidden_states)  # once per sentence
            state = self.initial_state(encoder_hidden_states)
            feed = embeds.new_zeros(embeds.shape[0], 1, self.config.decoder_hidden_size) if luong_feed else None

        if self.config.decoder_style == "luong" and not luong_feed:
            outputs, state, alignments = self._luong_step(embeds, state, keys, values, mask)
        else:
            outputs, alignments, state, feed = self._step_by_step(embeds, state, feed, keys, values, mask)

        if cache is not None:
            cache.store(keys, state, feed, embeds.shape[1])
        outputs = dropout(outputs, self.config.dropout, self.training)
        return with_cache(
            BaseModelOutputWithPastAndCrossAttentions,
            cache if use_cache else None,
            last_hidden_state=outputs,
            cross_attentions=(alignments,) if output_attentions else None,
        )


class AttnRNNPreTrainedModel(EncoderDecoderPreTrainedModel):
    config: AttnRNNConfig
    config_class = AttnRNNConfig
    _no_split_modules = ["AttnRNNEncoder", "AttnRNNDecoder"]

    @staticmethod
    def heads() -> tuple[type, type]:
        return AttnRNNModel, AttnRNNForConditionalGeneration

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Every parameter uniform in [-0.1, 0.1] (Luong Sec. 4.1)."""
        if isinstance(module, (nn.Linear, nn.Embedding, nn.RNNBase)):
            for parameter in module.parameters(recurse=False):
                init.uniform_(parameter, -0.1, 0.1)


class AttnRNNModel(EncoderDecoderModel, AttnRNNPreTrainedModel):
    """Encoder and decoder without the output projection: returns the decoder outputs (B, T, config.output_size)."""

    def __init__(self, config: AttnRNNConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self.share_embeddings(nn.Embedding(config.vocab_size, config.embedding_size))
        else:
            self.share_embeddings(None)
        self.encoder = AttnRNNEncoder(config, self.shared)
        self.decoder = AttnRNNDecoder(config, self.shared)
        self.post_init()


class AttnRNNForConditionalGeneration(
    SourceRelativeLengthMixin,
    CompactBeamSearchMixin,
    EncoderDecoderForConditionalGeneration,
    AttnRNNPreTrainedModel,
    GenerationMixin,
):
    """The RNN encoder-decoder with its output projection (W_o, Bahdanau A.2.2; W_s, Luong Eq. 6): a translation model.

    `forward` and its loss (`labels`, `smoothing`, `skip_logits`) are `encoder_decoder.py`'s.

    With `output_attentions=True`, `cross_attentions` is a one-tuple (there is one attention per decoder, not
    one per layer) holding the alignments alpha, (B, T, S): row t is the distribution over source positions
    used to predict target token t; it sums to 1 over the real tokens and is 0 on padding. In generate()
    each step contributes one such tuple with T = 1. Hidden states are not returned (`output_hidden_states`
    is accepted, as generate() passes it, and has no effect).
    """

    _is_stateful = True  # the decoder state cannot be rolled back: no assisted generation

    def __init__(self, config: AttnRNNConfig):
        super().__init__(config)
        self.add_output_layer(AttnRNNModel(config), config.output_size)
        self.post_init()

    def generate(
        self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None, *args, **kwargs
    ):
        """transformers' generate(), refusing a `cache_implementation` (static, offloaded, quantized): those are
        key/value caches, and this decoder carries a fixed-size recurrent state (`AttnRNNCache`) instead."""
        config = generation_config if generation_config is not None else self.generation_config
        implementation = kwargs.get("cache_implementation", config.cache_implementation)
        if implementation not in (None, "dynamic"):
            raise ValueError(
                f"attn_rnn takes no cache_implementation={implementation!r}: its decoder carries a recurrent "
                "state (AttnRNNCache), not a key/value cache to preallocate; leave cache_implementation unset"
            )
        return super().generate(inputs, generation_config, *args, **kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """generate() must not build its key/value cache for this model: forward creates an `AttnRNNCache`
        (use_cache=True) at the first step and generate carries it through `past_key_values`."""
        return False


__all__ = [
    "AttnRNNCache",
    "AttnRNNForConditionalGeneration",
    "AttnRNNModel",
    "AttnRNNPreTrainedModel",
]
