"""`attn export`: a saved model to CTranslate2 (`modeling_attn.api.export_ctranslate2`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..api.export_ctranslate2 import QUANTIZATIONS, MissingExtraError, export_ctranslate2, import_ctranslate2
from ..api.outputs import output_folder
from .parser import parse_command


@dataclass
class ExportArguments:
    """`attn export`: the flags."""

    ctranslate2: str = dataclasses.field(metadata={"help": "output folder of the CTranslate2 model", "metavar": "DIR"})
    model: str | None = dataclasses.field(
        default=None, metadata={"help": "an attn_transformer (or Marian) model folder"}
    )
    quantization: Literal[QUANTIZATIONS] = dataclasses.field(default="float32", metadata={"help": "weight type"})
    force: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "write into a folder that holds files this command did not write, replacing only the files it writes (nothing is deleted)"
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`attn export MODEL --ctranslate2 DIR` (or `--model MODEL`)."""
    args, parser = parse_command(ExportArguments, argv, "attn export", "Export a saved model to CTranslate2.", "model")
    try:
        import_ctranslate2()
    except MissingExtraError as error:
        parser.error(str(error))
    if not Path(args.model).is_dir():
        parser.error(f"{args.model}: no such model folder")
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"{args.model}: no config.json, not a saved model folder")
    try:
        with output_folder(
            args.ctranslate2, "attn export", {"--model": args.model}, args.force, "--ctranslate2"
        ) as staging:
            export_ctranslate2(args.model, staging, quantization=args.quantization, force=True)
    except ValueError as error:  # a model CTranslate2 cannot represent, or not a model folder we read
        parser.error(str(error).strip().splitlines()[0])
    except OSError as error:  # a folder without a readable config or weights
        parser.error(f"{args.model}: cannot load it ({str(error).strip().splitlines()[0]})")
    print(f"exported {args.model} to CTranslate2 ({args.quantization}) in {args.ctranslate2}")
    return 0
