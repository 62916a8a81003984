"""The `attn` command-line convention (modeling_attn/cli/parser.py): both spellings of a flag, flags files, and user
errors as one line with exit status 2 while parsing (`CommandParser`, with the declared ranges of number flags), and
the flags built as transformers' `HfArgumentParser` builds them (compared on every command's dataclasses).

What a command reports once it runs is tested in tests/test_cli_report.py."""

from __future__ import annotations

import copy
import json
import types
from dataclasses import dataclass, field

import pytest
from transformers import HfArgumentParser

from modeling_attn.api.errors import CommandLineError
from modeling_attn.api.values import COUNT, PROBABILITY
from modeling_attn.cli.main import COMMANDS
from modeling_attn.cli.parser import CommandParser, _HelpFormatter
from modeling_attn.cli.report import run_command


@dataclass
class Flags:
    model: str = field(metadata={"help": "a required flag"})
    batch_size: int = field(default=32, metadata={"help": "sentences per batch", "range": COUNT})
    dropout: float = field(default=0.1, metadata={"help": "a probability", "range": PROBABILITY})
    penalty: float | None = field(default=None, metadata={"help": "any finite float: no declaration"})
    sizes: list[int] = field(default_factory=list, metadata={"help": "several counts", "range": COUNT})
    seed: int = field(default=0, metadata={"help": "any integer: no declaration"})
    attention_png: str | None = field(default=None, metadata={"help": "a picture"})
    lowercase: bool = field(default=False, metadata={"help": "a switch"})
    splits: list[str] = field(default_factory=lambda: ["test"], metadata={"help": "several values"})


def parser() -> CommandParser:
    return CommandParser(Flags, prog="attn demo")


def error_of(argv, capsys) -> str:
    """The one line of a refused command line, parsed as a command parses it: inside `run_command`."""
    try:
        status = run_command("attn demo", lambda: parser().parse(argv))
    except SystemExit as exit_info:  # argparse's own errors
        status = exit_info.code
    assert status == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("attn demo: error: ")
    return lines[0]


def test_both_spellings_of_a_flag_are_the_same_flag():
    (underscores,) = parser().parse(["--model", "m", "--batch_size", "4", "--attention_png", "a.png"])
    (dashes,) = parser().parse(["--model", "m", "--batch-size", "4", "--attention-png", "a.png"])
    assert underscores == dashes == Flags(model="m", batch_size=4, attention_png="a.png")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_flags_file_gives_the_flags_and_later_flags_override_it(tmp_path, suffix):
    values = {"model": "m", "batch-size": 8, "lowercase": True, "splits": ["validation", "test"]}
    path = tmp_path / f"flags{suffix}"
    path.write_text(json.dumps(values))  # JSON is YAML too
    (from_file,) = parser().parse([str(path)])
    assert from_file == Flags(model="m", batch_size=8, lowercase=True, splits=["validation", "test"])
    (overridden,) = parser().parse([str(path), "--batch_size", "2", "--lowercase", "false"])
    assert overridden == Flags(model="m", batch_size=2, lowercase=False, splits=["validation", "test"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--model", "m", "--batch_sise", "4"], "unrecognized flag --batch_sise; did you mean --batch_size?"),
        (["--model", "m", "--atention-png=a.png"], "unrecognized flag --atention-png; did you mean --attention_png?"),
        (["--model", "m", "--zzz"], "unrecognized flag --zzz (see"),
        (["--modle", "m"], "unrecognized flag --modle; did you mean --model?"),  # not "required: --model"
        (["--model", "m", "--batch", "4"], "unrecognized flag --batch; did you mean --batch_size?"),  # no prefixes
        (["--model", "m", "stray"], "unexpected argument 'stray'"),
        (["--batch_size", "4"], "the following arguments are required: --model"),
        (["--model", "m", "--batch_size", "many"], "argument --batch_size/--batch-size: invalid int value: 'many'"),
        (["--model", "m", "--batch_size", "0"], "argument --batch_size: must be a positive integer, got 0"),
        (["--model", "m", "--batch_size", "-3"], "argument --batch_size: must be a positive integer, got -3"),
        (["--model", "m", "--dropout", "1.5"], "argument --dropout: must be a probability in [0, 1], got 1.5"),
        (["--model", "m", "--dropout", "nan"], "argument --dropout: must be a probability in [0, 1], got nan"),
        (["--model", "m", "--penalty", "nan"], "argument --penalty: must be a finite number, got nan"),
        (["--model", "m", "--penalty=-inf"], "argument --penalty: must be a finite number, got -inf"),
        (["--model", "m", "--sizes", "2", "0"], "argument --sizes: must be a positive integer, got 0"),
        (["recipe.yaml"], "recipe.yaml: no such flags file"),
    ],
)
def test_a_user_error_is_one_line_with_exit_status_2(argv, expected, capsys):
    assert expected in error_of(argv, capsys)


