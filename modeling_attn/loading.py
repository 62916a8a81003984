"""What loading a checkpoint must refuse, for both model types (this file travels with the model code).

- Pickle weights: transformers 5 falls back to `pytorch_model.bin` when a folder or repository has no safetensors
  file. Unpickling runs code from the file, so our models load safetensors only unless the caller says
  `use_safetensors=False` (transformers' own flag) to allow a pickle checkpoint it trusts.
- Another model type: transformers only logs a warning when a `config.json` of another model type is loaded into a
  config class, and then builds a config with the wrong fields. Ours raise instead, naming both types.

`UserError`, the base of every error a person causes by what they ask, is defined here, in the bottom layer, so that
`WeightsError` (raised by the model code itself) can be one; `modeling_attn.api.errors` is its public home.

Weights missing from a checkpoint or unexpected in it are left to transformers, as for its built-in models: they are
initialised or ignored, and its load report (a logged table) names each one. Loading a base checkpoint into the
translation head, or the head's checkpoint into the base model, is a normal use of that.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from safetensors import SafetensorError

# transformers' messages for "this folder / repository has no safetensors weights at all" (modeling_utils, 5.23)
NO_SAFETENSORS = re.compile(
    r"no file named model\.safetensors found|does not appear to have a file named model\.safetensors"
)


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


class UserError(Exception):
    """Something asked for that cannot be done; the message names what is wrong and where, in one line."""


class WeightsError(UserError, OSError):
    """Weights that cannot be read: no safetensors file, or a corrupt or truncated one; the message names the file."""


def _weights_files(name_or_path: str | os.PathLike | None) -> str:
    """The safetensors file(s) of a local folder, for a message; the name itself for a Hub repository."""
    folder = Path(name_or_path or "")
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    return ", ".join(map(str, files)) or str(name_or_path)


class SafetensorsOnly:
    """Model mixin: `from_pretrained` reads safetensors weights only, unless `use_safetensors=False` is given."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike | None, *model_args, **kwargs):
        try:
            return cls._from_pretrained_safetensors(pretrained_model_name_or_path, *model_args, **kwargs)
        except SafetensorError as error:  # its own message names no file
            raise WeightsError(
                f"{_weights_files(pretrained_model_name_or_path)}: the safetensors weights are corrupt or truncated "
                f"({error})"
            ) from error
        except RuntimeError as error:  # "You set `ignore_mismatched_sizes` to `False`...": the names are in a log
            if "ignore_mismatched_sizes" not in str(error):
                raise
            loose = {**kwargs, "ignore_mismatched_sizes": True, "output_loading_info": True}
            _, report = cls._from_pretrained_safetensors(pretrained_model_name_or_path, *model_args, **loose)
            shown = [
                f"{name} is {list(stored)} in the weights, {list(expected)} by the config"
                for name, stored, expected in sorted(report.get("mismatched_keys", ()))[:2]
            ]
            raise WeightsError(
                f"{_weights_files(pretrained_model_name_or_path)}: the weights do not fit config.json ("
                f"{'; '.join(shown)}): a vocabulary or layer size in config.json that the weights do not have"
            ) from error

    @classmethod
    def _from_pretrained_safetensors(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        if kwargs.get("use_safetensors") is not None or kwargs.get("gguf_file") is not None:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, use_safetensors=True, **kwargs)
        except OSError as error:
            if not NO_SAFETENSORS.search(str(error)):  # e.g. a missing shard: transformers' own message is right
                raise
            raise WeightsError(
                f"{pretrained_model_name_or_path}: no safetensors weights (model.safetensors) found, and "
                f"{cls.__name__} does not fall back to pickle weights (pytorch_model.bin), because unpickling a "
                "file can run arbitrary code. If you trust this checkpoint, pass use_safetensors=False to "
                "from_pretrained, then save_pretrained it again to get safetensors."
            ) from error


__all__ = ["ModelTypeGuard", "SafetensorsOnly", "UserError", "WeightsError"]
