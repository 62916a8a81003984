"""Named model presets (the JSON files of the repository's `configuration/` folder, shipped in the package).

>>> from modeling_attn.api.presets import load_preset
>>> config = load_preset("base", vocab_size=8000)   # the paper's base model, our vocabulary
"""

from __future__ import annotations

import json
from importlib import resources

from transformers import AutoConfig, PreTrainedConfig


def available_presets() -> list[str]:
    """Names of the model presets, e.g. ["base", "big", "small", "tiny"]."""
    return sorted(
        p.name.removesuffix(".json")
        for p in resources.files("modeling_attn.configuration").iterdir()
        if p.name.endswith(".json")
    )


def load_preset(name: str, **overrides) -> PreTrainedConfig:
    """The config of preset `name`, with `overrides` (e.g. vocab_size) applied on top."""
    path = resources.files("modeling_attn.configuration") / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r}; available presets: {available_presets()}")
    values = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    values.update(overrides)
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)
