"""A lean decoding loop for `attn_transformer` that gives `model.generate()`'s token ids without its machinery.

`fast_generate(model, input_ids, attention_mask, **generate_kwargs)` returns what `model.generate(input_ids=...,
attention_mask=..., **generate_kwargs)` returns (decoder start token first, rows padded as generate() pads them), or
None for a call it does not replicate exactly (the caller then runs generate()); what it accepts is `ACCEPTED`, with
the reason for each setting. The encoder (`EncoderPass`) and a decoder step (`DecoderStep`) are the model's own
weights through the same torch functions in the same order: the encoder once, each layer's cross-attention keys/values
once per search, self-attention keys/values in buffers allocated once and written in place, `beam_search.py`'s search
on Python numbers (`ListBeamSearch`, `ConstrainedListBeamSearch` with lexical constraints: the decoder runs on the
rows generate() runs on), the per-sentence limit only where a sentence reaches it. q, k and v run as one matmul
only for the row counts where this machine's kernels give the same bits as three (`fusion_is_exact`). docs/model.md,
"The fast decoding loop", has where generate()'s time went and what this gains (little on a model the size of
`base`, bound by reading its weights).

Shapes: B sentences, K beams, R decoder rows (B or N open sentences x K), S source length, E d_model, H heads,
D head dim, V target vocabulary, L max_length.
"""

from __future__ import annotations

import copy
import functools
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationConfig
from transformers.masking_utils import create_bidirectional_mask

from .beam_search import ConstrainedListBeamSearch, ListBeamSearch, beam_settings
from .constraints import PER_SENTENCE_ARGUMENT, LexicalConstraints, constraints_argument
from .generation import (
    SOURCE_LIMIT_FIELD,
    check_generate_arguments,
    per_sentence_offset,
    sentence_limits,
    source_lengths,
)
from .inputs import check_attention_mask, check_ids_in_vocabulary
from .modeling_transformer import AttnTransformerForConditionalGeneration
from .padding_free import kept_rows

# The generation settings this loop replicates; each must be what generate() merges from the model's
# generation_config and the call's kwargs. Any other setting away from transformers' default -> None (generate()).
ACCEPTED = {
    "num_beams": "1 is greedy search, more is beam search (beam_search.py's search)",
    "num_return_sequences": "beam search's n-best list (1 for greedy, as generate() requires)",
    "length_penalty": "beam search's length normalisation of finished hypotheses",
    "early_stopping": "beam search's stopping rule: True, False or 'never'",
    "max_length": "the output limit (decoder start token included)",
    "max_new_tokens": "the output limit without the decoder start token",
    SOURCE_LIMIT_FIELD: "the paper's per-sentence limit, source length + offset (generation.py)",
    "eos_token_id": "ends a translation (one id or several)",
    "pad_token_id": "fills the rows of finished translations",
    "bos_token_id": "the decoder start token when decoder_start_token_id is None",
    "decoder_start_token_id": "the first decoder input",
    "use_cache": "True only: the loop keeps its own cache, which gives the cached decoder's logits",
}
# Lexical constraints (constraints.py): the search is `beam_search.ConstrainedListBeamSearch`.
CONSTRAINT_ARGUMENTS = {"force_words_ids", PER_SENTENCE_ARGUMENT}
# transformers' private generate() steps that merge the settings as generate() does (a version without them: None).
PRIVATE_HELPERS = ("_prepare_generation_config", "_prepare_special_tokens")
# Bookkeeping fields of a GenerationConfig, not settings.
METADATA = {"_from_model_config", "transformers_version"}
# The attention backend whose kernel a step calls (eager attention computes differently: refused).
ATTENTION = "sdpa"


