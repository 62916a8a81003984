"""The `translation` pipeline of transformers 4, for any encoder-decoder model, in transformers 5, which removed it.

It serves ours, MarianMTModel and any `AutoModelForSeq2SeqLM`. After `import modeling_attn`,
`pipeline("translation", model=..., tokenizer=...)` and `pipeline("translation_en_to_de", ...)` build this pipeline
from model objects, a folder or a Hub id (`register_translation_pipeline`, called by the package's `__init__`). It
also travels with every checkpoint of ours (`remote_code.save_with_remote_code`), so
`pipeline("translation", model=FOLDER_OR_REPO, trust_remote_code=True)` builds it without this package installed.

Call and output are transformers 4's `TranslationPipeline` (docs/evaluate.md, "The translation pipeline"); deviation:
a config's `prefix` and `task_specific_params` are defaults of this pipeline's calls, not written into the config.
`register_translation_pipeline` is the one change to transformers that importing the package makes (docs/evaluate.md,
"What importing modeling_attn changes in transformers, exactly"); it raises ImportError naming what changed on a
transformers version where the tables it changes are not as expected.
"""

from __future__ import annotations

import re
from typing import Any

from transformers import AutoModelForSeq2SeqLM, Pipeline
from transformers.utils import logging

from .compat import generation_settings, pipeline_generate_kwargs, unremove_translation_task

logger = logging.get_logger(__name__)

# transformers 4's pattern for the task names that carry a language pair
TASK_WITH_LANGUAGES = re.compile(r"translation_(?P<src_lang>[^_]+)_to_(?P<tgt_lang>[^_]+)")


class TranslationPipeline(Pipeline):
    """Translate text with an encoder-decoder model and its tokenizer (see the module docstring)."""

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init_settings = generation_settings(kwargs)
        super().__init__(*args, **kwargs)
        task_params = dict(self._task_specific_params())
        self.prefix = task_params.pop("prefix", getattr(self, "prefix", None))  # the base class reads config.prefix
        # The entry's generation settings (T5: num_beams, max_length) are defaults under those of the call and init.
        self._generate_kwargs = {**task_params, **init_settings}

    def _task_specific_params(self) -> dict[str, Any]:
        """The model config's `task_specific_params` entry for this task (for "translation": the first
        `translation_*` entry, as transformers 4 picked), or {}."""
        params = getattr(self.model.config, "task_specific_params", None) or {}
        if self.task in params:
            return params[self.task]
        if self.task == "translation":
            return next((value for key, value in params.items() if key.startswith("translation_")), {})
        return {}

    def _sanitize_parameters(
        self,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        truncation: bool | str | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        return_tensors: bool | None = None,
        return_text: bool | None = None,
        stop_sequence: str | None = None,
        **generate_kwargs: Any,
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        preprocess = {} if truncation is None else {"truncation": truncation}
        if src_lang is None and tgt_lang is None and (match := TASK_WITH_LANGUAGES.fullmatch(self.task or "")):
            src_lang, tgt_lang = match["src_lang"], match["tgt_lang"]
        elif (src_lang is not None or tgt_lang is not None) and not self._takes_languages():
            logger.warning_once(
                f"translation pipeline: {type(self.tokenizer).__name__} takes no languages, "
                "src_lang / tgt_lang have no effect (a single-pair model)"
            )
        if self._takes_languages():
            preprocess.update({key: value for key, value in (("src_lang", src_lang), ("tgt_lang", tgt_lang)) if value})
        if stop_sequence is not None:
            stop_ids = self.tokenizer.encode(stop_sequence, add_special_tokens=False)
            if len(stop_ids) > 1:
                logger.warning_once("translation pipeline: stop_sequence stops on its first token only")
            generate_kwargs["eos_token_id"] = stop_ids[0]
        postprocess = {}
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        if return_tensors is not None:
            postprocess["return_tensors"] = return_tensors
        if return_text is not None:
            postprocess["return_text"] = return_text
        return preprocess, generate_kwargs, postprocess

    def _takes_languages(self) -> bool:
        return getattr(self.tokenizer, "_build_translation_inputs", None) is not None

    def __call__(self, inputs: Any, **kwargs: Any) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
        result = super().__call__(inputs, **kwargs)
        # As transformers 4's translation pipeline: a list of sentences with one translation each gives a flat list.
        if isinstance(inputs, list) and all(isinstance(item, list) and len(item) == 1 for item in result):
            return [item[0] for item in result]
        return result

    def preprocess(
        self, text: str, truncation: bool | str = False, src_lang: str | None = None, tgt_lang: str | None = None
    ) -> dict[str, Any]:
        if not isinstance(text, str):
            raise TypeError(f"translation pipeline: expected a string, got {type(text).__name__}")
        if self._takes_languages():  # sets the source language and returns the target's forced_bos_token_id
            encoded = self.tokenizer._build_translation_inputs(
                text, return_tensors="pt", truncation=truncation, src_lang=src_lang, tgt_lang=tgt_lang
            )
        else:
            encoded = self.tokenizer((self.prefix or "") + text, truncation=truncation, return_tensors="pt")
        encoded.pop("token_type_ids", None)  # tokenizers of encoder models return it; generate() takes none
        return dict(encoded)

    def _forward(self, model_inputs: dict[str, Any], **generate_kwargs: Any) -> dict[str, Any]:
        if generate_kwargs.get("return_dict_in_generate"):
            raise ValueError("translation pipeline: return_dict_in_generate is not supported; call model.generate")
        forced_bos = model_inputs.pop("forced_bos_token_id", None)  # a list of ints once batched: one language
        if forced_bos is not None:
            generate_kwargs["forced_bos_token_id"] = forced_bos[0] if isinstance(forced_bos, list) else forced_bos
        batch_size = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **pipeline_generate_kwargs(self, generate_kwargs))
        # (B * num_return_sequences, T) -> (B, num_return_sequences, T), so the pipeline unbatches per sentence
        return {"output_ids": output_ids.reshape(batch_size, -1, output_ids.shape[-1])}

    def postprocess(
        self,
        model_outputs: dict[str, Any],
        clean_up_tokenization_spaces: bool = False,
        return_tensors: bool = False,
        return_text: bool | None = None,
    ) -> list[dict[str, Any]]:
        text = not return_tensors if return_text is None else return_text  # transformers 4: tensors replace text
        if not (text or return_tensors):
            raise ValueError("translation pipeline: return_text=False and no return_tensors leaves nothing to return")
        records = []
        for ids in model_outputs["output_ids"][0]:
            record: dict[str, Any] = {"translation_token_ids": ids} if return_tensors else {}
            if text:
                record["translation_text"] = self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            records.append(record)
        return records


