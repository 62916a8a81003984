"""The exports `attn` makes for its engines (`engines.py`) and keeps: one folder per weights, engine and exporter.

Where: `cache_root()`, the user's cache folder (`$ATTN_CACHE`, else `$XDG_CACHE_HOME/modeling-attn`, else
`~/.cache/modeling-attn`), under `exports/`; not in the model folder, which is often not ours to write (docs/export.md,
"Engines", says why). The key (`export_key`): SHA-256 over the model's weights, configs and tokenizer files, the engine
and the exporters' versions; new weights are a new entry. Hashes are memoised per file by (size, mtime, inode).
An entry is made whole or not at all (`cached_export`): staged in a folder of its own (its `.attn-export` marker
written first), its files' sizes and SHA-256 written into `attn-export.json`, then renamed into place; of two
processes making it at once the first rename wins. An entry is checked against its manifest before use and made
again when corrupt; a folder without the marker is not attn's: never deleted or written into (`ExportCacheError`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .errors import UserError

CACHE_ENV = "ATTN_CACHE"
MANIFEST_FILE = "attn-export.json"  # in an entry: what was exported, and each file's size and SHA-256
MARKER_FILE = ".attn-export"  # written first into every staging folder: this folder is attn's
EXPORT_SUBFOLDER = "export"  # the exporter writes here (CTranslate2's converter replaces its output folder whole)
STAGING_PREFIX = ".staging-"
HASHES_FILE = "hashes.json"
# The files of a model folder that make its translations: weights, configs, tokenizer (not its logs or results).
KEYED_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt", ".spm")
UNKEYED = {"trainer_state.json", "test_results.json", "train_results.json", "eval_results.json", "all_results.json"}
CHUNK = 1 << 22


class ExportCacheError(UserError, OSError):
    """The export cache cannot be used (a folder in it that attn did not write, a cache folder that cannot be
    written); the message names the folder and the way out."""


def cache_root() -> Path:
    """The folder that holds attn's exports (the module docstring)."""
    if os.environ.get(CACHE_ENV):
        base = Path(os.environ[CACHE_ENV]).expanduser()
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "modeling-attn"
    return base / "exports"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _keyed_files(model_dir: Path) -> list[Path]:
    """The files of `model_dir` (its top level and tokenizer subfolders) that the key covers, sorted."""
    found = []
    for path in sorted(model_dir.rglob("*")):
        relative = path.relative_to(model_dir)
        if not path.is_file() or path.name in UNKEYED or path.suffix not in KEYED_SUFFIXES:
            continue
        if any(part.startswith((".", "checkpoint-", "runs")) for part in relative.parts):
            continue  # attn's own records, Trainer's checkpoints and logs: not what this folder's model is
        found.append(path)
    return found


class _Hashes:
    """SHA-256 of files, memoised by (path, size, mtime, inode) in the cache's hashes.json (best effort: a cache
    folder that cannot be written only costs the hashing again)."""

    def __init__(self, root: Path):
        self.path = root / HASHES_FILE
        try:
            self.known = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.known = {}
        self.changed = False

    def of(self, path: Path) -> str:
        status = path.stat()
        stamp = [status.st_size, status.st_mtime_ns, status.st_ino]
        key = str(path.resolve())
        if (entry := self.known.get(key)) and entry[:3] == stamp:
            return entry[3]
        digest = _sha256(path)
        self.known[key], self.changed = [*stamp, digest], True
        return digest

    def save(self) -> None:
        if not self.changed:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, staged = tempfile.mkstemp(dir=self.path.parent, prefix=".hashes-")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(self.known, out)
            os.replace(staged, self.path)


def export_key(model_dir: str | Path, engine: str, versions: dict[str, str]) -> str:
    """The cache key of `engine`'s export of the model in `model_dir` by exporters of `versions` (module docstring)."""
    model_dir = Path(model_dir)
    hashes = _Hashes(cache_root())
    digest = hashlib.sha256(json.dumps({"engine": engine, "versions": versions}, sort_keys=True).encode())
    for path in _keyed_files(model_dir):
        digest.update(f"{path.relative_to(model_dir).as_posix()}\0{hashes.of(path)}\0".encode())
    hashes.save()
    return digest.hexdigest()


def _files(folder: Path) -> Iterable[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file() and path.name not in (MANIFEST_FILE,))


