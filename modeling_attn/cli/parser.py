"""The command-line convention of every `attn` subcommand, on transformers' `HfArgumentParser`.

A command declares its flags as dataclasses (as `run_translation.py` and `Seq2SeqTrainingArguments` do) and parses
them with `CommandParser.parse`:
- `--a_b` and `--a-b` are the same flag (HfArgumentParser registers both spellings);
- `attn COMMAND flags.yaml` (or `.json`) reads the flags from a file; flags given after the file override it;
- a number flag declares its values (`"range": COUNT` in its field's metadata, `modeling_attn.api.values`), checked
  once right after parsing, before any dataclass is built; a float flag with no declaration must be finite;
- argparse's own errors (a bad value, a missing required flag) end in `CommandParser.error`; every check of ours (an
  unknown flag, named with the closest valid one; a declared range; a flags file; a combination a dataclass refuses
  in its `__post_init__`; a positional argument given twice) raises `CommandLineError` for `report.run_command`. Both
  print one line, `attn COMMAND: error: ... (see attn COMMAND --help)` (`report.print_user_error`), exit status 2.
Every command of `modeling_attn.cli` uses this convention (docs/training.md, "Flags"). The model package, the Python
API and the recipe parse no command lines.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import json
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from transformers import HfArgumentParser

from ..api.errors import CommandLineError
from ..api.values import FINITE, Range
from .report import print_user_error

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: ...)" after each flag, left out where the default is None: a flag not given then means
    what its help says (computed, the model's own setting, or nothing), not "None"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


class CommandParser(HfArgumentParser):
    """`HfArgumentParser` with the `attn` convention (see the module docstring). Flags are never abbreviated: an
    abbreviation is an unknown flag (argparse would take `--out` for `--output_dir`, and a later flag could make it
    ambiguous)."""

    def __init__(self, dataclass_types: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(dataclass_types, **kwargs)

    @staticmethod
    def _parse_dataclass_field(parser: argparse._ActionsContainer, field: dataclasses.Field) -> None:
        """HfArgumentParser's, with the field's declared `range` taken out of the metadata (argparse would refuse it
        as an argument) and kept on the flag's action, for `check_ranges`."""
        declared = field.metadata.get("range")
        if declared is not None:
            field = copy.copy(field)
            field.metadata = types.MappingProxyType({k: v for k, v in field.metadata.items() if k != "range"})
        HfArgumentParser._parse_dataclass_field(parser, field)
        if declared is not None:
            parser._option_string_actions[f"--{field.name}"].range = declared

    def declare_ranges(self, ranges: Mapping[str, Range]) -> None:
        """Declare the values of flags whose dataclass is not ours (transformers' `Seq2SeqTrainingArguments`)."""
        for name, declared in ranges.items():
            self._option_string_actions[f"--{name}"].range = declared

    def check_ranges(self, namespace: argparse.Namespace) -> None:
        """Every number flag in its declared range (a float flag with none: finite), else one line naming it."""
        for action in self._actions:
            declared = getattr(action, "range", None) or (FINITE if action.type is float else None)
            value = getattr(namespace, action.dest, None)
            if declared is None or value is None:
                continue
            for item in value if isinstance(value, list) else [value]:
                if problem := declared.problem(item):
                    raise CommandLineError(f"argument {action.option_strings[0]}: {problem}")

    def error(self, message: str) -> NoReturn:
        """argparse's own errors only: one line on stderr in the reporter's format, and exit status 2, without
        argparse's usage block; under ATTN_DEBUG, the traceback of argparse's exception first."""
        print_user_error(self.prog, message, see_help=True)
        self.exit(2)

    def flag_names(self) -> list[str]:
        """Every flag the parser takes, in both spellings."""
        return [option for action in self._actions for option in action.option_strings if option.startswith("--")]

    def closest_flag(self, flag: str) -> str | None:
        """The valid flag nearest to `flag` (dashes and underscores alike), or None if none is near."""
        name = flag.split("=", 1)[0].replace("-", "_")
        by_key: dict[str, str] = {}
        for option in self.flag_names():  # the first spelling is the field's own name
            by_key.setdefault(option.replace("-", "_"), option)
        match = difflib.get_close_matches(name, list(by_key), n=1, cutoff=0.6)
        return by_key[match[0]] if match else None

    def _unknown(self, arguments: Sequence[str]) -> NoReturn:
        flags = [argument for argument in arguments if argument.startswith("-")]
        if not flags:
            raise CommandLineError(f"unexpected argument {arguments[0]!r}")
        flag = flags[0].split("=", 1)[0]
        closest = self.closest_flag(flag)
        raise CommandLineError(f"unrecognized flag {flag}" + (f"; did you mean {closest}?" if closest else ""))

    def config_file_flags(self, path: Path) -> list[str]:
        """The flags written in a YAML / JSON file, as command-line arguments."""
        try:
            text = path.read_text(encoding="utf-8")
            values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as error:
            raise CommandLineError(f"{path}: cannot read the flags file ({error})") from error
        if not isinstance(values, dict):
            kind = type(values).__name__
            raise CommandLineError(f"{path}: a flags file holds a mapping of flag names to values, not {kind}")
        destinations = {action.dest for action in self._actions}
        argv: list[str] = []
        for key, value in values.items():
            if str(key).replace("-", "_") not in destinations:
                closest = self.closest_flag(f"--{key}")
                hint = f"; did you mean {closest[2:]!r}?" if closest else ""
                raise CommandLineError(f"{path}: unknown flag {key!r}{hint}")
            name = str(key).replace("-", "_")
            if isinstance(self._option_string_actions.get(f"--{name}"), argparse._AppendAction):
                for item in value if isinstance(value, list) else [value]:  # a repeated flag: `model: [a, b]`
                    argv += _as_arguments(name, item)
            else:
                argv += _as_arguments(name, value)
        return argv

    def bare_optional_flags(self, argv: list[str]) -> list[str]:
        """`argv` with each flag whose value is optional (a boolean: `--do_sample` or `--do_sample false`) written
        `--flag=VALUE` when the argument after it is not one of its values.

        argparse would take that argument as the flag's value: `attn translate --do_sample "a sentence"` would refuse
        the sentence as a boolean. Here the flag stands alone and the sentence stays a sentence.
        """
        if not any(not action.option_strings for action in self._actions):
            return list(argv)  # no positional argument to leave in place: argparse's own message is the right one
        rewritten = list(argv)
        for index, argument in enumerate(argv[:-1]):
            action = self._option_string_actions.get(argument)
            following = argv[index + 1]
            if action is None or action.nargs != "?" or following.startswith("-") or "--" in argv[:index]:
                continue
            if not _takes_value(action, following):
                constant = action.const
                rewritten[index] = f"{argument}={str(constant).lower() if isinstance(constant, bool) else constant}"
        return rewritten

    def parse(self, argv: Sequence[str] | None = None) -> tuple[Any, ...]:
        """The command's dataclasses, filled from `argv` (default: sys.argv[1:]) by the convention above."""
        argv = list(sys.argv[1:] if argv is None else argv)
        if argv and not argv[0].startswith("-") and argv[0].endswith(CONFIG_SUFFIXES) and Path(argv[0]).is_file():
            argv = self.config_file_flags(Path(argv[0])) + argv[1:]
        elif argv and not argv[0].startswith("-") and argv[0].endswith(CONFIG_SUFFIXES):
            raise CommandLineError(f"{argv[0]}: no such flags file")
        argv = self.bare_optional_flags(argv)
        # An unknown flag first: argparse reports a missing required flag before an unknown one, so a misspelt
        # required flag (`--ouput_dir`) would read as a missing one.
        flags = set(self.flag_names())
        for argument in argv[: argv.index("--")] if "--" in argv else argv:
            if argument.startswith("--") and argument.split("=", 1)[0] not in flags:
                self._unknown([argument])
        namespace, unknown = self.parse_known_args(argv)  # argparse's own errors (bad values, missing flags) end here
        if unknown:
            self._unknown(unknown)
        self.check_ranges(namespace)
        try:
            return tuple(self.parse_args_into_dataclasses(args=argv))
        except ValueError as error:  # a dataclass's __post_init__ refused a value or a combination
            raise CommandLineError(str(error).strip().splitlines()[0]) from error