def fast_generate(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, **generate_kwargs
) -> torch.LongTensor | None:
    """`model.generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)`'s token ids, or None
    when this loop does not handle the model or the settings (see the module docstring)."""
    signature = model_signature(model)
    if signature is None or not _supported_inputs(model, input_ids, attention_mask):
        return None
    streamer = generate_kwargs.pop("streamer", None)  # generate()'s: each new token, as it is chosen (greedy only)
    constraints = None
    if CONSTRAINT_ARGUMENTS & generate_kwargs.keys():  # taken out first: the merged settings are remembered per call
        generate_kwargs = dict(generate_kwargs)
        base = generate_kwargs.get("generation_config") or model.generation_config
        try:
            constraints = constraints_argument(generate_kwargs, base, input_ids.shape[0])
        except ValueError:
            return None  # generate() raises it
    plan = DecodingPlan.of(model, input_ids, attention_mask, generate_kwargs)
    if plan is None:
        return None
    with torch.inference_mode():
        step = _STEPS.get(model)
        if step is None or step.signature != signature:
            try:
                step = _STEPS[model] = DecoderStep(model, signature)
            except _NotPlainLinear:  # quantized projections compute otherwise: generate() runs them
                return None
        encoded = step.encode(input_ids, attention_mask)
        if plan.num_beams == 1:
            sequences = greedy_search(step, plan, encoded, attention_mask, streamer)
        elif streamer is not None:
            return None  # generate() refuses a streamer with beam search
        else:
            sequences = beam_search(step, plan, encoded, attention_mask, constraints)
    return None if sequences is None else sequences.clone()  # a normal tensor, as generate() returns


def supported_model(model: nn.Module) -> bool:
    """An `AttnTransformerForConditionalGeneration` itself (not a subclass, an ensemble or the RNN), in eval mode,
    on the SDPA backend, with plain Linear layers (not quantized) and no hooks (this loop would bypass them)."""
    return model_signature(model) is not None


def model_signature(model: nn.Module) -> tuple | None:
    """None for a model `supported_model` refuses, else what identifies its modules and weights now (each
    module, each tensor and its version counter): a `DecoderStep` made for an equal signature still holds the
    model's weights."""
    if type(model) is not AttnTransformerForConditionalGeneration or model.training:
        return None
    if model.config._attn_implementation != ATTENTION:
        return None
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return None
    signature = []
    append, stack = signature.append, [model]
    while stack:  # every module once (a stack, not model.modules(): this runs on every call)
        module = stack.pop()
        if module is None:  # a child registered as None
            continue
        if module._forward_hooks or module._forward_pre_hooks or "_hf_hook" in module.__dict__:
            return None
        if not _plain_type(type(module)):
            return None
        append(id(module))
        for tensors in (module._parameters, module._buffers):
            for tensor in tensors.values():
                if tensor is not None:
                    append((id(tensor), tensor._version))
        stack.extend(module._modules.values())
    return tuple(signature)


@functools.cache
def _plain_type(module_type: type) -> bool:
    """Not a Linear subclass and not a quantized (int8) layer: their own kernels, not F.linear."""
    if issubclass(module_type, nn.Linear) and module_type is not nn.Linear:
        return False
    return not module_type.__module__.startswith("torch.ao.")


_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its DecoderStep


def _supported_inputs(model: nn.Module, input_ids, attention_mask) -> bool:
    """Token ids and a 0/1 padding mask of the same (B, S) shape on the model's device (generate() infers a missing
    mask from the pad token: not replicated)."""
    if not isinstance(input_ids, torch.Tensor) or not isinstance(attention_mask, torch.Tensor):
        return False
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape or input_ids.shape[0] == 0:
        return False
    return input_ids.device == model.device == attention_mask.device


class DecodingPlan:
    """What stays fixed during one call: the merged settings, as generate() computes them."""

    def __init__(self, config: GenerationConfig, max_length: int, limits: list[int] | None):
        self.num_beams = config.num_beams
        self.num_return_sequences = config.num_return_sequences
        self.config = config  # with its special-token tensors (transformers' `_prepare_special_tokens`)
        self.max_length = max_length
        self.limits = limits  # per sentence: the most tokens a translation may have (the end token included)
        self.eos = config._eos_token_tensor
        self.pad = config._pad_token_tensor
        self.start = int(config._decoder_start_token_tensor)

    @classmethod
    def of(cls, model, input_ids, attention_mask, kwargs: dict) -> DecodingPlan | None:
        """The plan of one call, or None for settings this loop does not replicate. The merged settings are
        remembered per model, keyed by the call's arguments and the text of the generation configs involved (merging
        them is generate()'s slowest set-up step); the length limits are the call's own."""
        merged = _merged_settings(model, kwargs, input_ids.device)
        if merged is None:
            return None
        config, offset, has_default_max_length = merged
        limits = None
        positions = model.config.max_position_embeddings
        if offset is not None:
            limits = sentence_limits(source_lengths(input_ids, attention_mask), offset, positions).tolist()
            max_length = max(limits) + 1
        elif config.max_new_tokens is not None:
            max_length = config.max_new_tokens + 1  # + the decoder start token
        elif has_default_max_length:
            max_length = min(config.max_length + 1, positions)
        else:
            max_length = config.max_length
        if max_length <= 1:
            return None  # generate() raises
        config = copy.copy(config)
        config.max_length = max_length  # as generate() sets it (`beam_search.BeamSettings` reads it)
        return cls(config, max_length, limits)


