"""Saving, for both model types: what `trust_remote_code` loading needs, and a save that is all or nothing.

transformers' `save_pretrained` writes the code files, then the config (validating it), then the weights, straight
into the target folder: a failure part-way leaves a folder that looks like a checkpoint and does not load.
`save_all_or_nothing` has it write into a staging folder beside the target and moves the files into place only when
every one was written; on any failure the staging folder is removed and the target is as it was.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import tempfile
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
    translation pipeline in `config.custom_pipelines`, its file copied beside the model code; all or nothing
    (`save_all_or_nothing`).

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
    if not kwargs.get("is_main_process", True):  # another process writes the files: nothing to stage
        save(save_directory, **kwargs)
        return
    if kwargs.get("push_to_hub"):  # transformers names the repository after the folder it writes into
        kwargs.setdefault("repo_id", Path(save_directory).name)

    def write(folder: Path) -> None:
        save(folder, **kwargs)
        source = Path(inspect.getfile(TranslationPipeline))
        shutil.copyfile(source, folder / source.name)

    save_all_or_nothing(save_directory, write, weights_prefix=_weights_prefix(kwargs.get("variant")))


def _weights_prefix(variant: str | None) -> str:
    return "model" if variant is None else f"model.{variant}"


# transformers' name for one shard of a sharded checkpoint, e.g. model-00001-of-00002.safetensors
SHARD_NAME = re.compile(r"(?P<prefix>.+?)-\d{5}-of-\d{5}\.safetensors")


def save_all_or_nothing(
    save_directory: str | Path, write: Callable[[Path], None], weights_prefix: str = "model"
) -> None:
    """`write(folder)` into a new staging folder beside `save_directory`, then move what it wrote into
    `save_directory` (created if missing; files of the same name replaced, others kept). If `write` raises, the
    staging folder and any parent folders made for it are removed, and `save_directory` is left as it was.

    As transformers' `save_pretrained`, shards of an earlier sharded save (`<weights_prefix>-0000i-of-0000n`) that this
    save did not write are removed from `save_directory`, so that the folder holds one checkpoint.
    """
    target = Path(save_directory)
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"save_pretrained: {target} is a file; it saves into a folder")
    made = next((folder for folder in reversed((target, *target.parents)) if not folder.exists()), None)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.saving-", dir=target.parent))
    try:
        write(staging)
        written = {entry.name for entry in staging.iterdir()}
        if not target.exists():
            os.replace(staging, target)  # one rename: the folder appears whole
            return
        _move_into(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if made is not None and made != target:
            shutil.rmtree(made, ignore_errors=True)  # parents that did not exist before this call
        raise
    staging.rmdir()
    for old in target.iterdir():
        match = SHARD_NAME.fullmatch(old.name)
        if match and match["prefix"] == weights_prefix and old.name not in written and old.is_file():
            old.unlink()


def _move_into(source: Path, target: Path) -> None:
    """Move every entry of `source` into the existing folder `target`, merging sub-folders."""
    for entry in source.iterdir():
        destination = target / entry.name
        if entry.is_dir() and destination.is_dir():
            _move_into(entry, destination)
            entry.rmdir()
        else:
            os.replace(entry, destination)
