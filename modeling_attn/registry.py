"""The model types of the package, each declared once; everything else reads this table.

A model type is its config class, its base model and generation head classes, its default preset, and what
attention it returns. Auto registration (`modeling_attn/__init__.py`), the training recipe (model types, default
presets, config fields), the model card (the architecture's description and size), the translate command (which
pictures a model can have) and the common tests read `MODEL_TYPES`. Adding a model type: its
`configuration_*.py` and `modeling_*.py`, one `ModelType` below, a preset in configuration/, and its tests.

This module is not imported by the model files, so it does not travel to the Hub with a checkpoint (the remote code
registers the classes through `auto_map`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, PreTrainedConfig, PreTrainedModel

from .configuration_rnn import AttnRNNConfig
from .configuration_transformer import AttnTransformerConfig
from .modeling_rnn import AttnRNNForConditionalGeneration, AttnRNNModel
from .modeling_transformer import AttnTransformerForConditionalGeneration, AttnTransformerModel


@dataclass(frozen=True)
class ModelType:
    """One model type of the package.

    `per_head_attention`: its attention weights are per layer and head, `(B, H, T, S)`, and come only from the eager
    backend (`attn_implementation="eager"`), as transformers' own models; otherwise it returns one alignment per
    decoding step (the RNN's `α_ij`), from any backend. `self_attention`: it has encoder and decoder self-attention
    to show. `describe`: the architecture in one sentence (model card); `size`: a config's size in words.
    `onnx_refusal`: why the ONNX export does not take it yet (None: it does).
    """

    config_class: type[PreTrainedConfig]
    base_model_class: type[PreTrainedModel]
    generation_class: type[PreTrainedModel]
    default_preset: str
    per_head_attention: bool
    self_attention: bool
    describe: str
    size: Callable[[PreTrainedConfig], str]
    onnx_refusal: str | None = None

    @property
    def name(self) -> str:
        return self.config_class.model_type


def _transformer_size(config: AttnTransformerConfig) -> str:
    return (
        f"{config.encoder_layers} encoder and {config.decoder_layers} decoder layers, d_model {config.d_model}, "
        f"{config.num_heads} heads, d_ff {config.d_ff}, vocabulary {config.vocab_size}"
    )


def _rnn_size(config: AttnRNNConfig) -> str:
    return (
        f"{config.rnn_type.upper()} encoder ({config.encoder_layers} layers, {config.encoder_hidden_size} per "
        f"direction), {config.decoder_style} decoder ({config.decoder_hidden_size}), {config.attention_score} "
        f"attention, vocabulary {config.vocab_size}"
    )


MODEL_TYPES: dict[str, ModelType] = {
    entry.name: entry
    for entry in (
        ModelType(
            config_class=AttnTransformerConfig,
            base_model_class=AttnTransformerModel,
            generation_class=AttnTransformerForConditionalGeneration,
            default_preset="small",
            per_head_attention=True,
            self_attention=True,
            describe='the encoder-decoder Transformer of Vaswani et al. (2017), "Attention Is All You Need"',
            size=_transformer_size,
        ),
        ModelType(
            config_class=AttnRNNConfig,
            base_model_class=AttnRNNModel,
            generation_class=AttnRNNForConditionalGeneration,
            default_preset="rnn-small",
            per_head_attention=False,
            self_attention=False,
            describe="a bidirectional RNN encoder and an RNN decoder with attention (Bahdanau et al. 2015, "
            "Luong et al. 2015)",
            size=_rnn_size,
            onnx_refusal="torch.export stops at a data-dependent guard in its forward (the source lengths)",
        ),
    )
}


def model_type(name: str) -> ModelType:
    """The entry of `name`; ValueError naming the known types for another name."""
    if name not in MODEL_TYPES:
        raise ValueError(f"{name!r} is not a model type of modeling_attn (one of {', '.join(MODEL_TYPES)})")
    return MODEL_TYPES[name]


def register_with_transformers() -> None:
    """Register every model type with transformers' Auto classes, and for `save_pretrained`'s remote code (the code
    files copied beside the weights, `auto_map` in config.json)."""
    for entry in MODEL_TYPES.values():
        AutoConfig.register(entry.name, entry.config_class)
        AutoModel.register(entry.config_class, entry.base_model_class)
        AutoModelForSeq2SeqLM.register(entry.config_class, entry.generation_class)
        entry.config_class.register_for_auto_class()
        entry.base_model_class.register_for_auto_class("AutoModel")
        entry.generation_class.register_for_auto_class("AutoModelForSeq2SeqLM")


__all__ = ["MODEL_TYPES", "ModelType", "model_type", "register_with_transformers"]