_MERGED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {call key: merged settings or None}
_REMEMBERED = 64  # calls with different settings remembered per model


def _merged_settings(model, kwargs: dict, device: torch.device) -> tuple | None:
    """`_merge_settings`, remembered (see `DecodingPlan.of`)."""
    base = kwargs.get("generation_config")
    key = (
        repr(sorted(kwargs.items(), key=lambda item: item[0])),
        repr(vars(model.generation_config)),
        None if base is None else repr(vars(base)),
        str(device),
    )
    remembered = _MERGED.setdefault(model, {})
    if key not in remembered:
        if len(remembered) >= _REMEMBERED:
            remembered.clear()
        remembered[key] = _merge_settings(model, dict(kwargs), device)
    return remembered[key]


def _merge_settings(model, kwargs: dict, device: torch.device) -> tuple | None:
    """generate()'s merged GenerationConfig (with its special-token tensors) and what SourceRelativeLengthMixin
    and generate() decide the output limit from: (config, the per-sentence offset or None,
    has_default_max_length); None for settings outside `ACCEPTED` or ones generate() raises on."""
    if not all(hasattr(model, name) for name in PRIVATE_HELPERS):
        return None
    base = kwargs.pop("generation_config", None)
    user_config = base if base is not None else model.generation_config
    try:
        check_generate_arguments(None, user_config, kwargs)
    except ValueError:
        return None  # generate() raises it
    # SourceRelativeLengthMixin.generate: the per-sentence limit unless an explicit limit is asked for
    offset = per_sentence_offset(user_config, kwargs)
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 1):
        return None  # generate() raises
    has_default_max_length = (
        kwargs.get("max_length") is None
        and (base is None or base.max_length is None)
        and model.generation_config.max_length is None
    )
    try:
        config, model_kwargs = model._prepare_generation_config(base, **kwargs)
    except (AttributeError, TypeError, ValueError):
        return None
    if model_kwargs or not _default_elsewhere(config):
        return None
    if config.do_sample is not False or config.use_cache is not True:
        return None
    if config.num_beams == 1 and config.num_return_sequences != 1:
        return None
    if config.num_return_sequences > config.num_beams:
        return None
    if not isinstance(config.early_stopping, bool) and config.early_stopping != "never":
        return None
    model._prepare_special_tokens(config, True, device=device)
    if config._eos_token_tensor is None:
        return None
    return config, offset, has_default_max_length


_DEFAULTS: dict | None = None


def _default_elsewhere(config: GenerationConfig) -> bool:
    """Whether every setting outside `ACCEPTED` has transformers' default value (what a bare GenerationConfig
    merges to in generate())."""
    global _DEFAULTS
    if _DEFAULTS is None:
        reference = GenerationConfig()
        if hasattr(reference, "_get_default_generation_params"):
            reference.update(**reference._get_default_generation_params(), defaults_only=True)
        _DEFAULTS = reference.to_dict()
    for name, value in config.to_dict().items():
        if name in ACCEPTED or name in METADATA:
            continue
        default = _DEFAULTS.get(name)
        if default != value and not (_off(default) and _off(value)):
            return False
    return True


def _off(value) -> bool:
    """None, False and 0 all leave a feature off (a saved config writes False where a bare one holds None)."""
    return value is None or (isinstance(value, bool | int | float) and value == 0)


