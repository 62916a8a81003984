"""What a loaded model is, as `attn serve`'s `GET /model` answers it: `describe_model` (and `alignment_setting`).

The same words as the model card (`hub.model_card`: `describe_size`, `describe_generation`, `describe_alignments`),
with the languages and scores of the folder's `test_results.json`, the model it was made from (`origin.json`), an
ensemble's members, the quantization and the device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from ..registry import MODEL_TYPES
from .ensemble import AttnEnsemble, describe_ensemble
from .hub import (
    RESULTS_FILE,
    decoding_settings,
    describe_alignments,
    describe_generation,
    describe_size,
    model_origin,
    read_results,
)


def describe_model(model: PreTrainedModel, model_dir: str | Path, quantization: str | None = None) -> dict[str, Any]:
    """What the model card says of `model` (loaded from `model_dir`, before any quantization: the parameter count
    is the float model's), with the languages and scores of the folder's `test_results.json` when it has one."""
    folder = Path(model_dir)
    ensemble = describe_ensemble(model) if isinstance(model, AttnEnsemble) else None
    # an ensemble's scores are not those of the folder's model
    results = read_results(folder / RESULTS_FILE) if (folder / RESULTS_FILE).is_file() and not ensemble else None
    _, origin = model_origin(folder) if folder.is_dir() else (None, None)
    languages = None
    if results and results.get("source_lang") and results.get("target_lang"):
        languages = {"source": results["source_lang"], "target": results["target_lang"]}
    scores = None
    if results:
        scores = {name: results.get(name) for name in ("bleu", "chrf", "bleu_signature", "data", "split", "sentences")}
    model_type = model.config.model_type
    return {
        "model": str(model_dir),
        "model_type": model_type,
        "architecture": MODEL_TYPES[model_type].describe if model_type in MODEL_TYPES else None,
        "parameters": model.num_parameters(),
        "size": describe_size(model),
        "languages": languages,
        "results": scores,
        "decoding": describe_generation(model.generation_config),
        "generation": decoding_settings(model.generation_config),
        "max_position_embeddings": getattr(model.config, "max_position_embeddings", None),
        "alignment": alignment_setting(model),
        "origin": origin,
        "ensemble": ensemble,
        "quantization": quantization,
        "device": str(model.device),
    }


def alignment_setting(model: PreTrainedModel) -> dict[str, Any] | None:
    """Where `"alignment"` reads word alignments from (`encoder_decoder.alignment_attention`): the Transformer's
    `alignment_layer` and `alignment_heads` (as in config.json; 0 heads: all), the RNN's alpha; None for a model type
    this project does not know. An ensemble: the average of its members' (`alignment.forced_attention`), each
    member's setting listed with its weight."""
    if isinstance(model, AttnEnsemble):
        return {
            "attention": "the members' alignment attention averaged with the ensemble's weights",
            "members": [
                {**(alignment_setting(member) or {}), "weight": round(weight, 6)}
                for member, weight in zip(model.members, model.weights, strict=True)
            ],
        }
    config = model.config
    if config.model_type not in MODEL_TYPES:
        return None
    setting: dict[str, Any] = {"attention": describe_alignments(config)}
    if hasattr(config, "alignment_layer"):
        setting.update(alignment_layer=config.alignment_layer, alignment_heads=config.alignment_heads)
    return setting


__all__ = ["alignment_setting", "describe_model"]