def test_values_in_their_declared_ranges_pass_and_a_flags_file_is_checked_alike(tmp_path, capsys):
    (flags,) = parser().parse(
        [
            "--model",
            "m",
            "--batch_size",
            "1",
            "--dropout",
            "0",
            "--penalty",
            "-2.5",
            "--sizes",
            "1",
            "7",
            "--seed",
            "-9",
        ]
    )
    assert flags == Flags(model="m", batch_size=1, dropout=0.0, penalty=-2.5, sizes=[1, 7], seed=-9)
    path = tmp_path / "flags.yaml"
    path.write_text("model: m\ndropout: 2\n")
    assert "argument --dropout: must be a probability in [0, 1], got 2.0" in error_of([str(path)], capsys)


def test_declare_ranges_covers_flags_of_a_dataclass_that_is_not_ours(capsys):
    from modeling_attn.training.arguments import TRAINER_RANGES
    from transformers import Seq2SeqTrainingArguments

    trainer_parser = CommandParser(Seq2SeqTrainingArguments, prog="attn demo")
    trainer_parser.declare_ranges(TRAINER_RANGES)
    for argv, expected in [
        (
            ["--max_steps", "0"],
            "argument --max_steps: must be a positive integer or -1 (-1: train for --num_train_epochs), got 0",
        ),
        (
            ["--label_smoothing_factor", "1.5"],
            "argument --label_smoothing_factor: must be a probability in [0, 1], got 1.5",
        ),
        (["--adam_beta2", "1"], "argument --adam_beta2: must be a number in [0, 1), got 1.0"),
        (["--seed", "1", "--max_grad_norm", "inf"], "argument --max_grad_norm: must be a finite number of 0 or more"),
    ]:
        with pytest.raises(CommandLineError) as refused:
            trainer_parser.parse(["--output_dir", "x", *argv])
        assert expected in str(refused.value)
    (args,) = trainer_parser.parse(["--output_dir", "x", "--max_steps", "-1", "--seed", "-3"])
    assert (args.max_steps, args.seed) == (-1, -3)


def test_a_bad_flags_file_names_the_file_and_the_key(tmp_path, capsys):
    path = tmp_path / "flags.yaml"
    path.write_text("model: m\nbatch_sise: 4\n")
    assert f"{path}: unknown flag 'batch_sise'; did you mean 'batch_size'?" in error_of([str(path)], capsys)
    path.write_text("- model\n- m\n")
    assert f"{path}: a flags file holds a mapping of flag names to values, not list" in error_of([str(path)], capsys)


def test_a_flag_with_an_optional_value_never_takes_an_argument_that_is_not_one_of_its_values():
    """`--flag` with an optional value (transformers' booleans) before a positional argument: argparse would take the
    argument as the flag's value and refuse it; the parser leaves the argument where it is."""

    @dataclass
    class WithBoolean:
        verbose: bool = False

    parser = CommandParser(WithBoolean)
    parser.add_argument("text", nargs="*")
    assert parser.bare_optional_flags(["--verbose", "a sentence"]) == ["--verbose=true", "a sentence"]
    assert parser.bare_optional_flags(["--verbose", "false", "a sentence"]) == ["--verbose", "false", "a sentence"]
    assert parser.bare_optional_flags(["--", "--verbose", "x"]) == ["--", "--verbose", "x"]
    flags, positional = parser.parse(["--verbose", "a sentence"])
    assert flags.verbose is True and positional.text == ["a sentence"]
    flags, positional = parser.parse(["--verbose", "no", "a sentence"])
    assert flags.verbose is False and positional.text == ["a sentence"]


def test_a_flags_file_list_repeats_a_flag_that_is_given_several_times(tmp_path):
    """`model: [a, b]` in a flags file is `--model a --model b` for a flag that may be repeated (argparse's append)."""
    parser = CommandParser(Flags)
    parser.add_argument("--member", action="append")
    path = tmp_path / "flags.yaml"
    path.write_text("model: m\nmember: [a, b]\n")
    assert parser.config_file_flags(path) == ["--model", "m", "--member", "a", "--member", "b"]


