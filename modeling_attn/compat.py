"""Every difference between the supported transformers releases (5.4 to 5.x, pyproject.toml) the model code meets.

Each shim names the releases it covers; nothing else in the package asks which transformers is installed. This file
travels with a checkpoint, so the remote code of a saved model runs on whatever supported release the user has.

- 5.24 renamed the cache argument and output field `past_key_values` to `cache` (the old name only warns):
  `CACHE_FIELD`, `MASK_CACHE_ARGUMENT`, `cache_argument`, `with_cache`.
- 5.23 removed the task "translation" into `pipelines.REMOVED_TASKS` and moved a pipeline's generation settings from
  its `generation_config` to `_generate_kwargs` / `_prepare_generate_kwargs`: `unremove_translation_task`,
  `generation_settings`, `pipeline_generate_kwargs`.
- 5.4-5.10 copy out of a local folder only the files a remote-code module imports itself, not what those import in
  turn: modeling_rnn.py and modeling_transformer.py import every file they need directly (tests/test_compat.py).
Releases before 5.4 are not supported: their `PreTrainedConfig` is not a dataclass, so the typed `@strict` configs
cannot be built on it (docs/testing.md, "transformers versions").
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from transformers import GenerationConfig
from transformers.cache_utils import Cache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import ModelOutput, Seq2SeqLMOutput

# -- 5.24: the cache's name ----------------------------------------------------------------------------------------

# the output field (and forward argument) of the decoder cache: `cache` from 5.24, `past_key_values` before
CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"
# create_causal_mask's name for the cache: `cache` from 5.24, `past_key_values` before
MASK_CACHE_ARGUMENT = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def cache_argument(past_key_values: Cache | None, cache: Cache | None) -> Cache | None:
    """The decoder cache, given under its transformers < 5.24 name `past_key_values` or its 5.24 name `cache`."""
    if past_key_values is not None and cache is not None:
        raise ValueError("pass the decoder cache once, as cache or as past_key_values (its name before 5.24)")
    if past_key_values is not None and CACHE_FIELD == "cache":  # as transformers' own models warn from 5.24
        warnings.warn(
            "`past_key_values` is deprecated: pass the decoder cache as `cache`", FutureWarning, stacklevel=3
        )
    return cache if cache is not None else past_key_values


def with_cache(output_class: type, cache: Cache | None, **fields) -> ModelOutput:
    """`output_class(**fields)` with the cache in the installed transformers' field (`CACHE_FIELD`)."""
    return output_class(**fields, **{CACHE_FIELD: cache})


# -- 5.23: the translation task and a pipeline's generation settings ------------------------------------------------


def unremove_translation_task(pipelines: Any, where: str, done_before: bool) -> None:
    """Take "translation" out of `pipelines.REMOVED_TASKS` (5.23 on, where `pipeline()` refuses a removed task before
    looking at the registry; `done_before`: an earlier call took it out). Before 5.23 the task is simply unknown, and
    registering it is enough. ImportError naming what is unexpected otherwise."""
    if not hasattr(pipelines, "REMOVED_TASKS"):  # 5.4-5.22
        if "translation" in getattr(pipelines, "SUPPORTED_TASKS", {}) and not done_before:
            raise ImportError(f"{where} expects no translation task in transformers.pipelines.SUPPORTED_TASKS")
        return
    removed = pipelines.REMOVED_TASKS
    if not isinstance(removed, dict) or not callable(getattr(pipelines, "_resolve_deprecated_task", None)):
        raise ImportError(f"{where} expects transformers.pipelines.REMOVED_TASKS and _resolve_deprecated_task")
    if "translation" in removed:
        removed.pop("translation")
    elif not done_before:  # a native translation task again, or the table was reorganised
        raise ImportError(f"{where} expects 'translation' in transformers.pipelines.REMOVED_TASKS; it is not there")


def generation_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The generation settings among a pipeline's init `kwargs` (a copy; `kwargs` is unchanged): what 5.23 on keeps
    in `Pipeline._generate_kwargs`, and 5.4-5.22 fold into the pipeline's `generation_config`."""
    keys = {key for key in vars(GenerationConfig()) if not key.startswith("_")} | {"generation_config"}
    return {key: value for key, value in kwargs.items() if key in keys}


def pipeline_generate_kwargs(pipeline: Any, generate_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The `generate()` arguments of one pipeline call: the call's settings over the pipeline's `_generate_kwargs`
    (its init settings), unless the call passes a `generation_config`, which replaces them; and the tokenizer's pad
    token when no generation config names one.

    5.23 on: `Pipeline._prepare_generate_kwargs`, which does this and adds the pipeline's defaults. 5.4-5.22: the
    same, written here (their pipelines pass a whole `generation_config`, which `generate()` takes as setting both
    `max_length` and `max_new_tokens`, and warns)."""
    if hasattr(pipeline, "_prepare_generate_kwargs"):
        return pipeline._prepare_generate_kwargs(generate_kwargs)
    if "generation_config" not in generate_kwargs:
        generate_kwargs = {**pipeline._generate_kwargs, **generate_kwargs}
    config = generate_kwargs.get("generation_config") or pipeline.model.generation_config
    pad_token_id = getattr(pipeline.tokenizer, "pad_token_id", None)
    if pad_token_id is not None and config.pad_token_id is None and "pad_token_id" not in generate_kwargs:
        generate_kwargs = {**generate_kwargs, "pad_token_id": pad_token_id}
    return generate_kwargs


__all__ = [
    "CACHE_FIELD",
    "MASK_CACHE_ARGUMENT",
    "cache_argument",
    "generation_settings",
    "pipeline_generate_kwargs",
    "unremove_translation_task",
    "with_cache",
]