class LayerWeights(NamedTuple):
    """One decoder layer's parameters, as (W.t(), bias) pairs for addmm (`_affine`) and LayerNorm arguments for
    F.layer_norm."""

    q_proj: tuple
    k_proj: tuple
    v_proj: tuple
    out_proj: tuple
    self_attn_layer_norm: tuple
    cross_q_proj: tuple
    cross_out_proj: tuple
    encoder_attn_layer_norm: tuple
    fc1: tuple
    activation: Callable
    fc2: tuple
    final_layer_norm: tuple
    scaling: float
    cross_scaling: float
    qkv_proj: tuple  # q, k and v projections as one (3E, E) matrix (transposed), used where that rounds alike

    @classmethod
    def of(cls, layer: nn.Module) -> LayerWeights:
        self_attn, cross = layer.self_attn, layer.encoder_attn
        activation = layer.activation_fn
        return cls(
            _linear(self_attn.q_proj),
            _linear(self_attn.k_proj),
            _linear(self_attn.v_proj),
            _linear(self_attn.out_proj),
            _norm(layer.self_attn_layer_norm),
            _linear(cross.q_proj),
            _linear(cross.out_proj),
            _norm(layer.encoder_attn_layer_norm),
            _linear(layer.fc1),
            F.relu if type(activation) is nn.ReLU else activation,  # nn.ReLU calls F.relu
            _linear(layer.fc2),
            _norm(layer.final_layer_norm),
            self_attn.scaling,
            cross.scaling,
            _transposed(_fused_projection(self_attn)),
        )


_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # attention module -> (signature, (weight, bias))


