"""How every `attn` command ends: its exit status, a user error in one line, a bug with its traceback.

`run_command` is the one reporter; each command's `main` runs it once. It catches our `UserError`
(`modeling_attn.api.errors`) and the library exceptions of `INPUT_ERRORS`, which mean bad input (a file that cannot
be read, a Hub repository that does not exist), and reports each as one line, `attn COMMAND: error: ...`, with exit
status 2. Every other exception is a bug: it goes on with its traceback (exit status 1). `ATTN_DEBUG=1` prints the
traceback of a user error too, as `HF_DEBUG=1` does for the huggingface_hub CLI, whose `cli/_errors.py` this follows.
`print_user_error` is that one line's format, which argparse's own errors (`parser.CommandParser.error`) share: an
error in the command line itself (those, and `CommandLineError`) ends with `(see attn COMMAND --help)`.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    LocalTokenNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    StrictDataclassError,
)
from safetensors import SafetensorError

from ..api.errors import CommandLineError, UserError, hub_transport_error, unreachable_hub
from ..api.outputs import not_writable

DEBUG_VARIABLE = "ATTN_DEBUG"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _unreadable_file(error: OSError) -> str:
    return f"{error.filename}: {error.strerror.lower()}" if error.filename else _first_line(error)


def _not_permitted(error: PermissionError) -> str:
    """A file or folder the user may not read; else a write refused outside `api/outputs.py` (which names its own,
    `outputs.not_writable`), e.g. into a cache."""
    if not error.filename:
        return _first_line(error)
    path = Path(error.filename)
    try:
        if path.is_dir():
            os.listdir(path)
        else:
            path.open("rb").close()
    except PermissionError:
        return f"{path}: no permission to read it; ask its owner for read access, or give a copy you can read"
    except OSError:
        pass  # not there: a write was refused
    return f"{path}: no permission to write there; check the permissions of its folder"


def _invalid_config(error: StrictDataclassError) -> str:
    # "Class validation error for validator ...:\n    ValueError: <what>": the last line says what
    reason = str(error).strip().splitlines()[-1].strip().removeprefix("ValueError: ")
    return f"invalid config: {reason}"


# Library exceptions that mean bad input, and their one line; the first class an error is an instance of wins.
INPUT_ERRORS: dict[type[BaseException], Callable] = {
    UserError: lambda error: " ".join(str(error).split()),
    GatedRepoError: lambda error: f"a gated Hub repository; ask for access first ({_first_line(error)})",
    RevisionNotFoundError: lambda error: f"no such revision on the Hub ({_first_line(error)})",
    RepositoryNotFoundError: lambda error: f"no such Hub repository, or no access to it ({_first_line(error)})",
    LocalTokenNotFoundError: lambda error: "not logged in to the Hub: run `hf auth login`, or give --token",
    OfflineModeIsEnabled: lambda error: str(unreachable_hub(error)),
    LocalEntryNotFoundError: lambda error: f"not found locally and the Hub cannot be reached ({_first_line(error)})",
    HfHubHTTPError: lambda error: f"the Hub refused: {_first_line(error)}",
    HFValidationError: lambda error: f"not a folder or a Hub repository id: {_first_line(error)}",
    StrictDataclassError: _invalid_config,
    SafetensorError: lambda error: f"unreadable safetensors weights ({_first_line(error)})",
    FileNotFoundError: _unreadable_file,
    IsADirectoryError: _unreadable_file,
    NotADirectoryError: _unreadable_file,
    PermissionError: _not_permitted,
}


def user_error_line(error: BaseException) -> str | None:
    """The one line that reports `error` to the user, or None if it is not a user error (a bug)."""
    for kind, describe in INPUT_ERRORS.items():
        if isinstance(error, kind):
            return describe(error)
    if isinstance(error, OSError) and error.errno == errno.EROFS and error.filename:  # a write outside api/outputs.py
        return str(not_writable(error, error.filename))
    if isinstance(error, hub_transport_error()):  # a Hub call outside `push_to_hub` with no network
        return str(unreachable_hub(error))
    return None


def debugging() -> bool:
    """Whether `ATTN_DEBUG` asks for the traceback of user errors."""
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def print_user_error(prog: str, line: str, see_help: bool = False) -> None:
    """`PROG: error: LINE` on stderr, the one format of a user error on every route (`see_help`: an error in the
    command line itself, which `PROG --help` answers), after the traceback of the exception being handled, if any,
    when `ATTN_DEBUG` is set."""
    if debugging() and sys.exc_info()[1] is not None:
        traceback.print_exc()
    print(f"{prog}: error: {line}" + (f" (see {prog} --help)" if see_help else ""), file=sys.stderr)


def run_command(prog: str, command: Callable[[], int]) -> int:
    """`command()`'s exit status, or: a user error (see the module docstring) as one line on stderr with 2; Ctrl-C as
    `PROG: interrupted` with 130; a reader that went away (`attn translate ... | head`) quietly with 141 (128 +
    SIGPIPE), as Unix tools do. Anything else raises, with its traceback."""
    try:
        return command()
    except BrokenPipeError:
        # Python's recipe: point stdout at devnull so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt as interruption:  # its message, if any, says how to go on (attn train's)
        print(f"{prog}: interrupted" + (f" {interruption}" if str(interruption) else ""), file=sys.stderr)
        return 130
    except Exception as error:
        line = user_error_line(error)
        if line is None:
            raise
        print_user_error(prog, line, see_help=isinstance(error, CommandLineError))
        return 2


__all__ = ["DEBUG_VARIABLE", "INPUT_ERRORS", "debugging", "print_user_error", "run_command", "user_error_line"]
