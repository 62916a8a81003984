"""Config checks shared by both model types, so every bad value gets the same kind of message.

It also holds the part of the two configs that is the same (`EncoderDecoderConfigMixin`). Each check raises
`ValueError` naming the config class, the field and the value; the `@strict` config classes call them from their
`validate_*` methods, so an invalid config fails at construction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from transformers.utils import logging

logger = logging.get_logger(__name__)


def _fail(config: Any, field: str, requirement: str) -> None:
    raise ValueError(f"{type(config).__name__}.{field} {requirement}, got {getattr(config, field)!r}")


def check_positive(config: Any, fields: Iterable[str]) -> None:
    """Each field must be a positive integer."""
    for field in fields:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            _fail(config, field, "must be a positive integer")


def check_layer_counts(config: Any, fields: Iterable[str]) -> None:
    """Each field (`encoder_layers`, `decoder_layers`) must be a positive number of layers; 0 is named as zero layers,
    the mistake it usually is (a stack left out), not as a number out of range."""
    for field in fields:
        if getattr(config, field) == 0 and not isinstance(getattr(config, field), bool):
            stack = field.removesuffix("_layers")
            raise ValueError(
                f"{type(config).__name__}.{field}=0: zero {stack} layers; a model needs at least one {stack} layer "
                "(give 1 or more)"
            )
    check_positive(config, fields)


def check_probability(config: Any, fields: Iterable[str]) -> None:
    """Each field must be a dropout probability in [0, 1)."""
    for field in fields:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            _fail(config, field, "must be a probability in [0, 1)")


def check_choice(config: Any, field: str, choices: Iterable[str]) -> None:
    """The field must be one of `choices`."""
    choices = sorted(choices)
    if getattr(config, field) not in choices:
        _fail(config, field, f"must be one of {choices}")


def check_special_token_ids(config: Any, vocab_fields: dict[str, str]) -> None:
    """Each special-token field (key) must be None or an id inside the vocabulary named by its value."""
    for field, vocab_field in vocab_fields.items():
        token_ids = getattr(config, field)
        vocab_size = getattr(config, vocab_field)
        for token_id in token_ids if isinstance(token_ids, list) else [token_ids]:
            if token_id is not None and not 0 <= token_id < vocab_size:
                _fail(config, field, f"must be a token id in [0, {vocab_field}={vocab_size})")


class EncoderDecoderConfigMixin:
    """What both configs do alike: the target vocabulary defaults to the source one (`joint_vocabulary`), a shared
    embedding matrix needs one vocabulary, the special tokens must lie inside theirs; and `label_smoothing`, a
    training setting that older checkpoints saved in config.json, is dropped on loading (the loss takes it at call
    time)."""

    def __post_init__(self, **kwargs):
        label_smoothing = kwargs.pop("label_smoothing", None)
        if label_smoothing:
            logger.warning(
                f"{type(self).__name__}: ignoring label_smoothing={label_smoothing!r} (from an older config.json): "
                "label smoothing is a training setting; pass Trainer's label_smoothing_factor, or "
                "smoothing=... to the model's forward"
            )
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        if self.joint_vocabulary is None:  # one tokenizer's ids unless the sizes say two (older config.json too)
            self.joint_vocabulary = self.share_encoder_decoder_embeddings or self.decoder_vocab_size == self.vocab_size
        super().__post_init__(**kwargs)

    def validate_vocabularies(self):
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"{type(self).__name__}.decoder_vocab_size ({self.decoder_vocab_size}) must equal vocab_size "
                f"({self.vocab_size}) when share_encoder_decoder_embeddings=True; set it to False for separate "
                "source and target vocabularies"
            )
        if self.joint_vocabulary and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"{type(self).__name__}.joint_vocabulary=True (source and target ids are one tokenizer's) needs "
                f"decoder_vocab_size ({self.decoder_vocab_size}) to equal vocab_size ({self.vocab_size}); set it to "
                "False for two vocabularies"
            )
        if self.share_encoder_decoder_embeddings and not self.joint_vocabulary:
            raise ValueError(
                f"{type(self).__name__}.share_encoder_decoder_embeddings=True (one embedding matrix) needs one "
                "vocabulary: joint_vocabulary=False contradicts it"
            )
        check_special_token_ids(
            self,
            {
                "pad_token_id": "vocab_size",
                "bos_token_id": "decoder_vocab_size",
                "eos_token_id": "decoder_vocab_size",
                "decoder_start_token_id": "decoder_vocab_size",
            },
        )