def _takes_value(action: argparse.Action, argument: str) -> bool:
    """Whether `argument` is a value of the optional-value flag `action` (its type accepts it, one of its choices)."""
    try:
        value = action.type(argument) if action.type is not None else argument
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return False
    return action.choices is None or value in action.choices


def _as_arguments(name: str, value: Any) -> list[str]:
    """One flag of a flags file as command-line arguments (booleans as true/false, lists as several values)."""
    if value is None:
        return []
    if isinstance(value, bool):
        return [f"--{name}", str(value).lower()]
    if isinstance(value, list | tuple):
        return [f"--{name}", *map(str, value)]
    if isinstance(value, dict):
        return [f"--{name}", json.dumps(value)]
    return [f"--{name}", str(value)]


def parse_command(
    arguments: type,
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    positional: str | None = None,
    nargs: str = "?",
    required: bool = True,
) -> Any:
    """The `arguments` dataclass filled from `argv` by `CommandParser`.

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
            raise CommandLineError(f"{positional.upper()} given twice: as an argument ({given}) and as --{positional}")
        if given:
            setattr(args, positional, given)
        if required and not getattr(args, positional):
            raise CommandLineError(f"the following arguments are required: {positional.upper()} (or --{positional})")
    return args


__all__ = ["CONFIG_SUFFIXES", "CommandParser", "parse_command"]
