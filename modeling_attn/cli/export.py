"""`attn export`: a saved model to CTranslate2 (`modeling_attn.api.export_ctranslate2`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..api.choices import QUANTIZATIONS
from ..api.outputs import output_folder
from .parser import parse_command
from .report import run_command


@dataclass
class ExportArguments:
    """`attn export`: the flags."""

    model: str | None = dataclasses.field(
        default=None, metadata={"help": "an attn_transformer (or Marian) model folder"}
    )
    ctranslate2: str | None = dataclasses.field(
        default=None, metadata={"help": "output folder of a CTranslate2 model", "metavar": "DIR"}
    )
    onnx: str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "output folder of ONNX encoder and decoder-with-past graphs (the onnx extra; docs/export.md)",
            "metavar": "DIR",
        },
    )
    quantization: Literal[QUANTIZATIONS] = dataclasses.field(
        default="float32", metadata={"help": "weight type (--ctranslate2)"}
    )
    force: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "write into a folder that holds files this command did not write, replacing only the files "
            "it writes (nothing is deleted)"
        },
    )

    def __post_init__(self) -> None:
        if (self.ctranslate2 is None) == (self.onnx is None):
            raise ValueError("give one of --ctranslate2 DIR or --onnx DIR")


def _export(args) -> str:
    """Write the export into a staging folder that replaces only its own files at the target (api/outputs.py)."""
    from ..api.export_ctranslate2 import export_ctranslate2
    from ..api.export_onnx import export_onnx_model, load_exported

    target, flag = (args.ctranslate2, "--ctranslate2") if args.ctranslate2 else (args.onnx, "--onnx")
    with output_folder(target, "attn export", {"--model": args.model}, args.force, flag) as staging:
        if args.ctranslate2:
            export_ctranslate2(args.model, staging, quantization=args.quantization, force=True)
        else:
            model, tokenizer = load_exported(args.model)
            export_onnx_model(model, staging, tokenizer)
    return f"CTranslate2 ({args.quantization})" if args.ctranslate2 else "ONNX"


def main(argv: Sequence[str] | None = None) -> int:
    """`attn export MODEL --ctranslate2 DIR` or `--onnx DIR` (or `--model MODEL`)."""
    return run_command("attn export", lambda: export(argv))


def export(argv: Sequence[str] | None) -> int:
    args = parse_command(ExportArguments, argv, "attn export", "Export a saved model to CTranslate2 or ONNX.", "model")
    from ..api.export_ctranslate2 import import_ctranslate2
    from ..api.export_onnx import import_onnxruntime
    from ..api.model_folder import check_config

    check_config(args.model, local=True)  # ModelFolderError naming the folder (did you mean ...?) and what is wrong
    import_ctranslate2() if args.ctranslate2 else import_onnxruntime()  # a UserError naming the missing extra
    kind = _export(args)
    print(f"exported {args.model} to {kind} in {args.ctranslate2 or args.onnx}")
    return 0