def _fused_projection(attention: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """W^Q, W^K, W^V (and their biases) stacked into one matrix, made once and re-made when a weight changes."""
    parts = [attention.q_proj, attention.k_proj, attention.v_proj]
    tensors = [tensor for part in parts for tensor in (part.weight, part.bias) if tensor is not None]
    signature = tuple((tensor.data_ptr(), tensor._version) for tensor in tensors)
    cached = _FUSED.get(attention)
    if cached is None or cached[0] != signature:
        with torch.no_grad():
            weight = torch.cat([part.weight for part in parts])
            bias = torch.cat([part.bias for part in parts]) if parts[0].bias is not None else None
        cached = _FUSED[attention] = (signature, (weight, bias))
    return cached[1]


_FUSION_EXACT: dict = {}  # (width, dtype, device type, rows) -> whether one (3E, E) matmul rounds as three


def fusion_is_exact(attention: nn.Module, rows: int) -> bool:
    """Whether this machine's matmul gives the same bits for the fused q/k/v projection of `rows` rows as for the
    model's three. Its kernels are picked by shape (one row can take a matrix-vector kernel whose sums depend on the
    output width), so the answer holds for every layer of that width, dtype and device; checked once per process and
    row count. Where it does not hold, the step keeps three matmuls."""
    weight = attention.q_proj.weight
    key = (weight.shape[1], weight.dtype, weight.device.type, rows)
    if key not in _FUSION_EXACT:
        parts = (attention.q_proj, attention.k_proj, attention.v_proj)
        generator = torch.Generator(device=weight.device).manual_seed(0)
        with torch.no_grad():
            states = torch.randn(rows, 1, weight.shape[1], generator=generator, device=weight.device).to(weight.dtype)
            apart = torch.cat([F.linear(states, part.weight, part.bias) for part in parts], dim=-1)
            _FUSION_EXACT[key] = torch.equal(apart, F.linear(states, *_fused_projection(attention)))
    return _FUSION_EXACT[key]


class EncoderLayerWeights(NamedTuple):
    """One encoder layer's parameters, as `LayerWeights` holds a decoder layer's."""

    q_proj: tuple
    k_proj: tuple
    v_proj: tuple
    out_proj: tuple
    self_attn_layer_norm: tuple
    fc1: tuple
    activation: Callable
    fc2: tuple
    final_layer_norm: tuple
    scaling: float

    @classmethod
    def of(cls, layer: nn.Module) -> EncoderLayerWeights:
        attention, activation = layer.self_attn, layer.activation_fn
        return cls(
            _linear(attention.q_proj),
            _linear(attention.k_proj),
            _linear(attention.v_proj),
            _linear(attention.out_proj),
            _norm(layer.self_attn_layer_norm),
            _linear(layer.fc1),
            F.relu if type(activation) is nn.ReLU else activation,
            _linear(layer.fc2),
            _norm(layer.final_layer_norm),
            attention.scaling,
        )


class _StackPass:
    """What a pass over the encoder or the decoder stack reads of it: sizes, embeddings, positions, final LayerNorm."""

    def __init__(self, config, stack: nn.Module):
        self.norm_first = config.norm_first
        self.width, self.heads = config.d_model, config.num_heads
        self.head_dim = config.d_model // config.num_heads
        self.embedding = stack.embed_tokens.weight
        self.padding_idx = stack.embed_tokens.padding_idx
        self.embed_scale = stack.embed_scale
        self.positions = stack.embed_positions.table
        self.final_norm = _norm(stack.layer_norm) if stack.layer_norm is not None else None

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The stack's `_embed` in eval: token embeddings, scaled, plus the given rows of the position table."""
        hidden = F.embedding(ids, self.embedding, self.padding_idx)
        if self.embed_scale != 1.0:
            hidden = hidden * self.embed_scale
        return hidden + positions.to(hidden.dtype)


class EncoderPass(_StackPass):
    """The model's encoder in eval mode (`AttnTransformerEncoder.forward`) on the same kernels in the same order,
    without its modules' Python: its output is the encoder's bit for bit (tests/test_fast_generation.py). The ids
    and the mask are checked by the encoder's own checks (the same errors); the mask SDPA gets is the one
    transformers' `create_bidirectional_mask` makes for the encoder; on a padded batch the feed-forward network runs
    on the real tokens' rows only and the others get zeros (`padding_free.each_on_rows`, as the encoder does)."""

    def __init__(self, model: AttnTransformerForConditionalGeneration):
        super().__init__(model.config, model.model.encoder)
        self.config = model.config
        self.layers = [EncoderLayerWeights.of(layer) for layer in model.model.encoder.layers]

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The encoder's last hidden state (B, S, E)."""
        batch_size, length = input_ids.shape
        check_ids_in_vocabulary(input_ids, self.config.vocab_size, "input_ids")
        if length > self.positions.shape[0]:
            raise ValueError(  # AttnTransformerPositionalEncoding's message
                f"sequence of {length} positions exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}; raise it in the config or truncate the input"
            )
        hidden = self._embed(input_ids, self.positions[:length])
        check_attention_mask(attention_mask, hidden.shape[:2], "attention_mask", require_token=True)
        rows = kept_rows(attention_mask)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask)
        for layer in self.layers:
            hidden = _residual(self.norm_first, hidden, layer.self_attn_layer_norm, self._attention, layer, mask)
            hidden = _residual(self.norm_first, hidden, layer.final_layer_norm, self._feed_forward, layer, rows)
        return hidden if self.final_norm is None else F.layer_norm(hidden, *self.final_norm)

    def _attention(self, states: torch.Tensor, layer: EncoderLayerWeights, mask) -> torch.Tensor:
        """MultiHeadAttention.forward with transformers' sdpa_attention_forward, on (B, S, E) states: nn.Linear
        flattens them to (B * S, E) for addmm; the heads are views; SDPA's output is transposed back and copied."""
        batch_size, length, _ = states.shape
        flat = states.reshape(batch_size * length, self.width)
        query, key, value = (
            _affine(flat, projection).view(batch_size, length, self.heads, self.head_dim).transpose(1, 2)
            for projection in (layer.q_proj, layer.k_proj, layer.v_proj)
        )
        output = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=0.0, scale=layer.scaling, is_causal=False
        )
        merged = output.transpose(1, 2).contiguous().view(batch_size * length, self.width)
        return _affine(merged, layer.out_proj).view(batch_size, length, self.width)

    @staticmethod
    def _feed_forward(states: torch.Tensor, layer: EncoderLayerWeights, rows: torch.Tensor | None) -> torch.Tensor:
        """Eq. 2 on every position, or (a padded batch) on `rows` of the flattened positions, zeros elsewhere."""
        flat = states.reshape(-1, states.shape[-1])
        picked = flat if rows is None else flat.index_select(0, rows)
        output = _affine(layer.activation(_affine(picked, layer.fc1)), layer.fc2)
        if rows is not None:
            output = output.new_zeros(flat.shape[0], output.shape[-1]).index_copy_(0, rows, output)
        return output.view(states.shape)


def _residual(norm_first: bool, hidden, norm: tuple, compute: Callable, *args) -> torch.Tensor:
    """A residual sublayer: x + Sublayer(LN(x)) when `norm_first`, else LN(x + Sublayer(x)) (Sec. 3.1)."""
    if norm_first:
        return hidden + compute(F.layer_norm(hidden, *norm), *args)
    return F.layer_norm(hidden + compute(hidden, *args), *norm)


