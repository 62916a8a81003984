"""What loading a checkpoint must refuse, for both model types (this file travels with the model code).

- Pickle weights: transformers 5 falls back to `pytorch_model.bin` when a folder or repository has no safetensors
  file. Unpickling runs code from the file, so our models load safetensors only unless the caller says
  `use_safetensors=False` (transformers' own flag) to allow a pickle checkpoint it trusts.
- Missing or unexpected weights: transformers starts weights missing from the checkpoint from random values and
  ignores weights the model does not have, and only logs it; ours raise unless `allow_missing_weights=True`.
- Another model type: transformers only logs a warning when a `config.json` of another model type is loaded into a
  config class, and then builds a config with the wrong fields. Ours raise instead, naming both types.
"""

from __future__ import annotations

import os


class ModelTypeGuard:
    """Config mixin: `from_pretrained` of a checkpoint whose config.json has another `model_type` raises."""

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> tuple[dict, dict]:
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        found = config_dict.get("model_type")
        if found is not None and found != cls.model_type:
            raise ValueError(
                f"{pretrained_model_name_or_path}: config.json has model_type {found!r}, but {cls.__name__} reads "
                f"{cls.model_type!r} checkpoints. Load it with its own class, or with AutoModelForSeq2SeqLM / "
                "AutoConfig, which pick the class from model_type."
            )
        return config_dict, kwargs


# Weights of the translation head (`*ForConditionalGeneration`) that its base model (`AutoModel`) does not have.
HEAD_ONLY_KEYS = ("lm_head.", "final_logits_bias")


class SafetensorsOnly:
    """Model mixin for `from_pretrained`: safetensors weights only, unless `use_safetensors=False` is given; and a
    checkpoint must hold exactly the model's weights, unless `allow_missing_weights=True` is given (transformers
    would start missing weights from random values and drop unexpected ones, with only a logged report)."""

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike | None,
        *model_args,
        allow_missing_weights: bool = False,
        **kwargs,
    ):
        wants_info = kwargs.pop("output_loading_info", False)
        pickle_allowed = kwargs.get("use_safetensors") is not None or kwargs.get("gguf_file") is not None
        if not pickle_allowed:
            kwargs["use_safetensors"] = True
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
            )
        except OSError as error:
            if pickle_allowed or "safetensors" not in str(error):
                raise
            raise OSError(
                f"{pretrained_model_name_or_path}: no safetensors weights (model.safetensors) found, and "
                f"{cls.__name__} does not fall back to pickle weights (pytorch_model.bin), because unpickling a "
                "file can run arbitrary code. If you trust this checkpoint, pass use_safetensors=False to "
                "from_pretrained, then save_pretrained it again to get safetensors."
            ) from error
        missing, unexpected = sorted(info.get("missing_keys", ())), sorted(info.get("unexpected_keys", ()))
        if not hasattr(model, "lm_head"):  # the base model of a translation checkpoint: leaving its head is the point
            unexpected = [key for key in unexpected if not key.startswith(HEAD_ONLY_KEYS)]
        if (missing or unexpected) and not allow_missing_weights:
            raise ValueError(
                f"{pretrained_model_name_or_path}: the checkpoint does not match {cls.__name__}: "
                f"{len(missing)} weight(s) missing {missing[:8]} (they would start from random values), "
                f"{len(unexpected)} unexpected {unexpected[:8]} (they would be ignored). Check the config "
                "(e.g. final_logits_bias, share_encoder_decoder_embeddings); pass allow_missing_weights=True to load "
                "it anyway."
            )
        return (model, info) if wants_info else model


__all__ = ["ModelTypeGuard", "SafetensorsOnly"]
