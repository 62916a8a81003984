"""A real full disk for tests: a small tmpfs mounted on a folder (root only; the test is skipped otherwise)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """`path` (created) with a tmpfs of `size` (e.g. "256k"; `read_only`: mounted ro) on it for the block; pytest.skip
    with the reason where it cannot be mounted (not root, no mount)."""
    path.mkdir()
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}" + (",ro" if read_only else ""), "tmpfs", str(path)],
            capture_output=True,
        )
    except OSError as error:
        pytest.skip(f"cannot mount a tmpfs (a real full or read-only disk): {error}")
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {result.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
