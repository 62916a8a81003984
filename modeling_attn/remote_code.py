"""What `trust_remote_code` loading needs beyond transformers' defaults, for both model types."""

from __future__ import annotations

import inspect
import shutil
from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedConfig, PreTrainedModel

from .pipeline_translation import TranslationPipeline  # `from .x import` form: remote code copies it


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


def save_with_remote_code(
    model: PreTrainedModel,
    save_directory: str | Path,
    save: Callable[..., None],
    base_model_class: type,
    generation_class: type,
    **kwargs,
) -> None:
    """`save(save_directory, **kwargs)` (transformers' `save_pretrained`) with both heads in `auto_map` and the
    translation pipeline in `config.custom_pipelines`, its file copied beside the model code.

    transformers 5 refuses the task name "translation" unless the model's config lists a pipeline for it, so this is
    what makes `pipeline("translation", model=FOLDER, trust_remote_code=True)` work on every saved folder (not only
    on those `hub.save_for_hub` writes). The entry is the one `Pipeline.save_pretrained` writes for the registration
    in `modeling_attn/__init__.py`.
    """
    list_heads_in_auto_map(model.config, base_model_class, generation_class)
    model.config.custom_pipelines = {
        "translation": {
            "impl": f"{TranslationPipeline.__module__.rsplit('.', 1)[-1]}.{TranslationPipeline.__name__}",
            "pt": ["AutoModelForSeq2SeqLM"],
            "type": "text",
        }
    }
    save(save_directory, **kwargs)
    if Path(save_directory).is_dir() and kwargs.get("is_main_process", True):
        source = Path(inspect.getfile(TranslationPipeline))
        shutil.copyfile(source, Path(save_directory) / source.name)