class DecoderStep(_StackPass):
    """One cached decoder step of the model on R rows: the model's weights through the kernels its modules call, in
    the same order, so that the logits are the model's bit for bit.

    The step works on (R, E) rows: an `nn.Linear` on the model's (R, 1, E) states flattens them to (R, E) and calls
    `addmm(bias, x, W.t())` (`mm` without a bias), which the step calls directly on W.t() views made once; layer
    norms, additions and activations are row-wise, the same on either shape; SDPA gets the model's (R, H, 1, D)
    queries, and its (R, H, 1, D) output is already the merged heads' memory order (no transpose and copy).

    `self_kv` is (L, 2 * layers, R, H, D), position-major so that the positions written so far are one contiguous
    block (a beam reorder copies only them, in one operation): layer i's keys at [:, 2i], values at [:, 2i + 1],
    position t written at step t.
    `cross_kv` per layer: (keys, values), each (R, H, S, D), projected once from the encoder output.
    """

    def __init__(self, model: AttnTransformerForConditionalGeneration, signature: tuple | None = None):
        decoder = model.model.decoder
        super().__init__(model.config, decoder)
        self.signature = signature
        self.output = _linear(model.lm_head)
        self.logits_bias = model.final_logits_bias
        self.layers = [LayerWeights.of(layer) for layer in decoder.layers]
        self.first_attention = decoder.layers[0].self_attn
        self.encode = EncoderPass(model)  # the encoder output these steps decode from
        self._fuse: dict[int, bool] = {}  # rows -> fusion_is_exact (made per step otherwise)
        self.cross_projections = [
            (_linear(layer.encoder_attn.k_proj), _linear(layer.encoder_attn.v_proj)) for layer in decoder.layers
        ]

    def cross_keys_values(self, encoded: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's encoder-decoder attention keys and values (R, H, S, D), from the encoder output (R, S, E)."""
        rows, length = encoded.shape[:2]
        flat = encoded.reshape(rows * length, self.width)  # what nn.Linear hands addmm for (R, S, E)
        return [
            tuple(
                _affine(flat, projection).view(rows, length, self.heads, self.head_dim).transpose(1, 2)
                for projection in pair
            )
            for pair in self.cross_projections
        ]

    def projections(self, fuse: bool) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The (W.t(), bias) pairs one step multiplies by, in order (q, k and v as one when `fuse`): what reads the
        decoder's weights and the output matrix (bench/fast_generation.py times them alone)."""
        projections = []
        for layer in self.layers:
            self_attention = [layer.qkv_proj] if fuse else [layer.q_proj, layer.k_proj, layer.v_proj]
            projections += [*self_attention, layer.out_proj, layer.cross_q_proj, layer.cross_out_proj]
            projections += [layer.fc1, layer.fc2]
        return [*projections, self.output]

    def new_cache(self, rows: int, length: int, like: torch.Tensor) -> torch.Tensor:
        shape = (length, 2 * len(self.layers), rows, self.heads, self.head_dim)
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def _attend(self, query, keys, values, mask, scaling, out_proj) -> torch.Tensor:
        """transformers' sdpa_attention_forward on one query position (R, E), then merge_heads and the output
        projection (attention.MultiHeadAttention.forward), on (R, E) rows."""
        rows = query.shape[0]
        output = F.scaled_dot_product_attention(
            query.view(rows, 1, self.heads, self.head_dim).transpose(1, 2),
            keys,
            values,
            attn_mask=mask,
            dropout_p=0.0,
            scale=scaling,
            is_causal=False,
        )
        return _affine(output.view(rows, self.width), out_proj)  # (R, H, 1, D) holds (R, 1, H, D)'s order

    def _self_attention(self, states, layer: LayerWeights, keys, values, position: int, fuse: bool) -> torch.Tensor:
        """Masked self-attention of the new position over positions 0..position; its keys/values written first."""
        if fuse:
            # (R, 3E) as three (R, E) views, as split(E, dim=-1) gives them (unbind: one operation, no Python wrapper)
            query, key, value = _affine(states, layer.qkv_proj).view(-1, 3, self.width).unbind(1)
        else:
            query, key, value = (_affine(states, proj) for proj in (layer.q_proj, layer.k_proj, layer.v_proj))
        rows = states.shape[0]
        keys[position] = key.view(rows, self.heads, self.head_dim)
        values[position] = value.view(rows, self.heads, self.head_dim)
        end = position + 1
        keys, values = (cache[:end].permute(1, 2, 0, 3) for cache in (keys, values))  # (R, H, T, D)
        return self._attend(query, keys, values, None, layer.scaling, layer.out_proj)

    def _cross_attention(self, states, layer: LayerWeights, keys, values, mask) -> torch.Tensor:
        query = _affine(states, layer.cross_q_proj)
        return self._attend(query, keys, values, mask, layer.cross_scaling, layer.cross_out_proj)

    @staticmethod
    def _feed_forward(states, layer: LayerWeights) -> torch.Tensor:  # Eq. 2
        return _affine(layer.activation(_affine(states, layer.fc1)), layer.fc2)

    def _sublayer(self, hidden, norm: tuple, compute: Callable, *args) -> torch.Tensor:
        return _residual(self.norm_first, hidden, norm, compute, *args)

    def __call__(self, tokens, position: int, self_kv, cross_kv, cross_mask) -> torch.Tensor:
        """Logits (R, V) for `tokens` (R,) at decoder `position`."""
        hidden = self._embed(tokens, self.positions[position : position + 1])  # (R, E)
        rows = tokens.shape[0]
        fuse = self._fuse.get(rows)
        if fuse is None:
            fuse = self._fuse[rows] = fusion_is_exact(self.first_attention, rows)
        for index, layer in enumerate(self.layers):
            keys, values = self_kv[:, 2 * index], self_kv[:, 2 * index + 1]
            hidden = self._sublayer(
                hidden, layer.self_attn_layer_norm, self._self_attention, layer, keys, values, position, fuse
            )
            cross_keys, cross_values = cross_kv[index]
            hidden = self._sublayer(
                hidden,
                layer.encoder_attn_layer_norm,
                self._cross_attention,
                layer,
                cross_keys,
                cross_values,
                cross_mask,
            )
            hidden = self._sublayer(hidden, layer.final_layer_norm, self._feed_forward, layer)
        if self.final_norm is not None:
            hidden = F.layer_norm(hidden, *self.final_norm)
        logits = _affine(hidden, self.output)
        return logits + self.logits_bias[0] if self.logits_bias is not None else logits


class _NotPlainLinear(Exception):
    """A projection of the model is not an `nn.Linear` (an int8 layer of `api/quantize.py`...): not for this loop."""


def _linear(module: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A plain Linear layer's W.t() (a view, made once) and bias: what F.linear hands addmm."""
    if type(module) is not nn.Linear:
        raise _NotPlainLinear(type(module).__name__)
    return module.weight.t(), module.bias


def _transposed(pair: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    return pair[0].t(), pair[1]


def _affine(states: torch.Tensor, projection: tuple) -> torch.Tensor:
    """F.linear(states, W, b) on (R, E) rows with W.t() given: the addmm (mm without a bias) F.linear calls."""
    weight_t, bias = projection
    return torch.mm(states, weight_t) if bias is None else torch.addmm(bias, states, weight_t)


def _norm(module: nn.LayerNorm) -> tuple:
    return module.normalized_shape, module.weight, module.bias, module.eps


def _cross_mask(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The encoder-decoder attention mask SDPA gets (masking_utils.create_bidirectional_mask): None without
    padding, else (R, 1, 1, S) booleans, True = may attend."""
    return None if bool(attention_mask.all()) else attention_mask.bool()[:, None, None, :]


def _force_end(scores: torch.Tensor, at_limit: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """`generation.SourceLengthLimit`: rows at their limit may only end (their end-token scores kept)."""
    forced = torch.full_like(scores, torch.finfo(scores.dtype).min)
    forced[:, eos] = scores[:, eos]
    return torch.where(at_limit[:, None], forced, scores)


def greedy_search(
    step: DecoderStep, plan: DecodingPlan, encoded: torch.Tensor, attention_mask: torch.Tensor, streamer=None
):
    """transformers' greedy search (`_sample` without sampling): argmax of the (length-limited) logits; a finished
    row gets the pad token; the search stops when every row has ended or at `max_length`. `streamer` gets what
    generate() gives it: the start tokens, each step's tokens, then `end()`."""
    batch_size, max_length = encoded.shape[0], plan.max_length
    if max_length - 1 > step.positions.shape[0]:
        return None  # the decoder may run out of positions: generate() says so, or finishes before
    cross_kv, cross_mask = step.cross_keys_values(encoded), _cross_mask(attention_mask)
    self_kv = step.new_cache(batch_size, max_length - 1, encoded)
    sequences = torch.full((batch_size, max_length), int(plan.pad), dtype=torch.long, device=encoded.device)
    sequences[:, 0] = plan.start
    unfinished = torch.ones(batch_size, dtype=torch.bool, device=encoded.device)
    limits = None if plan.limits is None else torch.tensor(plan.limits, device=encoded.device)
    first_limit = None if plan.limits is None else min(plan.limits) - 1
    tokens = sequences[:, 0]
    length = 1
    if streamer is not None:
        streamer.put(sequences[:, :1].cpu())
    for position in range(max_length - 1):
        scores = step(tokens, position, self_kv, cross_kv, cross_mask).float()
        if first_limit is not None and position >= first_limit:
            scores = _force_end(scores, position >= limits - 1, plan.eos)
        next_tokens = torch.where(unfinished, scores.argmax(dim=-1), plan.pad)
        sequences[:, position + 1] = next_tokens
        length = position + 2
        if streamer is not None:
            streamer.put(next_tokens.cpu())
        unfinished &= ~torch.isin(next_tokens, plan.eos)
        if not bool(unfinished.any()):
            break
        tokens = sequences[:, position + 1]
    if streamer is not None:
        streamer.end()
    return sequences[:, :length]


def beam_search(
    step: DecoderStep,
    plan: DecodingPlan,
    encoded: torch.Tensor,
    attention_mask: torch.Tensor,
    constraints: LexicalConstraints | None = None,
):
    """`beam_search.CompactBeamSearchMixin._beam_search` with this module's decoder step and the search on Python
    numbers (`beam_search.ListBeamSearch`, `ConstrainedListBeamSearch` with `constraints`): transformers' beam
    search (or the constrained search) on the sentences still open, the same rows in the same order at every step."""
    beams, max_length = plan.num_beams, plan.max_length
    if max_length - 1 > step.positions.shape[0]:
        return None
    batch_size, device = encoded.shape[0], encoded.device
    encoded = encoded.repeat_interleave(beams, dim=0)  # generate()'s _expand_inputs_for_generation
    attention_mask = attention_mask.repeat_interleave(beams, dim=0)
    cross_kv, cross_mask = step.cross_keys_values(encoded), _cross_mask(attention_mask)
    rows = encoded.shape[0]
    # two caches: a step's reorder writes the beams' keys/values into the other one (no copy back)
    self_kv, spare = step.new_cache(rows, max_length - 1, encoded), step.new_cache(rows, max_length - 1, encoded)
    settings, fill = beam_settings(1, plan.config)  # the prompt: the decoder start token
    if constraints is None:
        search = ListBeamSearch(batch_size, settings, [plan.start], int(fill), plan.eos.tolist())
    else:
        search = ConstrainedListBeamSearch(
            batch_size, settings, [plan.start], int(fill), plan.eos.tolist(), constraints.sentences, plan.limits
        )
    limits = None if plan.limits is None else torch.tensor(plan.limits, device=device)
    first_limit = None if plan.limits is None else min(plan.limits) - 1
    tokens = torch.full((rows,), plan.start, dtype=torch.long, device=device)
    cur_len = 1
    while True:
        position = cur_len - 1
        logits = step(tokens, position, self_kv, cross_kv, cross_mask)
        log_probs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
        if first_limit is not None and position >= first_limit:
            at_limit = (position >= limits - 1).repeat_interleave(beams)
            log_probs = _force_end(log_probs, at_limit, plan.eos)
        outcome = search.step(log_probs, cur_len)
        cur_len += 1
        if outcome is None:
            break
        parents, kept = outcome
        # the next step's rows: which row each continues, and its token (one tensor made, not two)
        parents, tokens = torch.tensor(parents + search.last_tokens(), device=device).view(2, -1)
        written = cur_len - 1  # positions 0 .. cur_len - 2 hold keys/values
        if kept is not None:  # sentences closed: their rows leave the caches, the encoder output and the limits
            fresh = step.new_cache(len(parents), self_kv.shape[0], self_kv)
            fresh[:written] = self_kv[:written].index_select(2, parents)
            self_kv, spare = fresh, step.new_cache(len(parents), self_kv.shape[0], self_kv)
            cross_kv = [(keys[parents], values[parents]) for keys, values in cross_kv]
            attention_mask = attention_mask[parents]
            cross_mask = _cross_mask(attention_mask)
            if limits is not None:
                limits = limits[torch.tensor(kept, device=device)]
        else:
            torch.index_select(self_kv[:written], 2, parents, out=spare[:written])
            self_kv, spare = spare, self_kv
    return search.finish(plan.num_return_sequences, device)


__all__ = ["ACCEPTED", "fast_generate", "supported_model"]
