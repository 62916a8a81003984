"""One safe way to write outputs, for every command and the Python API that writes files.

What it promises (docs/reliability.md lists the tests behind each):

1. **Whole or not at all.** A file appears at its path only once it is complete: it is written beside the target (a
   hidden temporary in the same folder) and renamed into place (`output_file`). A folder's files are written into a
   staging folder beside it and moved into place only when the writer has finished (`output_folder`); an error or
   a kill leaves the target as it was.
2. **Never an input.** An output that is one of the command's inputs, or lies inside one, is refused before any
   work, naming both paths (`check_apart`).
3. **Never what it did not write.** A folder output remembers what it wrote (`.attn-written.json`: each file's size
   and modification time). A later write may replace those files; any other file in the folder (another model, a
   README, results, a file of ours edited since) makes the write refused, naming it, unless the caller says
   `force=True`; then only the files the command writes are replaced, and nothing is ever deleted. An existing
   output file is replaced only with `overwrite=True` (its flag: `--overwrite`), except files this package wrote
   there and nobody changed since.
4. **One writer per folder.** A lock file (`.attn.lock`, holding the writer's pid and command) is taken for the
   time of the write; a second writer is refused with the first one's pid; a lock whose process is gone is taken
   over.
5. **A full disk is named.** ENOSPC while writing becomes "No space left on device", naming the folder, with the
   target left as it was (`is_disk_full` also knows the writers that do not raise ENOSPC: safetensors' words,
   torch.save's `inline_container.cc` on a full file system).

A writer that writes into its folder itself (Trainer, for `attn train --output_dir`) records what it wrote with
`record_written` (every file changed since its start), so that `foreign_files` tells its files from the user's.

Every refusal is an `OutputError` (a `ValueError`: the commands print it as their one-line error).
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

MANIFEST = ".attn-written.json"
LOCK = ".attn.lock"
PathLike = str | os.PathLike


class OutputError(ValueError):
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


def _read_manifest(folder: Path) -> dict[str, list[int]]:
    try:
        recorded = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        return {str(name): list(stamp) for name, stamp in recorded.get("files", {}).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}  # no record, or one that cannot be trusted: every file counts as not ours


def written_by_us(folder: PathLike, name: str) -> bool:
    """Whether `folder/name` is a file this package wrote there and nobody has changed since."""
    path = Path(folder) / name
    return path.is_file() and _read_manifest(Path(folder)).get(name) == _stamp(path)


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


def _disk_full(error: OSError, where: Path) -> OutputError | None:
    if is_disk_full(error, where.parent if not where.exists() else where):
        return OutputError(f"No space left on device while writing {where}; it was left as it was")
    return None


def describe_files(names: list[str]) -> str:
    """Relative file names as a short list for a message: their top-level entries (a folder once, not each of its
    files), code files last, three shown and the count of the others."""
    entries = sorted(
        {name.split("/")[0] + ("/" if "/" in name else "") for name in names},
        key=lambda entry: (entry.endswith(".py"), entry),
    )
    return ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")


def record_written(folder: PathLike, since_ns: int) -> None:
    """Record as written by this package every file under `folder` changed at or after `since_ns` (a file-system
    time, e.g. the mtime of the writer's lock), for a writer that writes into `folder` itself."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    names = [str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()]
    _record(folder, [name for name in names if name not in (MANIFEST, LOCK) and _stamp(folder / name)[1] >= since_ns])


def _record(folder: Path, names: list[str]) -> None:
    recorded = _read_manifest(folder)
    recorded.update({name: _stamp(folder / name) for name in names})
    recorded = {name: stamp for name, stamp in recorded.items() if (folder / name).is_file()}
    with output_file(folder / MANIFEST, overwrite=True, record=False) as handle:
        json.dump({"files": recorded}, handle, indent=1, sort_keys=True)


@contextlib.contextmanager
def output_folder(
    path: PathLike,
    command: str,
    inputs: Mapping[str, PathLike | None] | None = None,
    force: bool = False,
    output_name: str = "--output_dir",
) -> Iterator[Path]:
    """A staging folder to write into; when the block ends without an error, its files replace those of `path`.

    Refused before the block runs (OutputError): `path` is an input or lies inside one; it is a file; it
    holds files this package did not write (unless `force`); another process is writing it. Nothing at `path` is
    deleted: files of `path` that the block did not write stay as they were.
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
    created = not target.exists()
    try:
        target.mkdir(parents=True, exist_ok=True)
        with folder_lock(target, command):
            staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.staging-"))
            try:
                yield staging
                _move_into(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:
        raise _disk_full(error, target) or error from error
    finally:
        if created and target.is_dir() and not any(target.iterdir()):
            target.rmdir()  # a folder this call created and never filled


def _move_into(staging: Path, target: Path) -> None:
    """Each file of `staging` renamed into the same place under `target` (same file system: atomic per file)."""
    written = []
    for source in sorted(staging.rglob("*")):
        if source.is_dir():
            continue
        name = source.relative_to(staging)
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target / name)
        written.append(str(name))
    _record(target, written)


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
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below, before the rename)
        "wb" if binary else "w",
        encoding=None if binary else "utf-8",
        dir=target.parent,
        prefix=f".{target.name}.",
        suffix=".partial",
        delete=False,
    )
    try:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.chmod(handle.name, mode)
        os.replace(handle.name, target)
        if record:
            _record(target.parent, [target.name])
    except OSError as error:
        raise _disk_full(error, target) or error from error
    finally:
        handle.close()
        Path(handle.name).unlink(missing_ok=True)


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
    "OutputError",
    "check_apart",
    "check_not_in_use",
    "check_output_file",
    "command_line",
    "describe_files",
    "folder_lock",
    "foreign_files",
    "is_disk_full",
    "output_file",
    "output_folder",
    "record_written",
    "written_by_us",
]
