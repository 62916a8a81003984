"""`attn preset`: the model presets (configuration/*.json), listed or printed as a config JSON.

It loads no model: listing the presets, `--help` and a mistyped name answer without importing torch or transformers
(`CommandParser(models=False)`; only printing one builds its config class)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..api.errors import FlagError
from ..api.presets import available_presets, load_preset
from .parser import parse_command
from .report import run_command


@dataclass
class PresetArguments:
    """`attn preset`: the flags."""

    name: str | None = field(default=None, metadata={"help": "the preset to print as a config JSON (omit: list them)"})


def main(argv: Sequence[str] | None = None) -> int:
    """`attn preset [NAME]`: the presets, or one as a config JSON."""
    return run_command("attn preset", lambda: preset(argv))


def preset(argv: Sequence[str] | None) -> int:
    description = "List the model presets, or print one."
    args = parse_command(PresetArguments, argv, "attn preset", description, "name", required=False, models=False)
    name = args.name
    presets = available_presets()
    if name is None:
        print("\n".join(presets))
        return 0
    if name not in presets:
        near = difflib.get_close_matches(name, presets, n=1)
        raise FlagError(
            f"unknown preset {name!r}" + (f"; did you mean {near[0]!r}?" if near else f"; one of {presets}")
        )
    print(json.dumps(load_preset(name).to_diff_dict(), indent=2))
    return 0