# -- the flags are those transformers' HfArgumentParser makes --------------------------------------------------


class HfReference(HfArgumentParser):
    """What `CommandParser` was built on before issue 55 (it then imported transformers for `--help`): transformers'
    own parser, with a field's declared `range` kept on its action as `CommandParser` keeps it."""

    def __init__(self, dataclass_types, **kwargs):
        super().__init__(dataclass_types, allow_abbrev=False, formatter_class=_HelpFormatter, **kwargs)

    @staticmethod
    def _parse_dataclass_field(parser, field):
        declared = field.metadata.get("range")
        if declared is not None:
            field = copy.copy(field)
            field.metadata = types.MappingProxyType({k: v for k, v in field.metadata.items() if k != "range"})
        HfArgumentParser._parse_dataclass_field(parser, field)
        if declared is not None:
            parser._option_string_actions[f"--{field.name}"].range = declared


# what a flag's type is given: numbers, booleans in every spelling, words, a JSON mapping
TYPE_SAMPLES = ["0", "1", "-3", "2.5", "nan", "true", "False", "yes", "n", "x", "int8", "steps", "{}", ""]


def _what_type_does(convert):
    """A flag's type as what it gives for each sample (or the exception's class): functions made per parser compare."""
    if convert is None or isinstance(convert, type):
        return convert
    given = []
    for sample in TYPE_SAMPLES:
        try:
            given.append(convert(sample))
        except Exception as error:  # noqa: BLE001 (the class is what is compared)
            given.append(type(error))
    return given


def flag_table(parser) -> list:
    """Everything argparse knows of each flag, and the groups."""
    rows = [
        (
            type(action).__name__,
            action.option_strings,
            action.dest,
            action.nargs,
            action.const,
            repr(action.default),
            list(action.choices) if action.choices is not None else None,
            action.required,
            action.help,
            action.metavar,
            getattr(action, "range", None),
            _what_type_does(action.type),
        )
        for action in parser._actions
    ]
    return rows + [(group.title, [action.dest for action in group._group_actions]) for group in parser._action_groups]


def command_dataclasses() -> dict[str, tuple]:
    """The flag dataclasses of every `attn` command (and of this file)."""
    from modeling_attn.training.arguments import RecipeArguments
    from transformers import Seq2SeqTrainingArguments

    from modeling_attn.cli import (
        average,
        convert,
        distill,
        evaluate,
        explain,
        export,
        options,
        preset,
        push,
        score,
        serve,
        translate,
    )

    shared = (options.DecodingArguments, options.RuntimeArguments, options.EnsembleArguments)
    return {
        "translate": translate.TRANSLATE_ARGUMENTS,
        "evaluate": (evaluate.EvaluateArguments, *shared),
        "serve": (serve.ServeArguments, options.RuntimeArguments, options.EnsembleArguments),
        "score": (score.ScoreArguments, options.RuntimeArguments, options.EnsembleArguments),
        "distill": (distill.DistillArguments, *shared),
        "explain": (explain.ExplainArguments,),
        "preset": (preset.PresetArguments,),
        "average": (average.AverageArguments,),
        "convert": (convert.ConvertArguments,),
        "export": (export.ExportArguments,),
        "push": (push.PushArguments,),
        "train": (RecipeArguments, Seq2SeqTrainingArguments),
        "test": (Flags,),
    }


@pytest.mark.parametrize("command", [*COMMANDS, "test"])
def test_the_flags_are_those_of_transformers_hf_argument_parser(command):
    """`CommandParser` builds its flags without transformers (so that `attn COMMAND --help` and a mistyped flag need
    no torch); each command's flags, their types, defaults, groups and its --help text are what HfArgumentParser
    made of the same dataclasses."""
    dataclass_types = command_dataclasses()[command]
    ours = CommandParser(dataclass_types, prog=f"attn {command}")
    reference = HfReference(dataclass_types, prog=f"attn {command}")
    assert flag_table(ours) == flag_table(reference)
    assert ours.format_help() == reference.format_help()


def test_the_parsed_dataclasses_are_those_of_transformers_hf_argument_parser():
    argv = ["--model", "m", "--batch-size", "4", "--sizes", "1", "2", "--lowercase", "--splits", "a", "b"]
    assert CommandParser(Flags).parse_args_into_dataclasses(argv) == HfReference(Flags).parse_args_into_dataclasses(
        argv, look_for_args_file=False
    )