def register_translation_pipeline() -> None:
    """Make `pipeline("translation" | "translation_XX_to_YY", ...)` build `TranslationPipeline` (see the module
    docstring for exactly what changes in transformers). Idempotent. ImportError naming what changed if transformers'
    task tables are not those of a supported release (`compat.unremove_translation_task`)."""
    from transformers import __version__, pipelines

    where = f"transformers {__version__}: modeling_attn's translation pipeline registration"
    registry = getattr(pipelines, "PIPELINE_REGISTRY", None)
    if registry is None or not callable(getattr(registry, "check_task", None)):
        raise ImportError(f"{where} expects transformers.pipelines.PIPELINE_REGISTRY.check_task")
    ours = getattr(registry.check_task, "_translation_pairs", False)
    unremove_translation_task(pipelines, where, done_before=ours)
    if registry.supported_tasks.get("translation", {}).get("impl") is not TranslationPipeline:
        registry.register_pipeline(
            "translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
        )
    if not ours:
        registry.check_task = _check_task_with_pairs(registry.check_task)
    for task in ("translation", "translation_en_to_de"):  # what pipeline() will now find
        try:
            found = pipelines.check_task(task)[1]["impl"]
        except KeyError as error:
            raise ImportError(f"{where}: pipelines.check_task({task!r}) still fails: {error}") from None
        if found is not TranslationPipeline:
            raise ImportError(f"{where}: pipelines.check_task({task!r}) gives {found}, not TranslationPipeline")


def _check_task_with_pairs(check_task: Any) -> Any:
    """`PIPELINE_REGISTRY.check_task` that also resolves `translation_XX_to_YY` to "translation", returning the
    language pair as the task options (transformers 4's registry did so)."""

    def check_task_with_pairs(task: str) -> tuple[str, dict, Any]:
        if match := TASK_WITH_LANGUAGES.fullmatch(task):
            normalized, targeted, _ = check_task("translation")
            return normalized, targeted, (match["src_lang"], match["tgt_lang"])
        return check_task(task)

    check_task_with_pairs._translation_pairs = True
    check_task_with_pairs.__wrapped__ = check_task  # the registry's own method
    return check_task_with_pairs


__all__ = ["TranslationPipeline", "register_translation_pipeline"]
