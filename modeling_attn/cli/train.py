"""`attn train` (and `python -m modeling_attn.training`): the recipe's flags parsed, checked, and the recipe run.

The flags are the recipe's (`modeling_attn.training.arguments.RecipeArguments`) and every
`Seq2SeqTrainingArguments` flag, with the paper's defaults (`PAPER_DEFAULTS`), and the embedded task's
(configuration/train-dates.yaml) over them when `--data` is not given; `modeling_attn.training.validate` checks them,
then `modeling_attn.training.train.run` runs the recipe's steps. Command line: `parser.CommandParser` (flags files,
`--a-b`, one-line errors); run_translation.py's `--dataset_name`, `--dataset_config_name`, `--tokenizer_name` are
aliases of ours. A user error (a bad flag, a combination the recipe refuses, bad data, a model folder that cannot be
used) ends with one line and exit status 2 (`report.run_command`); any other exception is a bug, with its traceback.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import torch
import yaml
from transformers import Seq2SeqTrainingArguments

from ..api.outputs import folder_lock, missing_folders, not_writable, remove_unused_folders
from ..training.arguments import PAPER_DEFAULTS, TRAINER_RANGES, RecipeArguments
from ..training.train import run
from ..training.validate import validate
from .parser import CONFIG_SUFFIXES, CommandParser
from .report import run_command


def _embedded_task_defaults() -> dict:
    text = (resources.files("modeling_attn.configuration") / "train-dates.yaml").read_text()
    return yaml.safe_load(text)


def build_parser(embedded_task: bool = False) -> CommandParser:
    """The `attn train` parser: our flags and Trainer's, with the paper's defaults (`PAPER_DEFAULTS`), and the embedded
    task's (configuration/train-dates.yaml) over them when `embedded_task`."""
    embedded = _embedded_task_defaults()
    parser = CommandParser(
        (RecipeArguments, Seq2SeqTrainingArguments),
        prog="attn train",
        description="Train a translation model with the paper's recipe (the defaults shown). Without --data the "
        "embedded dates task trains, with these defaults over the paper's: "
        + ", ".join(f"--{key} {value}" for key, value in embedded.items())
        + ". Flags may come from a file: attn train recipe.yaml [flags that override it].",
    )
    # None: computed from the model's d_model and the warmup (paper_learning_rate) unless a rate is given.
    parser.set_defaults(**PAPER_DEFAULTS, learning_rate=None)
    parser.declare_ranges(TRAINER_RANGES)
    parser._option_string_actions["--learning_rate"].help = (
        "Peak learning rate. Default: the paper's d_model^-0.5 * warmup^-0.5 (Eq. 3), computed from the model's "
        "d_model and --warmup_steps."
    )
    if embedded_task:
        parser.set_defaults(**embedded)
    return parser


def _given_flags(parser: CommandParser, argv: list[str]) -> set[str]:
    """The fields named by flags of `argv` (any spelling or alias)."""
    actions = parser._option_string_actions
    return {actions[arg.split("=", 1)[0]].dest for arg in argv if arg.split("=", 1)[0] in actions}


def parse_args(argv: list[str] | None = None) -> tuple[RecipeArguments, Seq2SeqTrainingArguments]:
    """Our flags and Trainer's, with the paper's defaults (and the embedded task's when --data is not given).

    A user error in a flag ends the process with one line (`CommandParser`); a combination of flags that cannot work
    (or that would be silently ignored) raises ValueError naming the flags, before any work.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and not argv[0].startswith("-") and argv[0].endswith(CONFIG_SUFFIXES) and Path(argv[0]).is_file():
        argv = parser.config_file_flags(Path(argv[0])) + argv[1:]
    given = _given_flags(parser, argv)
    asks_help = bool({"-h", "--help"} & set(argv))
    if "data" not in given and not asks_help:  # --help shows the paper's defaults; its description the task's
        parser = build_parser(embedded_task=True)
    recipe, training_args = parser.parse(argv)
    validate(recipe, training_args, given)
    return recipe, training_args


def train(argv: list[str] | None = None) -> int:
    """Train (and evaluate) a translation model; see `attn train --help`. One run at a time per --output_dir: the
    first process of a run holds the folder's lock (`modeling_attn.api.outputs.folder_lock`), so a second run
    started into the same folder is refused, naming the first one's pid."""
    recipe, training_args = parse_args(argv)
    output_dir = Path(training_args.output_dir)
    if training_args.process_index != 0:  # the other processes of the same run share the folder
        return run(recipe, training_args)
    created = missing_folders(output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with folder_lock(output_dir, "attn train"):
            return run(recipe, training_args)
    except BaseException as error:
        remove_unused_folders(created)
        if (refused := not_writable(error, output_dir)) is not None:  # read-only, no permission, a full disk
            raise refused from error
        raise


def main(argv: list[str] | None = None) -> int:
    """`attn train`: `train` with bad flags and bad data ending with one line (flag, or file and line) and exit
    status 2."""
    try:
        return run_command("attn train", lambda: train(argv))
    finally:
        # A gloo process group left to interpreter shutdown can abort the process ("terminate called without an
        # active exception", seen once in 2-process CPU runs); tear it down explicitly.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