def _manifest(folder: Path, details: dict[str, Any]) -> dict[str, Any]:
    files = {path.relative_to(folder).as_posix(): [path.stat().st_size, _sha256(path)] for path in _files(folder)}
    return {**details, "files": files}


def check_entry(entry: Path) -> str | None:
    """None if `entry` is a whole export (its files as its manifest lists them), else what is wrong with it."""
    try:
        manifest = json.loads((entry / MANIFEST_FILE).read_text(encoding="utf-8"))
        listed = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable {MANIFEST_FILE}"
    present = {path.relative_to(entry).as_posix() for path in _files(entry)}
    if missing := sorted(set(listed) - present):
        return f"{missing[0]} is missing"
    if extra := sorted(present - set(listed)):
        return f"{extra[0]} was not part of the export"
    for name, (size, digest) in listed.items():
        path = entry / name
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, not {size}"
        if _sha256(path) != digest:
            return f"{name} was changed since it was exported"
    return None


def _remove_ours(folder: Path) -> None:
    """Delete `folder`, an entry or staging folder attn made (its marker says so): renamed aside first, so that no
    reader finds it half deleted."""
    aside = folder.with_name(f"{STAGING_PREFIX}{os.getpid()}-removed-{folder.name}")
    try:
        folder.rename(aside)
    except FileNotFoundError:
        return  # another process removed it
    shutil.rmtree(aside, ignore_errors=True)


def _clear_stale_staging(root: Path) -> None:
    """Remove the staging folders of processes that are gone (killed while exporting)."""
    from .outputs import _pid_alive

    for folder in root.glob(f"{STAGING_PREFIX}*"):
        pid = folder.name[len(STAGING_PREFIX) :].split("-", 1)[0]  # STAGING_PREFIX + "PID-..."
        if pid.isdigit() and not _pid_alive(int(pid)) and (folder / MARKER_FILE).is_file():
            shutil.rmtree(folder, ignore_errors=True)


def _not_ours(entry: Path) -> ExportCacheError:
    return ExportCacheError(
        f"{entry}: a folder in attn's export cache that attn did not write (no {MARKER_FILE}); it is left as it is: "
        f"move it away, or set {CACHE_ENV} to another folder"
    )


def _usable(entry: Path, on_remake: Callable[[str], None] | None) -> bool:
    """Whether `entry` holds a whole export to load; a broken one of attn's is removed (and `on_remake` told why)."""
    if not entry.exists():
        return False
    if not (entry / MARKER_FILE).is_file():
        raise _not_ours(entry)
    problem = check_entry(entry)
    if problem is None:
        return True
    if on_remake is not None:
        on_remake(f"{entry}: {problem}; exporting again")
    _remove_ours(entry)
    return False


def cached_export(
    name: str,
    make: Callable[[Path], Any],
    details: dict[str, Any],
    on_remake: Callable[[str], None] | None = None,
) -> Path:
    """The folder of the cache entry `name` (`ENGINE-KEY`) holding an export: the existing one when it is whole,
    else one made now by `make(folder)` (which writes the export into the empty `folder`). `details` go into the
    manifest (model, engine, versions). The export itself is `entry / EXPORT_SUBFOLDER`."""
    root = cache_root()
    entry = root / name
    if _usable(entry, on_remake):
        return entry
    try:
        root.mkdir(parents=True, exist_ok=True)
        _clear_stale_staging(root)
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f"{STAGING_PREFIX}{os.getpid()}-{name[:24]}-"))
    except OSError as error:
        raise ExportCacheError(
            f"{root}: the export cache cannot be written ({error.strerror or error}); set {CACHE_ENV} to a folder "
            "this user can write, or use --engine torch"
        ) from None
    try:
        (staging / MARKER_FILE).write_text("written by modeling-attn's export cache\n", encoding="utf-8")
        make(staging / EXPORT_SUBFOLDER)
        manifest = _manifest(staging, details)
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        try:
            staging.rename(entry)
        except OSError:  # another process put its whole export there first (or left a folder that is not attn's)
            if not _usable(entry, on_remake):  # a broken one, removed now
                staging.rename(entry)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return entry


__all__ = [
    "CACHE_ENV",
    "EXPORT_SUBFOLDER",
    "MANIFEST_FILE",
    "MARKER_FILE",
    "ExportCacheError",
    "cache_root",
    "cached_export",
    "check_entry",
    "export_key",
]
