"""The `attn` command: a dispatcher that imports only the command it runs.

Each command is one module of this package with its flags (a dataclass, parsed by `parser.CommandParser`) and a
`main(argv) -> int`; `COMMANDS` below lists them with their one-line help. A command module never imports this
dispatcher; the convention they share (flags files, `--a-b` and `--a_b`) lives in `parser.py`, and how a command
ends (one-line errors with exit status 2) in `report.py`.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from .. import __version__
from ..api.errors import CommandLineError
from .report import run_command

PROG = "attn"

# name: what it does (for `attn --help`); the command is `modeling_attn.cli.<name>.main`
COMMANDS = {
    "train": "train or fine-tune a translation model (the paper's recipe; every Seq2SeqTrainingArguments flag)",
    "average": "average the weights of the last checkpoints of a training run (paper, Sec. 6.1)",
    "translate": "translate sentences (arguments, --input FILE or stdin); attention pictures",
    "distill": "translate the training sources with a teacher (or an ensemble): a distilled training folder",
    "score": "the log-probability a model gives each translation (--source and --target files, or stdin pairs)",
    "evaluate": "BLEU, chrF and TER (sacreBLEU) of a model on a data split, or of a file of translations, as JSON",
    "push": "upload a trained model (weights, code, tokenizer, generation config, card) to the Hugging Face Hub",
    "convert": "convert Marian (OPUS-MT) checkpoints to attn_transformer and back",
    "export": "export a model to CTranslate2 or ONNX",
    "explain": "write an interactive page (one offline HTML file) of how a model translates a sentence",
    "preset": "list the model presets, or print one as a config JSON",
    "serve": "an HTTP translation server (POST /translate and /score, batching concurrent requests; the serve extra)",
}


def usage() -> str:
    """What `attn --help` prints: the commands, one a line."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [flags]   ({PROG} COMMAND --help for a command's flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    lines += ["", "options:", "  -h, --help     this list", "  -V, --version  the version of modeling-attn"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The `attn` entry point: `attn COMMAND [flags]` (exit status 2 for a user error, as argparse). A command's own
    `main` reports its errors (`report.run_command`, once); this dispatcher reports only a missing or unknown one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # as argparse does: the usage, then the error
        print(usage(), file=sys.stderr)
        return run_command(PROG, lambda: _unknown_command(None))
    command, rest = argv[0], argv[1:]
    if command in ("-h", "--help"):
        print(usage())
        return 0
    if command in ("-V", "--version"):
        print(f"modeling-attn {__version__}")
        return 0
    if command in COMMANDS:
        return importlib.import_module(f"{__package__}.{command}").main(rest)
    return run_command(PROG, lambda: _unknown_command(command))


def _unknown_command(command: str | None) -> NoReturn:
    """A CommandLineError naming the closest command to `command`, or the commands."""
    if command is None:
        raise CommandLineError("give a command")
    if command.startswith("-"):
        raise CommandLineError(f"unknown option {command!r}; a command comes first")
    near = difflib.get_close_matches(command, list(COMMANDS), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else f"; one of {', '.join(COMMANDS)}"
    raise CommandLineError(f"unknown command {command!r}{hint}")


if __name__ == "__main__":
    sys.exit(main())
