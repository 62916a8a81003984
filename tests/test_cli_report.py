"""The one reporter of every `attn` command (modeling_attn/cli/report.py): a user error in one line with exit status 2,
a bug with its traceback and exit status 1, `ATTN_DEBUG=1`, Ctrl-C (130) and a reader that went away (141)."""

from __future__ import annotations

import ast
import builtins
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from full_disk import small_tmpfs
from huggingface_hub.errors import RepositoryNotFoundError
from runs import TINY
from test_reliability_messages import TINY_RUN
from test_translate import save_tiny_model

from modeling_attn.api.corpus import DataError
from modeling_attn.api.errors import CommandLineError, FlagError, UserError
from modeling_attn.api.model_folder import ModelFolderError
from modeling_attn.cli.main import COMMANDS as COMMAND_NAMES
from modeling_attn.cli.main import main as attn
from modeling_attn.cli.report import DEBUG_VARIABLE, run_command, user_error_line
from modeling_attn.loading import WeightsError

REPO = Path(__file__).resolve().parents[1]
COMMANDS = REPO / "modeling_attn" / "cli"


def test_the_exit_status_passes_and_a_user_error_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    assert run_command("attn demo", lambda: 0) == 0
    assert run_command("attn demo", lambda: 3) == 3

    def bad_data() -> int:
        raise DataError("data.tsv:7: no tab\n  between source and target")

    assert run_command("attn demo", bad_data) == 2
    assert capsys.readouterr().err == "attn demo: error: data.tsv:7: no tab between source and target\n"

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run_command("attn demo", interrupted) == 130
    assert capsys.readouterr().err == "attn demo: interrupted\n"

    def interrupted_saying_how_to_go_on() -> int:  # as attn train's training step does
        raise KeyboardInterrupt("at step 1, before the first checkpoint: no checkpoint was written; rerun the command")

    assert run_command("attn demo", interrupted_saying_how_to_go_on) == 130
    assert capsys.readouterr().err == (
        "attn demo: interrupted at step 1, before the first checkpoint: no checkpoint was written; rerun the command\n"
    )


@pytest.mark.parametrize("bug", [ValueError("deep in torch"), OSError("a socket broke"), KeyError("x")])
def test_anything_that_is_not_a_user_error_is_a_bug_and_keeps_its_traceback(bug, capsys):
    def command() -> int:
        raise bug

    with pytest.raises(type(bug)):
        run_command("attn demo", command)
    assert capsys.readouterr().err == ""


def test_our_error_types_are_user_errors_and_still_the_builtin_kind_python_code_catches():
    assert issubclass(DataError, UserError) and issubclass(DataError, ValueError)
    assert issubclass(FlagError, UserError) and issubclass(FlagError, ValueError)
    assert issubclass(ModelFolderError, UserError) and issubclass(ModelFolderError, OSError)
    assert issubclass(WeightsError, UserError) and issubclass(WeightsError, OSError)
    assert issubclass(CommandLineError, FlagError)


def test_library_exceptions_that_mean_bad_input_get_one_line_of_ours():
    missing = FileNotFoundError(2, "No such file or directory", "corpus/train.de")
    assert user_error_line(missing) == "corpus/train.de: no such file or directory"
    denied = PermissionError(13, "Permission denied", "/no-such-cache/x")  # not there: a write was refused
    assert (
        user_error_line(denied)
        == "/no-such-cache/x: no permission to write there; check the permissions of its folder"
    )
    response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api/models/x/y"))
    no_repo = RepositoryNotFoundError(
        "404 Client Error.\n\nRepository Not Found for url: https://hf.co/x/y", response=response
    )
    assert user_error_line(no_repo) == "no such Hub repository, or no access to it (404 Client Error.)"
    assert user_error_line(ValueError("not ours")) is None
    assert user_error_line(OSError("not a file error")) is None


