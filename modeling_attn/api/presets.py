"""Named model presets (the JSON files of the repository's `configuration/` folder, shipped in the package).

>>> from modeling_attn.api.presets import load_preset
>>> config = load_preset("base", vocab_size=8000)   # the paper's base model, our vocabulary

Listing them reads file names only: `attn preset` answers without importing transformers or torch.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedConfig


def available_presets() -> list[str]:
    """Names of the model presets, e.g. ["base", "big", "small", "tiny"]."""
    return sorted(
        p.name.removesuffix(".json")
        for p in resources.files("modeling_attn.configuration").iterdir()
        if p.name.endswith(".json")
    )


def load_preset(name: str, **overrides) -> PreTrainedConfig:
    """The config of preset `name`, with `overrides` (e.g. vocab_size) applied on top."""
    from ..registry import model_type  # the config classes import transformers

    path = resources.files("modeling_attn.configuration") / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r}; available presets: {available_presets()}")
    values = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    values.update(overrides)
    return model_type(values.pop("model_type")).config_class(**values)
