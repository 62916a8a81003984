"""What `trust_remote_code` loading needs beyond transformers' defaults, for both model types."""

from __future__ import annotations

from transformers import PreTrainedConfig


def list_heads_in_auto_map(config: PreTrainedConfig, base_model_class: type, generation_class: type) -> None:
    """Put both heads into `config.auto_map` before saving.

    `save_pretrained` writes only the class being saved into `auto_map`, so a checkpoint saved from the
    generation head could not be opened with `AutoModel` (and vice versa) on a machine without this package.
    """
    config.auto_map = {
        **(getattr(config, "auto_map", None) or {}),
        "AutoModel": f"{base_model_class.__module__.rsplit('.', 1)[-1]}.{base_model_class.__name__}",
        "AutoModelForSeq2SeqLM": f"{generation_class.__module__.rsplit('.', 1)[-1]}.{generation_class.__name__}",
    }
