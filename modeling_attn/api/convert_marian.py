"""Conversion between Marian checkpoints (`MarianMTModel`, the OPUS-MT family) and `attn_transformer`.

transformers' `MarianMTModel` is the paper's post-LN Transformer with a few settings, each of which maps to a
documented field of `AttnTransformerConfig` (`positional_layout="halves"`, `scale_embedding`, the activation,
`final_logits_bias`, decoding from the pad token, separate vocabularies); word alignments get Marian's own default,
the first head of the last decoder layer. The weight names are the same on both sides (BART's naming), so the mapping
is the identity on every learned tensor; `marian_to_attn` checks that each Marian tensor is used and each of ours
is filled, and `attn_to_marian` permutes our default `positional_layout="interleaved"` into Marian's.

What cannot be reproduced raises `MarianConversionError` naming the field or architecture. `convert_marian_folder`
converts saved folders (`attn convert`), tokenizer and generation config included; a converted folder records its
source in `origin.json` (`hub.record_origin`). Each mapping, and the cases that need care: docs/interop.md, "Marian".
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, MarianConfig, MarianMTModel, PreTrainedModel

from ..configuration_transformer import AttnTransformerConfig
from ..generation import SOURCE_LIMIT_FIELD
from ..modeling_transformer import AttnTransformerForConditionalGeneration, sinusoid_table
from .errors import UserError
from .hub import record_origin

logger = logging.getLogger(__name__)

MARIAN_POSITION_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
MARIAN_LAYER_NORM_EPS = 1e-5  # MarianEncoderLayer / MarianDecoderLayer use nn.LayerNorm's default
# Marian's alignments: the last decoder layer (--transformer-guided-alignment-layer last), its first head
MARIAN_ALIGNMENT = {"alignment_layer": -1, "alignment_heads": 1}
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "source.spm", "vocab.json")
# The config fields that mean the same on both sides, read one way or the other by each conversion: our field ->
# Marian's (two where Marian has one per stack, which `_check_marian_config` requires to be equal).
SAME_FIELDS = {
    "vocab_size": ("vocab_size",),
    "decoder_vocab_size": ("decoder_vocab_size",),
    "d_model": ("d_model",),
    "encoder_layers": ("encoder_layers",),
    "decoder_layers": ("decoder_layers",),
    "num_heads": ("encoder_attention_heads", "decoder_attention_heads"),
    "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim"),
    "dropout": ("dropout",),
    "attention_dropout": ("attention_dropout",),
    "activation_dropout": ("activation_dropout",),
    "activation_function": ("activation_function",),
    "scale_embedding": ("scale_embedding",),
    "max_position_embeddings": ("max_position_embeddings",),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "use_cache": ("use_cache",),
    "pad_token_id": ("pad_token_id",),
    "bos_token_id": ("bos_token_id",),
    "eos_token_id": ("eos_token_id",),
    "decoder_start_token_id": ("decoder_start_token_id",),
}


class MarianConversionError(UserError, ValueError):
    """A checkpoint or config that the conversion cannot reproduce exactly."""


def _fail(requirement: str) -> None:
    raise MarianConversionError(requirement)


def _check_architecture(model: PreTrainedModel, expected: type, direction: str) -> None:
    if not isinstance(model, expected):
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        _fail(
            f"{direction} takes {expected.__name__} models, got {type(model).__name__} (model_type {model_type!r}); "
            "other architectures (BART, T5, ...) differ in layers, positions or normalisation and are not converted"
        )


def _check_marian_config(config: MarianConfig) -> None:
    pairs = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
    for encoder_field, decoder_field in pairs:
        if getattr(config, encoder_field) != getattr(config, decoder_field):
            _fail(
                f"MarianConfig.{encoder_field}={getattr(config, encoder_field)} differs from {decoder_field}="
                f"{getattr(config, decoder_field)}; attn_transformer uses one value for both stacks"
            )
    for field in ("encoder_layerdrop", "decoder_layerdrop"):
        if getattr(config, field):
            _fail(f"MarianConfig.{field}={getattr(config, field)}: attn_transformer has no LayerDrop")
    if config.share_encoder_decoder_embeddings and config.decoder_vocab_size != config.vocab_size:
        _fail(
            f"MarianConfig.decoder_vocab_size={config.decoder_vocab_size} differs from vocab_size={config.vocab_size} "
            "although share_encoder_decoder_embeddings=True"
        )
    if config.pad_token_id is None:
        _fail("MarianConfig.pad_token_id is None; Marian needs it (padding, and the decoder start token)")


def _check_marian_positions(model: MarianMTModel) -> None:
    """The Marian position tables are computed, not learned: they must be our 'halves' sinusoid."""
    config = model.config
    expected = sinusoid_table(config.max_position_embeddings, config.d_model, "halves")
    for name, stack in (("encoder", model.model.encoder), ("decoder", model.model.decoder)):
        table = stack.embed_positions.weight.detach().float().cpu()
        if table.shape != expected.shape or not torch.allclose(table, expected, rtol=0, atol=1e-6):
            _fail(f"model.{name}.embed_positions.weight is not the sin|cos sinusoid table that Marian computes")


def _shares_embeddings(model: MarianMTModel) -> bool:
    """Whether the encoder and decoder compute with one embedding matrix (see the module docstring, case 1)."""
    config = model.config
    if not config.share_encoder_decoder_embeddings:
        return False
    if config.tie_word_embeddings:
        return True
    return torch.equal(model.model.encoder.embed_tokens.weight, model.model.decoder.embed_tokens.weight)


def marian_config_to_attn(model: MarianMTModel) -> AttnTransformerConfig:
    """Our config for a Marian model (the model, not only its config: see the module docstring, case 1)."""
    config = model.config
    _check_marian_config(config)
    shared = _shares_embeddings(model)
    try:
        attn_config = AttnTransformerConfig(
            **{ours: getattr(config, theirs[0]) for ours, theirs in SAME_FIELDS.items()},
            norm_first=False,
            layer_norm_eps=MARIAN_LAYER_NORM_EPS,
            positional_layout="halves",
            share_encoder_decoder_embeddings=shared,
            final_logits_bias=True,
            **MARIAN_ALIGNMENT,
        )
    except ValueError as error:
        raise MarianConversionError(f"this Marian config has no attn_transformer counterpart: {error}") from error
    if config._attn_implementation in ("eager", "sdpa"):
        attn_config._attn_implementation = config._attn_implementation
    return attn_config


def marian_to_attn(model: MarianMTModel) -> AttnTransformerForConditionalGeneration:
    """An `attn_transformer` model computing what `model` computes (logits, generate), with its generation config."""
    _check_architecture(model, MarianMTModel, "marian_to_attn")
    config = marian_config_to_attn(model)
    _check_marian_positions(model)
    marian_state = model.state_dict()
    attn_model = AttnTransformerForConditionalGeneration(config).to(model.dtype)
    names = list(attn_model.state_dict())
    # Our model.shared is what Marian's encoder computes with (Marian's own `shared` may be unused, case 1).
    source = {name: "model.encoder.embed_tokens.weight" if name == "model.shared.weight" else name for name in names}
    missing = [marian_name for marian_name in source.values() if marian_name not in marian_state]
    if missing:
        _fail(f"the Marian state dict lacks {missing}")
    unused = set(marian_state) - set(source.values()) - set(MARIAN_POSITION_KEYS)
    if unused - {"model.shared.weight"}:
        _fail(f"Marian tensors without a counterpart in attn_transformer: {sorted(unused)}")
    if "model.shared.weight" in unused and not torch.equal(
        marian_state["model.shared.weight"], marian_state["model.encoder.embed_tokens.weight"]
    ):
        logger.warning(
            "model.shared.weight of this Marian model takes no part in its computation (share_encoder_decoder_"
            "embeddings=True with tie_word_embeddings=False) and differs from the embeddings used; it is not converted"
        )
    attn_model.load_state_dict({name: marian_state[source[name]] for name in names}, strict=True)
    attn_model.generation_config = copy.deepcopy(model.generation_config)
    return attn_model.train(model.training)


def _check_attn_config(config: AttnTransformerConfig) -> None:
    if config.norm_first:
        _fail("AttnTransformerConfig.norm_first=True (pre-LN): Marian is post-LN only")
    if config.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
        _fail(f"AttnTransformerConfig.layer_norm_eps={config.layer_norm_eps}: Marian's LayerNorms use 1e-5")
    if config.decoder_start_token_id is None:
        _fail("AttnTransformerConfig.decoder_start_token_id is None: MarianConfig requires one")


def attn_config_to_marian(config: AttnTransformerConfig) -> MarianConfig:
    """The Marian config of a model with this config (the positional layout is handled on the weights)."""
    _check_attn_config(config)
    marian_config = MarianConfig(
        **{name: getattr(config, ours) for ours, theirs in SAME_FIELDS.items() for name in theirs},
        share_encoder_decoder_embeddings=config.share_encoder_decoder_embeddings,
        forced_eos_token_id=None,  # MarianConfig defaults to 0; the generation config is carried over instead
    )
    if config._attn_implementation in ("eager", "sdpa"):
        marian_config._attn_implementation = config._attn_implementation
    return marian_config


def interleaved_to_halves(state: dict[str, torch.Tensor], d_model: int) -> dict[str, torch.Tensor]:
    """Permute the model dimension of a state dict from the 'interleaved' to the 'halves' positional layout.

    Dimension j of the new residual stream is dimension perm[j] of the old one, so that the old encoding of
    Sec. 3.5 (sin on 2i, cos on 2i+1) becomes [sin | cos]. Tensors reading the stream (embeddings, q/k/v and
    first feed-forward weights, the output projection) permute their d_model columns, tensors writing it
    (attention output and second feed-forward weights and biases) their rows; LayerNorm is permutation-equivariant.
    """
    perm = torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])
    readers = ("embed_tokens", "shared", "lm_head", "q_proj", "k_proj", "v_proj", "fc1")
    permuted = {}
    for name, tensor in state.items():
        module, kind = name.split(".")[-2:] if "." in name else (name, "")
        if module in readers and kind == "weight":
            tensor = tensor[:, perm]
        elif module in ("out_proj", "fc2") or module.endswith("layer_norm"):
            tensor = tensor[perm]
        elif module not in readers and name != "final_logits_bias":  # reader biases live in their own space
            _fail(f"interleaved_to_halves does not know how {name} reads or writes the model dimension")
        permuted[name] = tensor
    return permuted


def attn_to_marian(model: AttnTransformerForConditionalGeneration) -> MarianMTModel:
    """A `MarianMTModel` computing what `model` computes, with its generation config (see the module docstring)."""
    _check_architecture(model, AttnTransformerForConditionalGeneration, "attn_to_marian")
    config = model.config
    marian = MarianMTModel(attn_config_to_marian(config)).to(model.dtype)
    state = model.state_dict()
    if config.positional_layout == "interleaved":
        state = interleaved_to_halves(state, config.d_model)
    if model.final_logits_bias is None:  # ours adds nothing; Marian adds its buffer, which must then be zero
        state["final_logits_bias"] = torch.zeros_like(marian.final_logits_bias)
    marian_state = marian.state_dict()
    unknown = set(state) - set(marian_state)
    if unknown:
        _fail(f"attn_transformer tensors without a Marian counterpart: {sorted(unknown)}")
    missing = set(marian_state) - set(state) - set(MARIAN_POSITION_KEYS)
    if missing:
        _fail(f"Marian tensors that attn_transformer does not provide: {sorted(missing)}")
    marian.load_state_dict(state, strict=False)  # the position tables keep the values Marian computed
    _check_marian_positions(marian)
    generation_config = copy.deepcopy(model.generation_config)
    if getattr(generation_config, SOURCE_LIMIT_FIELD, None) is not None:
        logger.warning(
            f"generation_config.{SOURCE_LIMIT_FIELD}={getattr(generation_config, SOURCE_LIMIT_FIELD)} (output "
            "length limit per source sentence) has no MarianMTModel counterpart and is dropped; "
            f"max_length={generation_config.max_length} applies"
        )
        delattr(generation_config, SOURCE_LIMIT_FIELD)
    marian.generation_config = generation_config
    return marian.train(model.training)


def _model_type(path: str | Path) -> str:
    try:
        return AutoConfig.from_pretrained(path).model_type
    except ValueError as error:  # a model_type transformers does not know
        raise MarianConversionError(f"{path}: cannot read its config: {error}") from error


def _copy_tokenizer(source: str | Path, output_dir: str | Path) -> bool:
    """Save the tokenizer of `source` (if it has one) in `output_dir` unchanged; return whether there was one."""
    if Path(source).is_dir() and not any((Path(source) / name).exists() for name in TOKENIZER_FILES):
        logger.warning(f"{source} holds no tokenizer; {output_dir} gets the model only")
        return False
    AutoTokenizer.from_pretrained(source).save_pretrained(output_dir)
    return True


def convert_marian_folder(source: str | Path, output_dir: str | Path) -> AttnTransformerForConditionalGeneration:
    """Convert a saved Marian model (folder or Hub id) into an `attn_transformer` folder, tokenizer included."""
    model_type = _model_type(source)
    if model_type != "marian":
        _fail(f"{source} holds a {model_type!r} model, not a Marian one (model_type 'marian')")
    attn_model = marian_to_attn(MarianMTModel.from_pretrained(source))
    attn_model.save_pretrained(output_dir)
    _copy_tokenizer(source, output_dir)
    record_origin(output_dir, source, "converted from the Marian model")  # the card's base_model (`attn push`)
    return attn_model


def convert_attn_folder(source: str | Path, output_dir: str | Path) -> MarianMTModel:
    """Convert a saved `attn_transformer` model into a Marian folder, tokenizer included."""
    model_type = _model_type(source)
    if model_type != AttnTransformerConfig.model_type:
        _fail(f"{source} holds a {model_type!r} model, not an {AttnTransformerConfig.model_type!r} one")
    marian = attn_to_marian(AttnTransformerForConditionalGeneration.from_pretrained(source))
    marian.save_pretrained(output_dir)
    _copy_tokenizer(source, output_dir)
    return marian


__all__ = [
    "MarianConversionError",
    "attn_config_to_marian",
    "attn_to_marian",
    "convert_attn_folder",
    "convert_marian_folder",
    "interleaved_to_halves",
    "marian_config_to_attn",
    "marian_to_attn",
]
