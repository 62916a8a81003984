"""`attn average`: the average of the weights of checkpoints (paper, Sec. 6.1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..api.errors import FlagError
from ..api.outputs import output_folder
from ..api.values import COUNT
from .parser import parse_command
from .report import run_command


@dataclass
class AverageArguments:
    """`attn average`: the flags."""

    output_dir: str = field(metadata={"help": "where to save the averaged model"})
    inputs: list[str] = field(
        default_factory=list, metadata={"help": "checkpoint folders, or a training output folder (its checkpoint-*)"}
    )
    last: int = field(
        default=5,
        metadata={"help": "from a training output folder, average its last N checkpoints", "range": COUNT},
    )
    force: bool = field(
        default=False,
        metadata={
            "help": "write into a folder that holds files this command did not write, "
            "replacing only the files it writes (nothing is deleted)"
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`attn average FOLDER... --output_dir DIR [--last N]`."""
    return run_command("attn average", lambda: average(argv))


def average(argv: Sequence[str] | None) -> int:
    args = parse_command(
        AverageArguments,
        argv,
        "attn average",
        "Average the weights of checkpoints (paper, Sec. 6.1).",
        "inputs",
        "*",
    )
    from ..api.model_folder import check_config, check_folder
    from ..training.averaging import average_checkpoints, find_checkpoints

    checkpoints = []
    for path in args.inputs:
        check_folder(path)  # ModelFolderError: no such model folder (did you mean ...?), or a file
        found = find_checkpoints(path)
        checkpoints += found[-args.last :] if found else [Path(path)]  # a training folder: its last N checkpoints
    seen: dict[Path, Path] = {}
    for checkpoint in checkpoints:  # twice the same checkpoint would weigh it double
        if (resolved := Path(checkpoint).resolve()) in seen:
            raise FlagError(f"{checkpoint}: given twice (also as {seen[resolved]}); each checkpoint counts once")
        seen[resolved] = Path(checkpoint)
    if (Path(checkpoints[-1]) / "config.json").is_file():  # the config the average is saved with: named if invalid
        check_config(checkpoints[-1], local=True)  # (a folder with no weights at all is named so by the averaging)
    print(f"averaging {len(checkpoints)} checkpoints: {', '.join(map(str, checkpoints))}")
    inputs = {f"input checkpoint {number}": path for number, path in enumerate(checkpoints, 1)}
    sources = {f"input {number}": path for number, path in enumerate(args.inputs, 1)}  # what was asked for
    with output_folder(args.output_dir, "attn average", inputs, args.force, sources=sources) as staging:
        average_checkpoints(checkpoints, staging)  # ModelFolderError: not a checkpoint, a truncated file...
    print(f"saved the averaged model in {args.output_dir}")
    return 0
