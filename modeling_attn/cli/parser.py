"""The command-line convention of every `attn` subcommand: flags declared as dataclasses, parsed by argparse.

A command declares its flags as dataclasses (as `run_translation.py` and `Seq2SeqTrainingArguments` do) and parses
them with `CommandParser.parse`:
- each field is the flag transformers' `HfArgumentParser` makes of it, built here without importing transformers
  (`add_dataclass_flags`; tests/test_cli_parser.py compares the two): `--a_b` and `--a-b` are the same flag;
- `attn COMMAND flags.yaml` (or `.json`) reads the flags from a file; flags given after the file override it;
- a number flag declares its values (`"range": COUNT` in its field's metadata, `modeling_attn.api.values`), checked
  once right after parsing, before any dataclass is built; a float flag with no declaration must be finite;
- argparse's own errors (a bad value, a missing required flag) end in `CommandParser.error`; every check of ours (an
  unknown flag, named with the closest valid one; a declared range; a flags file; a combination a dataclass refuses
  in its `__post_init__`; a positional argument given twice) raises `CommandLineError` for `report.run_command`. Both
  print one line, `attn COMMAND: error: ... (see attn COMMAND --help)` (`report.print_user_error`), exit status 2;
- a valid command line registers the models (`modeling_attn.register_models`: the `attn` process does not at import,
  so `--help` and these errors need no torch), unless the command needs none (`CommandParser(models=False)`).
Every command of `modeling_attn.cli` uses this convention (docs/training.md, "Flags").
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import json
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml

from .. import register_models
from ..api.errors import CommandLineError
from ..api.values import FINITE, Range
from .report import print_user_error

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: ...)" after each flag, left out where the default is None: a flag not given then means
    what its help says (computed, the model's own setting, or nothing), not "None"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def string_to_bool(value: str | bool) -> bool:
    """A boolean flag's value: yes/no, true/false, t/f, y/n, 1/0, any case (HfArgumentParser's)."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if value.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {value} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


def _choice_type(choices: Sequence[Any]) -> Callable[[str], Any]:
    """A choice flag's type: each choice's string gives the choice itself (an Enum member's value, a Literal's)."""
    by_text = {str(choice): choice for choice in choices}
    return lambda text: by_text.get(text, text)


def _flag_arguments(field: dataclasses.Field, hint: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`add_argument`'s keyword arguments for a dataclass field of type `hint` (HfArgumentParser's rules), and those
    of its `--no_FIELD` complement (a boolean field that defaults to True), or None."""
    kwargs = {key: value for key, value in field.metadata.items() if key not in ("aliases", "range")}
    origin = typing.get_origin(hint) or hint
    if origin is typing.Union or origin is types.UnionType:
        members = typing.get_args(hint)
        if str not in members and (len(members) != 2 or type(None) not in members):
            raise TypeError(f"field {field.name!r}: a flag takes one type, or None (Optional[X]), or str")
        if type(None) not in members:  # `X | str`: X
            hint = members[0] if members[1] is str else members[1]
        elif bool not in members:  # `X | None`: X (`bool | None` stays, below)
            hint = members[0] if members[1] is type(None) else members[1]
        origin = typing.get_origin(hint) or hint
    complement = None
    if origin is typing.Literal or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        kwargs["choices"] = typing.get_args(hint) if origin is typing.Literal else [member.value for member in hint]
        kwargs["type"] = _choice_type(kwargs["choices"])
        if field.default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = field.default
    elif hint is bool or hint == bool | None:
        if field.default is True:
            complement = {**kwargs, "default": False}
        kwargs["type"] = string_to_bool
        if hint is bool or field.default not in (None, dataclasses.MISSING):
            kwargs.update(default=False if field.default is dataclasses.MISSING else field.default, nargs="?")
            kwargs["const"] = True
    elif isinstance(origin, type) and issubclass(origin, list):
        kwargs.update(type=typing.get_args(hint)[0], nargs="+")
        if field.default_factory is not dataclasses.MISSING:
            kwargs["default"] = field.default_factory()
        elif field.default is dataclasses.MISSING:
            kwargs["required"] = True
    else:
        kwargs["type"] = hint
        if field.default is not dataclasses.MISSING:
            kwargs["default"] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            kwargs["default"] = field.default_factory()
        else:
            kwargs["required"] = True
    return kwargs, complement


class CommandParser(argparse.ArgumentParser):
    """An argparse parser of dataclasses with the `attn` convention (see the module docstring). Flags are never
    abbreviated: an abbreviation is an unknown flag (argparse would take `--out` for `--output_dir`, and a later flag
    could make it ambiguous). `models=False`: the command needs no model, and `parse` registers none."""

    def __init__(self, dataclass_types: Any, models: bool = True, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(**kwargs)
        self.dataclass_types = list(dataclass_types) if isinstance(dataclass_types, Sequence) else [dataclass_types]
        self.models = models
        for dataclass_type in self.dataclass_types:
            self.add_dataclass_flags(dataclass_type)

    def add_dataclass_flags(self, dataclass_type: type) -> None:
        """A flag for each field of `dataclass_type` (in its `_argument_group_name` group, if it names one); a field's
        declared `range` is kept on its flag's action, for `check_ranges`."""
        group = getattr(dataclass_type, "_argument_group_name", None)
        container = self.add_argument_group(group) if group else self
        hints = typing.get_type_hints(dataclass_type)
        for field in dataclasses.fields(dataclass_type):
            if not field.init:
                continue
            kwargs, complement = _flag_arguments(field, hints[field.name])
            spellings = [f"--{field.name}"] + ([f"--{field.name.replace('_', '-')}"] if "_" in field.name else [])
            aliases = field.metadata.get("aliases", [])
            spellings += [aliases] if isinstance(aliases, str) else aliases
            action = container.add_argument(*spellings, **kwargs)
            if complement is not None:  # after the flag itself: argparse keeps the first default of a destination
                negative = [f"--no_{field.name}", f"--no-{field.name.replace('_', '-')}"]
                container.add_argument(*negative, action="store_false", dest=field.name, **complement)
            if "range" in field.metadata:
                action.range = field.metadata["range"]

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
            parsed = self.parse_args_into_dataclasses(argv)
        except ValueError as error:  # a dataclass's __post_init__ refused a value or a combination
            raise CommandLineError(str(error).strip().splitlines()[0]) from error
        if self.models:
            register_models()
        return parsed

    def parse_args_into_dataclasses(self, argv: Sequence[str]) -> tuple[Any, ...]:
        """An instance of each dataclass, filled from `argv`, then a Namespace of the other arguments, if any."""
        namespace = self.parse_args(argv)
        parsed = []
        for dataclass_type in self.dataclass_types:
            names = {field.name for field in dataclasses.fields(dataclass_type) if field.init}
            parsed.append(dataclass_type(**{name: vars(namespace).pop(name) for name in names}))
        return (*parsed, namespace) if vars(namespace) else tuple(parsed)


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
    models: bool = True,
) -> Any:
    """The `arguments` dataclass filled from `argv` by `CommandParser` (`models`: see there).

    `positional`: a field that may also be given without its flag, as the command's first argument(s); it must
    default to None (nargs "?") or an empty list (nargs "*"), and is `required` one way or the other.
    """
    parser = CommandParser(arguments, models=models, prog=prog, description=description)
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


__all__ = ["CONFIG_SUFFIXES", "CommandParser", "parse_command", "string_to_bool"]