def test_attn_debug_prints_the_traceback_of_a_user_error_too(capsys, monkeypatch):
    def bad_flag() -> int:
        raise FlagError("--max_steps 0: give a positive number")

    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    assert run_command("attn demo", bad_flag) == 2
    error = capsys.readouterr().err
    assert error.startswith("Traceback (most recent call last):") and "in bad_flag" in error
    assert error.endswith("attn demo: error: --max_steps 0: give a positive number\n")
    monkeypatch.setenv(DEBUG_VARIABLE, "0")
    assert run_command("attn demo", bad_flag) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_the_command_ends_quietly_with_141_when_the_reader_goes_away():
    """`attn ... | head`: BrokenPipeError is an OSError, but not a user error to report."""
    code = (
        "import sys\nfrom modeling_attn.cli.report import run_command\ndef spam():\n    while True:\n"
        "        print('x' * 1000)\nsys.exit(run_command('attn demo', spam))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.read(10) == b"x" * 10
    process.stdout.close()
    assert process.wait(timeout=120) == 141
    assert process.stderr.read() == b""


# A bug planted in a training step: a plain ValueError from deep code, as torch or transformers would raise.
PLANTED_BUG = """
import sys
from modeling_attn.training.trainer import TranslationTrainer

def training_step(self, model, inputs, num_items_in_batch=None):
    raise ValueError("planted bug in a training step")

TranslationTrainer.training_step = training_step
from modeling_attn.cli.train import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("debug", ["", "1"])
def test_a_bug_planted_in_a_training_step_shows_its_traceback_and_exits_1(tmp_path, debug):
    environment = {**os.environ, DEBUG_VARIABLE: debug, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", PLANTED_BUG, "--preset", "tiny", *TINY_RUN, "--output_dir", str(tmp_path / "run")]
    done = subprocess.run(argv, capture_output=True, text=True, env=environment, timeout=600, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback (most recent call last):" in done.stderr
    assert done.stderr.rstrip().endswith("ValueError: planted bug in a training step")
    assert "attn train: error:" not in done.stderr


# CommandParser's methods that run argparse: the only place an `.error(` call may be (argparse's own errors).
ARGPARSE_ERRORS = {"parser.py::CommandParser.error"}


def error_calls(source: str, where: str) -> list[tuple[str, int]]:
    """(`where::function`, line) of each `X.error(...)` call in `source`, by the function that makes it."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
                continue
            if isinstance(child, ast.Call) and getattr(child.func, "attr", None) == "error":
                found.append((f"{where}::{prefix.rstrip('.')}", child.lineno))
            visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_the_error_call_checker_sees_a_planted_parser_error():
    planted = "def average(argv):\n    args, parser = parse(argv)\n    if x:\n        parser.error('no such folder')\n"
    assert error_calls(planted, "average.py") == [("average.py::average", 4)]


def test_every_command_reports_through_the_one_reporter():
    """Every module of the command layer, parser.py and main.py included: no `return 2` but the reporter's, no
    `parser.error` but argparse's own (a check of ours raises a UserError), and each `main` reports through
    `run_command`."""
    checked = []
    for path in sorted(COMMANDS.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        checked.append(path.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and node.value.value == 2:
                assert path.name == "report.py", f"{path.name}:{node.lineno}: a bare `return 2`; raise a UserError"
        for function, line in error_calls(source, path.name):
            assert function in ARGPARSE_ERRORS, f"{function} (line {line}): .error(); raise a UserError instead"
        mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        for main in mains:
            called = {getattr(n.func, "id", None) for n in ast.walk(main) if isinstance(n, ast.Call)}
            assert "run_command" in called, f"{path.name}: main does not report through run_command"
    assert {"parser.py", "main.py", "report.py", "translate.py"} <= set(checked)


# Built-in exceptions the command layer may raise where they are not a bug: a dataclass's `__post_init__` refusing a
# combination of flags (`parse_command` makes it a CommandLineError), and SystemExit (SIGTERM, `terminated_as_exit`);
# and one that is a bug, with its traceback: a command's flag dataclass with a field type no flag can take.
ON_PURPOSE = {"__post_init__": "ValueError", "stop": "SystemExit", "_flag_arguments": "TypeError"}


def builtin_raises(source: str, where: str) -> list[str]:
    """`where:line function Class` of each `raise` of a built-in exception class in `source` that ON_PURPOSE does
    not allow: raised on purpose, it would end in a traceback (exit 1), not in the reporter's one line."""
    found: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Raise) and child.exc is not None:
                raised = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                name = getattr(raised, "id", None)
                if isinstance(getattr(builtins, name or "", None), type) and ON_PURPOSE.get(inner) != name:
                    found.append(f"{where}:{child.lineno} {inner} {name}")
            visit(child, inner)

    visit(ast.parse(source), "")
    return found


def test_the_builtin_raise_checker_sees_a_planted_one():
    planted = "def check(args):\n    if args.x:\n        raise ValueError('--x: no such folder')\n    raise\n"
    assert builtin_raises(planted, "x.py") == ["x.py:3 check ValueError"]


def test_the_command_layer_raises_only_user_errors_on_purpose():
    """Nothing the commands raise on purpose ends in a traceback: a check of theirs raises a UserError (one line, exit
    2), never a bare ValueError or OSError (a traceback, exit 1)."""
    found = [hit for path in sorted(COMMANDS.glob("*.py")) for hit in builtin_raises(path.read_text(), path.name)]
    assert found == []


def run_command_calls(argv: list[str]) -> tuple[int, int]:
    """`attn argv`'s exit status and how many times `run_command` ran (counted by a profile hook, not a mock)."""
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is run_command.__code__:
            calls.append(frame)

    sys.setprofile(profile)
    try:
        status = attn(argv)
    finally:
        sys.setprofile(None)
    return status, len(calls)


def test_run_command_runs_once_per_command(tmp_path, capsys):
    assert run_command_calls(["preset", "bsae"]) == (2, 1)
    assert capsys.readouterr().err == "attn preset: error: unknown preset 'bsae'; did you mean 'base'?\n"
    assert run_command_calls(["average", str(tmp_path / "gone"), "--output_dir", str(tmp_path / "o")]) == (2, 1)
    assert run_command_calls(["trian"]) == (2, 1)
    assert run_command_calls([]) == (2, 1)  # no SystemExit of its own: the usage, then the one line
    assert capsys.readouterr().err.splitlines()[-1] == "attn: error: give a command (see attn --help)"


# Every command that reads a model folder, with MODEL in its place: the same mistake reads the same on each.
MODEL_COMMANDS = {
    "translate": ["translate", "--model", "{model}", "a sentence"],
    "evaluate": ["evaluate", "--model", "{model}"],
    "export": ["export", "{model}", "--onnx", "{out}"],
    "average": ["average", "{model}", "--output_dir", "{out}"],
    "convert": ["convert", "--to_marian", "{model}", "--to", "{out}"],
    "push": ["push", "--model", "{model}", "--repo_id", "me/model"],
    "serve": ["serve", "--model", "{model}", "--port", "0"],
    "score": ["score", "--model", "{model}"],
    "distill": [
        "distill",
        "--model",
        "{model}",
        "--data",
        "{out}",
        "--source_lang",
        "a",
        "--target_lang",
        "b",
        "--output_dir",
        "{out}",
    ],
    "explain": ["explain", "--model", "{model}", "a sentence", "--output", "{out}.html"],
}


def folder_mistakes(root: Path) -> list[tuple[str, str]]:
    """(MODEL, the one line's message): a folder that is nowhere, and `outputs/dtes` beside `outputs/dates`."""
    (root / "outputs" / "dates").mkdir(parents=True, exist_ok=True)
    return [
        (str(root / "gone"), f"{root / 'gone'}: no such model folder"),
        ("outputs/dtes", "outputs/dtes: no such model folder; did you mean outputs/dates?"),
    ]


@pytest.mark.parametrize("command", sorted(MODEL_COMMANDS))
def test_a_missing_and_a_mistyped_model_folder_read_the_same_on_every_command(command, tmp_path, monkeypatch, capsys):
    if command == "serve":
        pytest.importorskip("fastapi", reason="the serve extra's fastapi is not installed")
    monkeypatch.chdir(tmp_path)
    for model, message in folder_mistakes(tmp_path):
        argv = [argument.format(model=model, out=tmp_path / "out") for argument in MODEL_COMMANDS[command]]
        monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
        assert attn(argv) == 2
        assert capsys.readouterr().err == f"attn {command}: error: {message}\n"
        monkeypatch.setenv(DEBUG_VARIABLE, "1")
        assert attn(argv) == 2
        error = capsys.readouterr().err
        assert error.startswith("Traceback (most recent call last):"), error
        assert f"ModelFolderError: {message}\n" in error
        assert error.endswith(f"\nattn {command}: error: {message}\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["outputs"]  # nothing written


def test_the_folder_cases_cover_every_command_that_reads_a_model_folder():
    assert set(MODEL_COMMANDS) == set(COMMAND_NAMES) - {"train", "preset"}  # train: --model_name_or_path, validated


@pytest.mark.parametrize(("command", "debug"), [("export", "1"), ("translate", "")])
def test_the_attn_executable_reports_a_model_folder_mistake_in_the_same_line(command, debug, tmp_path):
    """The installed console script in a fresh process; ATTN_DEBUG=1 adds the traceback before the same line."""
    mistakes = folder_mistakes(tmp_path)
    model, message = mistakes[1] if debug else mistakes[0]
    argv = [argument.format(model=model, out=tmp_path / "out") for argument in MODEL_COMMANDS[command]]
    environment = {**os.environ, DEBUG_VARIABLE: debug, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    executable = Path(sys.executable).with_name("attn")
    done = subprocess.run(
        [str(executable), *argv], capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.endswith(f"attn {command}: error: {message}\n")
    assert done.stderr.startswith("Traceback (most recent call last):") == bool(debug), done.stderr
    if not debug:
        assert done.stderr == f"attn {command}: error: {message}\n"


def test_attn_debug_shows_the_traceback_of_argparse_own_errors_too(capsys, monkeypatch, tmp_path):
    """`CommandParser.error` (argparse's own errors) prints the reporter's line; under ATTN_DEBUG=1, after the
    traceback of argparse's exception. Without it, the line alone."""
    argv = ["export", str(tmp_path), "--ctranslate2", str(tmp_path / "out"), "--quantization", "int3"]
    line = "attn export: error: argument --quantization: invalid choice: 'int3'"
    for debug in ("1", ""):
        monkeypatch.setenv(DEBUG_VARIABLE, debug)
        with pytest.raises(SystemExit) as exit_info:
            attn(argv)
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert error.startswith("Traceback (most recent call last):") == bool(debug), error
        assert ("argparse.ArgumentError: argument --quantization" in error) == bool(debug)
        assert error.splitlines()[-1].startswith(line) and error.endswith(" (see attn export --help)\n")


def test_a_read_only_output_is_one_line_naming_it_on_every_command_that_writes(tmp_path, capsys):
    """A read-only file system (a tmpfs mounted ro; root only): the output named, exit 2, nothing written there."""
    model = tmp_path / "model"
    save_tiny_model(model, "attn_transformer")
    shutil.copytree(model, tmp_path / "copy")
    with small_tmpfs(tmp_path / "ro", "1m", read_only=True) as read_only:
        commands = {
            "train": ["train", "--output_dir", str(read_only / "run"), *TINY, "--max_steps", "1"],
            "translate": ["translate", "--model", str(model), "--output", str(read_only / "out.txt"), "hello"],
            "average": ["average", str(model), str(tmp_path / "copy"), "--output_dir", str(read_only / "avg")],
            "export": ["export", str(model), "--onnx", str(read_only / "onnx")],
            "explain": ["explain", "--model", str(model), "--output", str(read_only / "page.html"), "hello"],
        }
        named = {"translate": read_only, "explain": read_only}  # their file is staged beside the output: the folder
        for name, argv in commands.items():
            assert attn(argv) == 2, name
            err = capsys.readouterr().err.strip().splitlines()[-1]
            target = named.get(name) or next(argument for argument in argv if argument.startswith(str(read_only)))
            assert err == f"attn {name}: error: {target}: read-only file system; give an output in a writable folder"
        assert list(read_only.iterdir()) == []
