"""The `attn` command line: one dispatcher for every subcommand, and the subcommands small enough to live here.

`attn COMMAND ...` hands the rest of the line to the command's own parser. Every command follows the one convention
of `training/arguments.py` (`CommandParser`, an `HfArgumentParser` of dataclasses): `--a_b` and `--a-b` alike, a flags
file as first argument (`attn COMMAND flags.yaml|.json`), defaults in `--help`, and a user error as one line on stderr
with exit status 2 (an unknown flag names the closest valid one).

- `attn train` (the training recipe, `training/train.py`), `attn translate` / `attn evaluate` (`translate.py`),
  `attn push` (`push.py`), `attn convert` (`convert_marian.py`), `attn export` (`export_ctranslate2.py`),
  `attn explain` (`explain.py`);
- `attn average` (checkpoint averaging, paper Sec. 6.1) and `attn preset` (model presets) are defined here.

`parse_command` adds what `CommandParser` leaves out: a positional argument that stands for one of the flags
(`attn export MODEL` = `attn export --model MODEL`, `attn average FOLDER...`, `attn preset NAME`).
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from training.arguments import CommandParser

from .. import __version__
from ..presets import available_presets, load_preset

PROG = "attn"

# name: (what it does, for `attn --help`)
COMMANDS = {
    "train": "train or fine-tune a translation model (the paper's recipe; every Seq2SeqTrainingArguments flag)",
    "average": "average the weights of the last checkpoints of a training run (paper, Sec. 6.1)",
    "translate": "translate sentences (arguments, --input FILE or stdin); attention pictures",
    "evaluate": "BLEU, chrF and TER (sacreBLEU) of a model on a data split, or of a file of translations, as JSON",
    "push": "upload a trained model (weights, code, tokenizer, generation config, card) to the Hugging Face Hub",
    "convert": "convert Marian (OPUS-MT) checkpoints to attn_transformer and back",
    "export": "export a model to CTranslate2",
    "explain": "write an interactive page (one offline HTML file) of how a model translates a sentence",
    "preset": "list the model presets, or print one as a config JSON",
}


def command_error(prog: str, message: str) -> NoReturn:
    """A user error outside a parser (a missing folder, a failed load): one line on stderr, exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_command(
    arguments: type,
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    positional: str | None = None,
    nargs: str = "?",
    required: bool = True,
) -> tuple[Any, CommandParser]:
    """The `arguments` dataclass filled from `argv` by `CommandParser`, and the parser (for its `error`).

    `positional`: a field that may also be given without its flag, as the command's first argument(s); it must
    default to None (nargs "?") or an empty list (nargs "*"), and is `required` one way or the other.
    """
    parser = CommandParser(arguments, prog=prog, description=description)
    if positional is not None:
        metavar = positional.upper()
        parser.add_argument(
            f"{positional}_positional", nargs=nargs, metavar=metavar, help=f"the same as --{positional}"
        )
    parsed = parser.parse(argv)
    args = parsed[0]
    if positional is not None:
        given = getattr(parsed[1], f"{positional}_positional")
        if given and getattr(args, positional):
            parser.error(f"{positional.upper()} given twice: as an argument ({given}) and as --{positional}")
        if given:
            setattr(args, positional, given)
        if required and not getattr(args, positional):
            parser.error(f"the following arguments are required: {positional.upper()} (or --{positional})")
    return args, parser


@dataclass
class AverageArguments:
    """`attn average`: the flags."""

    output_dir: str = field(metadata={"help": "where to save the averaged model"})
    inputs: list[str] = field(
        default_factory=list, metadata={"help": "checkpoint folders, or a training output folder (its checkpoint-*)"}
    )
    last: int = field(default=5, metadata={"help": "from a training output folder, average its last N checkpoints"})

    def __post_init__(self):
        if self.last < 1:
            raise ValueError(f"argument --last: must be a positive integer, got {self.last}")


def average_main(argv: Sequence[str] | None = None) -> int:
    """`attn average FOLDER... --output_dir DIR [--last N]`."""
    from training.averaging import average_checkpoints, find_checkpoints

    args, parser = parse_command(
        AverageArguments,
        argv,
        f"{PROG} average",
        "Average the weights of checkpoints (paper, Sec. 6.1).",
        "inputs",
        "*",
    )
    checkpoints = []
    for path in args.inputs:
        if not Path(path).is_dir():
            parser.error(f"{path}: no such folder")
        found = find_checkpoints(path)
        checkpoints += found[-args.last :] if found else [Path(path)]  # a training folder: its last N checkpoints
    print(f"averaging {len(checkpoints)} checkpoints: {', '.join(map(str, checkpoints))}")
    try:
        average_checkpoints(checkpoints, args.output_dir)
    except (OSError, ValueError) as error:  # not a checkpoint, a truncated file, checkpoints of different models
        parser.error(str(error).splitlines()[0])
    print(f"saved the averaged model in {args.output_dir}")
    return 0


@dataclass
class PresetArguments:
    """`attn preset`: the flags."""

    name: str | None = field(default=None, metadata={"help": "the preset to print as a config JSON (omit: list them)"})


def preset_main(argv: Sequence[str] | None = None) -> int:
    """`attn preset [NAME]`: the presets, or one as a config JSON."""
    args, parser = parse_command(
        PresetArguments, argv, f"{PROG} preset", "List the model presets, or print one.", "name", required=False
    )
    name = args.name
    presets = available_presets()
    if name is None:
        print("\n".join(presets))
        return 0
    if name not in presets:
        near = difflib.get_close_matches(name, presets, n=1)
        parser.error(f"unknown preset {name!r}" + (f"; did you mean {near[0]!r}?" if near else f"; one of {presets}"))
    print(json.dumps(load_preset(name).to_diff_dict(), indent=2))
    return 0


def _command(name: str) -> Callable[[list[str]], int]:
    """The main function of a subcommand, imported only when it runs (train imports the whole recipe)."""
    if name == "train":
        from training.train import cli_main

        return cli_main
    if name in ("translate", "evaluate"):
        from .evaluate import evaluate_main
        from .translate import translate_main

        return translate_main if name == "translate" else evaluate_main
    if name == "push":
        from .push import push_main

        return push_main
    if name == "convert":
        from .convert_marian import main as convert_main

        return convert_main
    if name == "export":
        from .export_ctranslate2 import main as export_main

        return export_main
    if name == "explain":
        from .explain import explain_main

        return explain_main
    return {"average": average_main, "preset": preset_main}[name]


def usage() -> str:
    """What `attn --help` prints: the commands, one a line."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [flags]   ({PROG} COMMAND --help for a command's flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    lines += ["", "options:", "  -h, --help     this list", "  -V, --version  the version of modeling-attn"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The `attn` entry point: `attn COMMAND [flags]` (exit status 2 for a user error, as argparse)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(usage(), file=sys.stderr)
        raise SystemExit(2)
    command, rest = argv[0], argv[1:]
    if command in ("-h", "--help"):
        print(usage())
        return 0
    if command in ("-V", "--version"):
        print(f"modeling-attn {__version__}")
        return 0
    if command not in COMMANDS:
        near = difflib.get_close_matches(command, list(COMMANDS), n=1)
        if command.startswith("-"):
            command_error(PROG, f"unknown option {command!r}; a command comes first (see {PROG} --help)")
        hint = f"; did you mean {near[0]!r}?" if near else f"; one of {', '.join(COMMANDS)}"
        command_error(PROG, f"unknown command {command!r}{hint} (see {PROG} --help)")
    return _command(command)(rest)


if __name__ == "__main__":
    sys.exit(main())
