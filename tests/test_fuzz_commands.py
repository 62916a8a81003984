"""A hypothesis fuzz test per `attn` command (issue 34): every flag that declares its values (a `range` in its
field's metadata or `TRAINER_RANGES`, a float, a choice, a boolean) gets generated bad values, and the command must
end with exit status 2, exactly one line on stderr naming the flag, no traceback, and no file of the working folder
changed.

The commands run in-process through `modeling_attn.cli.main` (as tests/test_cli.py does); each command's parser and
its flags are found by running it (`CommandParser.parse` recorded), not listed here, so a flag added later is
fuzzed too. Bad values come from the declaration itself: numbers below / above / beside the declared range, NaN and
infinities, fractions for integers, words for numbers, names that are not among the choices or booleans. The quick
suite draws a few dozen examples per command; `-m slow` draws many more.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeling_attn.api.values import FINITE, Range
from modeling_attn.cli.main import COMMANDS
from modeling_attn.cli.main import main as attn
from modeling_attn.cli.parser import CommandParser, string_to_bool

BOOLEAN_WORDS = {"yes", "no", "true", "false", "t", "f", "y", "n", "1", "0"}
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)


def parser_of(command: str, monkeypatch) -> CommandParser:
    """The parser `attn COMMAND --help` builds (the last one, for `attn train`'s two)."""
    built: list[CommandParser] = []
    parse = CommandParser.parse

    def recording(self, argv=None):
        built.append(self)
        return parse(self, argv)

    with monkeypatch.context() as patch, contextlib.redirect_stdout(io.StringIO()):
        patch.setattr(CommandParser, "parse", recording)
        with pytest.raises(SystemExit):
            attn([command, "--help"])
    return built[-1]


def declared_flags(parser: CommandParser) -> dict[str, argparse.Action]:
    """The flags whose values are declared: a range, a float (finite), choices, a boolean; by their first name."""
    flags = {}
    for action in parser._actions:
        if not action.option_strings or not action.option_strings[0].startswith("--") or action.nargs == 0:
            continue
        if getattr(action, "range", None) or action.type in (float, string_to_bool) or action.choices:
            flags[action.option_strings[0]] = action
    return flags


def required_argv(parser: CommandParser) -> list[str]:
    """Values for the required flags, so that parsing reaches the fuzzed one (never used: parsing refuses first)."""
    argv = []
    for action in parser._actions:
        if action.required and action.option_strings:
            argv += [action.option_strings[0], str(next(iter(action.choices))) if action.choices else "x"]
    return argv


def _numbers_outside(declared: Range, integer: bool) -> st.SearchStrategy:
    number = st.integers if integer else st.floats
    kwargs = {} if integer else {"allow_nan": False, "allow_infinity": False}
    options = [st.sampled_from(["nan", "inf", "-inf"])]
    if declared.low is not None:
        low = declared.low if declared.low_open else declared.low - (1 if integer else 1e-9)
        options.append(number(max_value=math.floor(low) if integer else low, **kwargs))
    if declared.high is not None:
        high = declared.high if declared.high_open else declared.high + (1 if integer else 1e-9)
        options.append(number(min_value=math.ceil(high) if integer else high, **kwargs))
    if integer:  # not a whole number
        options.append(st.floats(-1e6, 1e6).filter(lambda value: value != int(value)))
    return st.one_of(options).filter(lambda value: value not in declared.also).map(str)


def bad_values(action: argparse.Action) -> st.SearchStrategy[str]:
    if action.type is string_to_bool:
        return WORDS.filter(lambda word: word not in BOOLEAN_WORDS)
    if action.choices:
        return WORDS.filter(lambda word: word not in {str(choice) for choice in action.choices})
    declared = getattr(action, "range", None) or FINITE
    return st.one_of(_numbers_outside(declared, action.type is int), WORDS)


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*")}


def fuzz(command: str, tmp_path: Path, monkeypatch, examples: int) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("a file of the user's\n")
    parser = parser_of(command, monkeypatch)
    flags, required = declared_flags(parser), required_argv(parser)
    assert flags, f"attn {command} declares the values of no flag: list it in NOTHING_DECLARED"
    before, calls = folder_state(tmp_path), []

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(data=st.data())
    def one_bad_flag(data):
        flag = data.draw(st.sampled_from(sorted(flags)), label="flag")
        value = data.draw(bad_values(flags[flag]), label="value")
        stderr = io.StringIO()
        calls.append(flag)
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = attn([command, *required, f"{flag}={value}"])
            except SystemExit as exit_info:  # argparse's own errors (a type, a choice); ours: the reporter's 2
                status = exit_info.code
        lines = stderr.getvalue().splitlines()
        assert status == 2, (flag, value, lines)
        assert len(lines) == 1, (flag, value, lines)
        assert lines[0].startswith(f"attn {command}: error: argument {flag}"), (flag, value, lines)
        assert "Traceback" not in lines[0]
        assert folder_state(tmp_path) == before, (flag, value)

    one_bad_flag()
    assert len(calls) >= min(examples, 10), calls  # the examples did run


# The commands whose parsers declare no flag's values (every flag a path, a name or a free text): nothing to fuzz.
NOTHING_DECLARED = {"preset"}


def test_every_command_is_fuzzed_or_declares_nothing(monkeypatch):
    for command in COMMANDS:
        has_flags = bool(declared_flags(parser_of(command, monkeypatch)))
        assert has_flags != (command in NOTHING_DECLARED), command
    flags = declared_flags(parser_of("train", monkeypatch))
    assert {"--max_steps", "--vocab_size", "--label_smoothing_factor", "--length_penalty", "--bpe_dropout"} <= set(
        flags
    )


@pytest.mark.parametrize("command", [command for command in COMMANDS if command not in NOTHING_DECLARED])
def test_bad_values_of_declared_flags_end_in_one_line_naming_the_flag(command, tmp_path, monkeypatch):
    fuzz(command, tmp_path, monkeypatch, examples=25)


@pytest.mark.slow
@pytest.mark.parametrize("command", [command for command in COMMANDS if command not in NOTHING_DECLARED])
def test_many_bad_values_of_declared_flags_end_in_one_line_naming_the_flag(command, tmp_path, monkeypatch):
    fuzz(command, tmp_path, monkeypatch, examples=400)


def refused_by_declaration(action: argparse.Action, value: str) -> bool:
    """Whether the flag's declaration refuses `value`: not of its type, not a choice, or out of its range."""
    try:
        converted = action.type(value) if action.type is not None else value
    except (ValueError, argparse.ArgumentTypeError):
        return True
    if action.choices:
        return converted not in action.choices
    declared = getattr(action, "range", None) or (FINITE if action.type is float else None)
    return declared is not None and declared.problem(converted) is not None


@pytest.mark.parametrize("command", ["train", "translate"])
def test_the_fuzzer_draws_only_values_the_declarations_refuse_and_good_values_pass(command, monkeypatch, tmp_path):
    """Else the fuzz test could pass for the wrong reason; and a good value of each kind gets past the parser."""
    flags = declared_flags(parser_of(command, monkeypatch))

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(data=st.data())
    def drawn(data):
        flag = data.draw(st.sampled_from(sorted(flags)))
        assert refused_by_declaration(flags[flag], data.draw(bad_values(flags[flag]))), flag

    drawn()
    for flag, good in {
        "--num_beams": "2",
        "--length_penalty": "-0.5",
        "--max_steps": "-1",
        "--bpe_dropout": "1",
    }.items():
        if flag in flags:
            assert not refused_by_declaration(flags[flag], good), flag
    monkeypatch.chdir(tmp_path)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):  # good values: past the parser, to the model folder's check
        status = attn(
            ["translate", "--model", str(tmp_path / "absent"), "--num_beams=2", "--length_penalty=-0.5", "x"]
        )
    assert status == 2 and "num_beams" not in stderr.getvalue() and "absent" in stderr.getvalue(), stderr.getvalue()
    assert os.listdir(tmp_path) == []
