"""The one reporter of every `attn` command (modeling_attn/cli/report.py): a user error in one line with exit status 2,
a bug with its traceback and exit status 1, `ATTN_DEBUG=1`, Ctrl-C (130) and a reader that went away (141)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from huggingface_hub.errors import RepositoryNotFoundError
from test_reliability_messages import TINY_RUN

from modeling_attn.api.corpus import DataError
from modeling_attn.api.errors import FlagError, UserError
from modeling_attn.api.model_folder import ModelFolderError
from modeling_attn.cli.report import DEBUG_VARIABLE, run_command, user_error_line

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


def test_library_exceptions_that_mean_bad_input_get_one_line_of_ours():
    missing = FileNotFoundError(2, "No such file or directory", "corpus/train.de")
    assert user_error_line(missing) == "corpus/train.de: no such file or directory"
    denied = PermissionError(13, "Permission denied", "/etc/shadow")
    assert user_error_line(denied) == "/etc/shadow: permission denied"
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


def test_every_command_reports_through_the_one_reporter():
    """No command prints its own error and returns 2, nor hands exception text to parser.error."""
    for path in sorted(COMMANDS.glob("*.py")):
        if path.name in ("report.py", "parser.py", "__init__.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and node.value.value == 2:
                pytest.fail(f"{path.name}:{node.lineno}: a bare `return 2`; raise a UserError instead")
            if isinstance(node, ast.ExceptHandler) and node.name:
                for call in ast.walk(node):
                    on_text = any(isinstance(name, ast.Name) and name.id == node.name for name in ast.walk(call))
                    if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "error" and on_text:
                        pytest.fail(f"{path.name}:{call.lineno}: parser.error on exception text")
        main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
        called = {getattr(n.func, "id", None) for n in ast.walk(main) if isinstance(n, ast.Call)}
        assert "run_command" in called, f"{path.name}: main does not report through run_command"
