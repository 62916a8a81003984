"""Run Python code in a fresh process where `modeling_attn` cannot be imported.

This is how a user who never installed the package loads a checkpoint with `trust_remote_code=True`:
only the code files saved beside the weights may be used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

_BLOCK_PACKAGE = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "modeling_attn" or name.startswith("modeling_attn."):
            raise ModuleNotFoundError(f"{name} is blocked: this process must load code from the checkpoint only")
sys.meta_path.insert(0, _Block())
try:
    import modeling_attn  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("modeling_attn is importable; the isolation is broken")
"""


def run_isolated(code: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 300):
    """Run `code` with modeling_attn blocked, in `cwd`, with an empty HF cache; return what it printed as JSON.

    The code must print exactly one JSON document on its last stdout line.
    """
    full_env = {**os.environ, "HF_HOME": str(Path(cwd) / "hf_home"), "HF_HUB_OFFLINE": "1", **(env or {})}
    full_env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_PACKAGE + textwrap.dedent(code)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"isolated process failed ({result.returncode}):\n{result.stderr[-4000:]}")
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as error:
        raise AssertionError(f"isolated process printed no JSON last:\n{result.stdout[:3000]}") from error
