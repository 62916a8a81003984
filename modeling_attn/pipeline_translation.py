"""`pipeline("translation", model=..., trust_remote_code=True)` for both model types.

transformers 5 removed its translation pipeline and refuses the task name unless the model's config lists a
pipeline for it. So this one travels with every checkpoint: the models' `save_pretrained`
(`remote_code.save_with_remote_code`; `hub.save_for_hub` and `attn train` use it) writes
`config.custom_pipelines["translation"]` and copies this file beside the model code, and
`pipeline("translation", model=FOLDER_OR_REPO, trust_remote_code=True)` builds it from there, with or without this
package installed. It is also registered with `PIPELINE_REGISTRY` when `modeling_attn` is imported.

Input: a sentence, a list of sentences, or any iterable or dataset of sentences, as for every pipeline. Output, as
transformers 4's pipeline: `[{"translation_text": ...}]` for a sentence (one dict per returned sequence with
`num_return_sequences`), a flat list of such dicts for a list of sentences with one translation each, and one list
per sentence otherwise. Generation settings come from the
model's `generation_config` (beam size, length penalty, the per-sentence maximum length) unless given in the call;
`batch_size=N` translates N sentences per `generate()` call.
"""

from __future__ import annotations

from typing import Any

from transformers import Pipeline


class TranslationPipeline(Pipeline):
    """Translate text with an encoder-decoder model and its tokenizer (see the module docstring)."""

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(
        self, truncation: bool | None = None, clean_up_tokenization_spaces=None, **generate_kwargs
    ):
        preprocess = {} if truncation is None else {"truncation": truncation}
        postprocess = {}
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess, generate_kwargs, postprocess

    def __call__(self, inputs: Any, **kwargs: Any) -> list[dict[str, str]] | list[list[dict[str, str]]]:
        result = super().__call__(inputs, **kwargs)
        # As transformers 4's translation pipeline: a list of sentences with one translation each gives a flat list.
        if isinstance(inputs, list) and all(isinstance(item, list) and len(item) == 1 for item in result):
            return [item[0] for item in result]
        return result

    def preprocess(self, text: str, truncation: bool = False) -> dict[str, Any]:
        if not isinstance(text, str):
            raise TypeError(f"translation pipeline: expected a string, got {type(text).__name__}")
        return self.tokenizer(text, truncation=truncation, return_tensors="pt")

    def _forward(self, model_inputs: dict[str, Any], **generate_kwargs: Any) -> dict[str, Any]:
        if generate_kwargs.get("return_dict_in_generate"):
            raise ValueError("translation pipeline: return_dict_in_generate is not supported; call model.generate")
        batch_size = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **self._prepare_generate_kwargs(generate_kwargs))
        # (B * num_return_sequences, T) -> (B, num_return_sequences, T), so the pipeline unbatches per sentence
        return {"output_ids": output_ids.reshape(batch_size, -1, output_ids.shape[-1])}

    def postprocess(self, model_outputs: dict[str, Any], clean_up_tokenization_spaces: bool = False):
        return [
            {
                "translation_text": self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for ids in model_outputs["output_ids"][0]
        ]


__all__ = ["TranslationPipeline"]
