"""`attn convert`: Marian (OPUS-MT) checkpoints to `attn_transformer` and back (`modeling_attn.api.convert_marian`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..api.outputs import output_folder
from .parser import parse_command
from .report import run_command


@dataclass
class ConvertArguments:
    """`attn convert`: the flags."""

    to: str = dataclasses.field(
        metadata={"help": "output folder (model, tokenizer, generation config)", "metavar": "DIR"}
    )
    from_marian: str | None = dataclasses.field(
        default=None, metadata={"help": "a MarianMTModel folder (or Hub id) to convert", "metavar": "SRC"}
    )
    to_marian: str | None = dataclasses.field(
        default=None, metadata={"help": "an attn_transformer folder to convert to Marian", "metavar": "SRC"}
    )
    force: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "write into a folder that holds files attn convert did not write, "
            "replacing only the files it writes (nothing is deleted)"
        },
    )

    def __post_init__(self):
        if (self.from_marian is None) == (self.to_marian is None):
            raise ValueError("give one of --from_marian SRC (Marian to attn_transformer) or --to_marian SRC (back)")


def main(argv: Sequence[str] | None = None) -> int:
    """`attn convert --from-marian SRC --to DIR` / `attn convert --to-marian SRC --to DIR`."""
    return run_command("attn convert", lambda: convert(argv))


def convert(argv: Sequence[str] | None) -> int:
    args = parse_command(
        ConvertArguments, argv, "attn convert", "Convert Marian (OPUS-MT) checkpoints to attn_transformer and back."
    )
    from ..api.convert_marian import convert_attn_folder, convert_marian_folder
    from ..api.model_folder import check_config, check_hub_reachable, looks_local

    source, flag = (
        (args.from_marian, "--from_marian") if args.from_marian is not None else (args.to_marian, "--to_marian")
    )
    if Path(source).exists() or looks_local(source):
        check_config(source, local=True)  # ModelFolderError naming the folder (did you mean ...?) and what is wrong
    else:  # a Hub id, fetched by the conversion: no Hub is one line at once, not half a minute of retries
        check_hub_reachable(source)
    inputs = {flag: source} if Path(source).exists() else {}
    with output_folder(args.to, "attn convert", inputs, args.force, "--to") as staging:
        if args.from_marian is not None:
            convert_marian_folder(args.from_marian, staging)
        else:
            convert_attn_folder(args.to_marian, staging)
    direction = "Marian model {} to attn_transformer" if args.from_marian else "attn_transformer model {} to Marian"
    print(f"converted {direction.format(source)} in {args.to}")
    return 0
