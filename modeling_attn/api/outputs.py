"""One safe way to write outputs, for every command and the Python API that writes files.

What it promises (docs/reliability.md explains each and lists the tests behind it):
1. Whole or not at all: a file is written beside its target and renamed into place (`output_file`); a folder's files
   are staged beside it and moved into place when the writer has finished (`output_folder`).
2. Never an input: an output that is one of the command's inputs, or lies inside one, is refused (`check_apart`).
3. Never what it did not write, nor another model: a folder output remembers what it wrote and which command, from
   which inputs, wrote it (`.attn-written.json`); any other file, or files of another writer (another run, another
   model), make the write refused unless `force=True`, and nothing is ever deleted. An existing output file is
   replaced only with `overwrite=True`, except files this package wrote there and nobody changed since (recorded in
   folders it owns, or in the user's state folder: `written_files_record`; never beside a lone output file).
4. One writer per folder: a lock file (`.attn.lock`) held for the time of the write.
5. A place that cannot be written is named with the way out (`not_writable`): a full disk (`is_disk_full`; the target
   left as it was), a read-only file system, a folder the user may not write.
A writer that writes into its folder itself (Trainer, for `attn train --output_dir`) records what it wrote with
`record_written`. Every refusal is an `OutputError` (a `ValueError`: the commands print it as their one-line error).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from .errors import UserError

MANIFEST = ".attn-written.json"
PARTIAL_SUFFIX = ".partial"  # `output_file`'s staging file beside its target: `.NAME.RANDOM.partial`
LOCK = ".attn.lock"
PathLike = str | os.PathLike


class OutputError(UserError, ValueError):
    """An output that cannot be written as asked; the message names the path(s) and the way out."""


def check_apart(output: PathLike, inputs: Mapping[str, PathLike | None], output_name: str = "--output") -> None:
    """Refuse an output that is one of `inputs` (name -> path, e.g. {"--model": "runs/a"}) or lies inside one. (A
    folder output that holds an input is left to `output_folder`: it never deletes, and refuses a folder holding files
    it did not write unless told.)"""
    target = Path(output).resolve()
    for name, path in inputs.items():
        if path is None:
            continue
        source = Path(path).resolve()
        if target == source:
            raise OutputError(f"{output_name} {output} is {name} {path}: writing it would destroy the input")
        if source in target.parents:
            raise OutputError(f"{output_name} {output} is inside {name} {path}: write it somewhere else")


def _stamp(path: Path) -> list[int]:
    status = path.stat()
    return [status.st_size, status.st_mtime_ns]


def _read_record(path: Path) -> dict:
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        files = {str(name): list(stamp) for name, stamp in recorded.get("files", {}).items()}
        writer = recorded.get("writer")
        return {"files": files, "writer": writer if isinstance(writer, dict) else None}
    except (OSError, ValueError, AttributeError, TypeError):
        return {"files": {}, "writer": None}  # no record, or one that cannot be trusted: every file counts as not ours


def _read_manifest(folder: Path) -> dict[str, list[int]]:
    return _read_record(folder / MANIFEST)["files"]


def written_files_record() -> Path:
    """Where the outputs written outside a folder this package owns are recorded (a lone `--output` file): the user's
    state folder (`$XDG_STATE_HOME`, default ~/.local/state), so that nothing is left beside the file."""
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "modeling-attn" / "written-files.json"


def written_by_us(folder: PathLike, name: str) -> bool:
    """Whether `folder/name` is a file this package wrote there and nobody has changed since."""
    path = Path(folder) / name
    if not path.is_file():
        return False
    if (Path(folder) / MANIFEST).is_file():
        return _read_manifest(Path(folder)).get(name) == _stamp(path)
    return _read_record(written_files_record())["files"].get(str(path.resolve())) == _stamp(path)


def foreign_files(folder: PathLike) -> list[str]:
    """The files under `folder` (relative names) that this package did not write, or that changed since it did."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    names = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file() or path.is_symlink())
    return [name for name in names if name not in (MANIFEST, LOCK) and not written_by_us(folder, name)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


@contextlib.contextmanager
def folder_lock(folder: PathLike, command: str) -> Iterator[None]:
    """Hold `folder/.attn.lock` for the block; OutputError naming the holder's pid when another live process holds
    it. A lock left by a process that no longer runs is taken over."""
    path = Path(folder) / LOCK
    record = json.dumps({"pid": os.getpid(), "command": command})
    for _ in range(2):
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = json.loads(path.read_text(encoding="utf-8"))
                pid = int(holder["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                raise OutputError(
                    f"{folder} is locked by {path}, which cannot be read; delete it if no command is writing there"
                ) from None
            if pid != os.getpid() and _pid_alive(pid):
                raise _in_use(folder, pid, holder) from None
            path.unlink(missing_ok=True)  # its process is gone
            continue
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(record)
        break
    else:
        raise OutputError(f"{folder}: cannot take the lock {path}")
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _in_use(folder: PathLike, pid: int, holder: dict) -> OutputError:
    return OutputError(
        f"{folder} is in use by process {pid} ({holder.get('command', 'another command')}); wait for it to end, or "
        "write somewhere else"
    )


def check_not_in_use(folder: PathLike) -> None:
    """Before any work, what `folder_lock` would refuse: OutputError naming the pid of a live process that holds
    `folder`'s lock. A lock left behind by a process that no longer runs (a command of this package killed with
    SIGKILL, before it could record what it wrote) makes the files changed since that lock was taken count as
    written by this package (`record_written`)."""
    path = Path(folder) / LOCK
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        pid, taken = int(holder["pid"]), path.stat().st_mtime_ns
    except (OSError, ValueError, KeyError, TypeError):  # no lock; or one folder_lock names as unreadable
        return
    if pid != os.getpid() and _pid_alive(pid):
        raise _in_use(folder, pid, holder)
    record_written(folder, taken)


def is_disk_full(error: BaseException, folder: PathLike) -> bool:
    """Whether `error`, raised while writing under `folder`, is a full disk: ENOSPC, a writer that says it in words
    (safetensors: "No space left on device (os error 28)"), or torch.save's writer failing without a cause (its
    `[enforce fail at inline_container.cc]`) on a file system with less than 1 MiB left."""
    if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or "No space left on device" in str(error):
        return True
    if isinstance(error, RuntimeError) and "inline_container" in str(error):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(folder).free < 1 << 20
    return False


def not_writable(error: BaseException, output: PathLike) -> OutputError | None:
    """`error`, raised while writing `output`, as the one line that names where and what to do, if it says that the
    output's place cannot be written: a full disk (`is_disk_full`), a read-only file system, no permission to write
    there. None for any other error. A read-only or forbidden place is named by the path the error names, its
    staging file or folder read as the folder it was written into (`output_of`); a full disk by the output."""
    output = Path(output)
    if isinstance(error, UserError):  # named already (attn train's full disk names the last whole checkpoint)
        return None
    if is_disk_full(error, output if output.exists() else output.parent):
        return OutputError(
            f"No space left on device while writing {output} (left as it was); free some space there, or give an "
            "output on another disk"
        )
    refused = isinstance(error, OSError) and error.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    if not refused or not error.filename or not _writes_to(Path(error.filename), output):
        return None  # e.g. an input the command could not read: not a write
    where = output_of(error.filename)
    where = output if any(_is_staging(path, output) for path in where.parents) else where
    if error.errno == errno.EROFS:
        return OutputError(f"{where}: read-only file system; give an output in a writable folder")
    return OutputError(f"{where}: no permission to write there; give an output in a folder you can write")


def _is_staging(path: Path, output: Path) -> bool:
    """Whether `path` is a staging file or folder of `output` (`.NAME.` beside it: `output_file`, `output_folder`)."""
    return path.absolute().parent == output.absolute().parent and path.name.startswith(f".{output.name}.")


def _writes_to(path: Path, output: Path) -> bool:
    """Whether `path` is where a write of `output` goes: the output, a folder above it (created for it), a file inside
    it, or its staging file or folder beside it, with what is inside."""
    path, output = path.absolute(), output.absolute()
    if path == output or path in output.parents or output in path.parents:
        return True
    return any(_is_staging(place, output) for place in (path, *path.parents))


def describe_files(names: list[str]) -> str:
    """Relative file names as a short list for a message: their top-level entries (a folder once, not each of its
    files), code files last, three shown and the count of the others."""
    entries = sorted(
        {name.split("/")[0] + ("/" if "/" in name else "") for name in names},
        key=lambda entry: (entry.endswith(".py"), entry),
    )
    return ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")


def record_written(folder: PathLike, since_ns: int, command: str = "attn train") -> None:
    """Record as written by this package every file under `folder` changed at or after `since_ns` (a file-system
    time, e.g. the mtime of the writer's lock), for a writer (`command`) that writes into `folder` itself."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    names = [str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()]
    changed = [name for name in names if name not in (MANIFEST, LOCK) and _stamp(folder / name)[1] >= since_ns]
    _record(folder, changed, writer(command, {"--output_dir": folder}))


def writer(command: str, inputs: Mapping[str, PathLike | None]) -> dict:
    """Who writes a folder: the command and its inputs (resolved paths, or Hub ids as given)."""
    named = {name: _identity(path) for name, path in inputs.items() if path is not None}
    return {"command": command, "inputs": dict(sorted(named.items()))}


def _identity(path: PathLike) -> str:
    return str(Path(path).resolve()) if Path(path).exists() else str(path)


def _describe_writer(recorded: dict | None) -> str:
    if not recorded or not isinstance(recorded.get("inputs"), dict):
        return "an earlier attn command"
    inputs = " ".join(f"{name} {path}" if name.startswith("--") else path for name, path in recorded["inputs"].items())
    return f"`{recorded.get('command')}{' ' + inputs if inputs else ''}`"


def _record(folder: Path, names: list[str], by: dict | None = None) -> None:
    record = _read_record(folder / MANIFEST)
    recorded = {**record["files"], **{name: _stamp(folder / name) for name in names}}
    recorded = {name: stamp for name, stamp in recorded.items() if (folder / name).is_file()}
    content = {"files": recorded, "writer": by or record["writer"]}
    with output_file(folder / MANIFEST, overwrite=True, record=False) as handle:
        json.dump(content, handle, indent=1, sort_keys=True)


RECORDED_FILES = 1000  # the most lone output files the user's record remembers (the newest kept)


def _record_lone_file(path: Path) -> None:
    """Record `path`, written outside a folder this package owns, in the user's record (`written_files_record`).
    A record that cannot be written only means that the next write asks for --overwrite."""
    record_path = written_files_record()
    recorded = _read_record(record_path)["files"]
    recorded[str(path.resolve())] = _stamp(path)
    kept = {name: stamp for name, stamp in recorded.items() if Path(name).is_file() and _stamp(Path(name)) == stamp}
    kept = dict(sorted(kept.items(), key=lambda item: item[1][1])[-RECORDED_FILES:])
    with contextlib.suppress(OSError):
        record_path.parent.mkdir(parents=True, exist_ok=True)
        with output_file(record_path, overwrite=True, record=False) as handle:
            json.dump({"files": kept}, handle, indent=1, sort_keys=True)


@contextlib.contextmanager
def output_folder(
    path: PathLike,
    command: str,
    inputs: Mapping[str, PathLike | None] | None = None,
    force: bool = False,
    output_name: str = "--output_dir",
    sources: Mapping[str, PathLike | None] | None = None,
) -> Iterator[Path]:
    """A staging folder to write into; when the block ends without an error, its files replace those of `path`.

    Refused before the block runs (OutputError): `path` is an input or lies inside one; it is a file; it
    holds files this package did not write (unless `force`); another process is writing it. Nothing at `path` is
    deleted: files of `path` that the block did not write stay as they were. It also refuses a folder another writer
    filled (another command, or the same one from other inputs: another model), unless `force`. `sources`: the
    inputs that name the writer, when they differ from `inputs` (default: `inputs`).
    """
    target = Path(path)
    check_apart(target, inputs or {}, output_name)
    if target.exists() and not target.is_dir():
        raise OutputError(f"{output_name} {path} is a file; give a folder")
    if not force and (foreign := foreign_files(target)):
        raise OutputError(
            f"{output_name} {path} holds files that {command} did not write ({describe_files(foreign)}); choose an "
            "empty or new folder, or pass --force to replace only the files it writes"
        )
    this_writer = writer(command, (inputs or {}) if sources is None else sources)
    record = _read_record(target / MANIFEST)
    if not force and record["files"] and record["writer"] != this_writer:
        raise OutputError(
            f"{output_name} {path} holds another model, written by {_describe_writer(record['writer'])} "
            f"({describe_files(sorted(record['files']))}); choose an empty or new folder, or pass --force to replace "
            "its files"
        )
    created = missing_folders(target)
    try:
        target.mkdir(parents=True, exist_ok=True)
        with folder_lock(target, command):
            staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.staging-"))
            try:
                yield staging
                _move_into(staging, target, this_writer)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except BaseException as error:  # safetensors says a full disk in a SafetensorError, torch.save in a RuntimeError
        remove_unused_folders(created)
        if (refused := not_writable(error, target)) is not None:
            raise refused from error
        raise


def missing_folders(path: PathLike) -> list[Path]:
    """`path` and the folders above it that do not exist yet, deepest first: what writing `path` will create."""
    path = Path(path)
    return [folder for folder in (path, *path.parents) if not folder.exists()]


def remove_unused_folders(created: list[Path]) -> None:
    """The folders a command created (`missing_folders`, deepest first), removed if it wrote nothing into them but
    its own record and lock: a command that fails before writing leaves no folder behind."""
    for folder in created:
        if not folder.is_dir():
            continue  # never made (the command failed on its way down)
        if any(entry.name not in (MANIFEST, LOCK) for entry in folder.iterdir()):
            return
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()


def _move_into(staging: Path, target: Path, by: dict) -> None:
    """Each file of `staging` renamed into the same place under `target` (same file system: atomic per file)."""
    written = []
    for source in sorted(staging.rglob("*")):
        if source.is_dir():
            continue
        name = source.relative_to(staging)
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target / name)
        written.append(str(name))
    _record(target, written, by)


def check_output_file(
    path: PathLike,
    inputs: Mapping[str, PathLike | None] | None = None,
    overwrite: bool = False,
    output_name: str = "--output",
) -> None:
    """The refusals of `output_file`, without writing: for a command to check its outputs before any work."""
    target = Path(path)
    check_apart(target, inputs or {}, output_name)
    if target.is_dir():
        raise OutputError(f"{output_name} {path} is a folder, not a file to write")
    if not target.parent.is_dir():
        raise OutputError(f"{output_name} {path}: the folder {target.parent} does not exist")
    if target.exists() and not overwrite and not written_by_us(target.parent, target.name):
        raise OutputError(f"{output_name} {path} already exists; pass --overwrite to replace it")


@contextlib.contextmanager
def output_file(
    path: PathLike,
    inputs: Mapping[str, PathLike | None] | None = None,
    overwrite: bool = False,
    output_name: str = "--output",
    binary: bool = False,
    record: bool = True,
) -> Iterator[IO]:
    """A file that appears at `path` only once the block has finished without an error (written as a hidden
    temporary file in the same folder, then renamed into place; an existing file keeps its permissions).

    Refused before the block runs (OutputError): `path` is or is inside an input; it is a folder; its folder does
    not exist; it exists and was not written by this package (unless `overwrite`)."""
    target = Path(path)
    check_output_file(target, inputs, overwrite, output_name)
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask()
    try:
        handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below, before the rename)
            "wb" if binary else "w",
            encoding=None if binary else "utf-8",
            dir=target.parent,
            prefix=f".{target.name}.",
            suffix=PARTIAL_SUFFIX,
            delete=False,
        )
    except OSError as error:
        if (refused := not_writable(error, target)) is not None:
            raise refused from error
        raise
    try:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.chmod(handle.name, mode)
        os.replace(handle.name, target)
        if record and (target.parent / MANIFEST).is_file():  # a folder this package owns
            _record(target.parent, [target.name])
        elif record:
            _record_lone_file(target)
    except Exception as error:
        if (refused := not_writable(error, target)) is not None:
            raise refused from error
        raise
    finally:
        with contextlib.suppress(OSError):  # closing flushes again: on a full disk, the same error a second time
            handle.close()
        Path(handle.name).unlink(missing_ok=True)


def output_of(path: PathLike) -> Path:
    """The output a path this module writes belongs to: for a staging file of `output_file` or a staging folder of
    `output_folder` (hidden, beside the target), the folder they were written into; else the path itself."""
    path = Path(path)
    staged = path.name.startswith(".") and (path.name.endswith(PARTIAL_SUFFIX) or ".staging-" in path.name)
    return path.parent if staged else path


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def command_line() -> str:
    """The running command, for lock records (`attn average`, `python -m modeling_attn.training`)."""
    return " ".join(Path(sys.argv[0]).name.split()[:1] + sys.argv[1:2]) or "python"


__all__ = [
    "LOCK",
    "MANIFEST",
    "PARTIAL_SUFFIX",
    "OutputError",
    "check_apart",
    "check_not_in_use",
    "check_output_file",
    "command_line",
    "describe_files",
    "folder_lock",
    "foreign_files",
    "is_disk_full",
    "missing_folders",
    "not_writable",
    "output_file",
    "output_of",
    "output_folder",
    "record_written",
    "remove_unused_folders",
    "written_by_us",
]
