"""transformers' own common model tests, taken from the sdist of the installed transformers version.

`load_common_tests()` downloads `transformers==<installed version>` as a source distribution once (with
pip, from the package index pip is configured for), extracts its `tests/` folder into
`.cache/transformers-tests/<version>/tests/` at the repository root (git-ignored) and imports the files from
there under the package name `_transformers_sdist_tests`, so that they never collide with this repository's
own `tests/` folder, which is not a package.

The sdist ships only the top-level files of transformers' `tests/` folder. Three modules those files import
relatively are missing from it, and this module stands in for them (a stand-in is used only while the
extracted tree lacks the real file):

- `exporters/test_export.py` (`ExportTesterMixin`, the base class of `ModelTesterMixin`): an empty mixin, so
  the `torch.export` tests are not run.
- `generation/test_utils.py` (`GenerationTesterMixin`): a marker class that no test class inherits.
  `GENERATION_TESTER_SHIPPED` tells the test module whether the real mixin is available.
- `utils/test_configuration_utils.py` (`config_common_kwargs`, used by `ConfigTester.check_config_arguments_init`):
  rebuilt here as non-default values for every field of the installed `PreTrainedConfig`, and checked
  against those fields so that a transformers upgrade that adds one fails loudly instead of testing less.

Set `TRANSFORMERS_SDIST_TESTS_DIR` to an already extracted `tests/` folder (with an `__init__.py`, as this
module writes one) to skip the download, e.g. offline.
"""

from __future__ import annotations

import dataclasses
import fcntl
import importlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

import transformers

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_ROOT = REPO_ROOT / ".cache" / "transformers-tests"
PACKAGE = "_transformers_sdist_tests"
GENERATION_TESTER_SHIPPED: bool | None = None  # set by load_common_tests()


def _download_and_extract(version: str, target: Path) -> None:
    """pip-download the sdist of transformers `version` and extract its tests/ folder to `target`/tests."""
    with tempfile.TemporaryDirectory(prefix="transformers-sdist-") as download_dir:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"transformers=={version}",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            "-d",
            download_dir,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        archives = list(Path(download_dir).glob("transformers-*.tar.gz"))
        if result.returncode != 0 or len(archives) != 1:
            raise RuntimeError(
                f"could not download the transformers {version} sdist (needed for transformers' common model "
                f"tests) with `{' '.join(command)}`:\n{result.stdout}\n{result.stderr}"
            )
        prefix = f"{archives[0].name.removesuffix('.tar.gz')}/tests/"
        with tempfile.TemporaryDirectory(prefix=".extract-", dir=target) as staging:
            with tarfile.open(archives[0]) as archive:
                members = [m for m in archive.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
                if not any(m.name == f"{prefix}test_modeling_common.py" for m in members):
                    raise RuntimeError(f"{archives[0].name} has no tests/test_modeling_common.py")
                for member in members:
                    member.name = "tests/" + member.name[len(prefix) :]
                archive.extractall(staging, members=members, filter="data")
            tests_dir = Path(staging) / "tests"
            # transformers' tests/ is a package (test_configuration_common.py even imports its own folder as
            # one); the sdist leaves out the empty __init__.py files.
            (tests_dir / "__init__.py").touch()
            os.replace(tests_dir, target / "tests")  # complete or absent, never half-extracted


def sdist_tests_dir(version: str = transformers.__version__) -> Path:
    """The extracted tests/ folder of the transformers `version` sdist, downloaded on first use."""
    if override := os.environ.get("TRANSFORMERS_SDIST_TESTS_DIR"):
        tests_dir = Path(override).resolve()
        if not (tests_dir / "test_modeling_common.py").is_file() or not (tests_dir / "__init__.py").is_file():
            raise RuntimeError(
                f"TRANSFORMERS_SDIST_TESTS_DIR={override} must be transformers' tests/ folder with an __init__.py"
            )
        return tests_dir
    target = CACHE_ROOT / version
    tests_dir = target / "tests"
    if (tests_dir / "test_modeling_common.py").is_file():
        return tests_dir
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:  # one download when several pytest processes start at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (tests_dir / "test_modeling_common.py").is_file():
            _download_and_extract(version, target)
    return tests_dir


class _ExportTesterMixin:
    """Stand-in for transformers' tests/exporters/test_export.py, which the sdist does not ship."""


class _GenerationTesterMixin:
    """Stand-in for transformers' tests/generation/test_utils.py, which the sdist does not ship."""


def _config_common_kwargs() -> dict:
    """A non-default value for each common `PreTrainedConfig` argument (what transformers' own
    `tests/utils/test_configuration_utils.config_common_kwargs` holds)."""
    kwargs = {
        "return_dict": False,
        "output_hidden_states": True,
        "output_attentions": True,
        "dtype": "float16",
        "chunk_size_feed_forward": 3,
        "architectures": ["AttnTransformerForConditionalGeneration"],
        "id2label": {0: "negative"},
        "label2id": {"negative": 0},
        "problem_type": "regression",
    }
    fields = {field.name for field in dataclasses.fields(transformers.PreTrainedConfig)}
    expected = (fields - {"transformers_version", "is_encoder_decoder"}) | {"output_attentions"}
    if set(kwargs) != expected:
        raise RuntimeError(
            f"PreTrainedConfig's common arguments changed in transformers {transformers.__version__}: update "
            f"_config_common_kwargs (missing {sorted(expected - set(kwargs))}, stale {sorted(set(kwargs) - expected)})"
        )
    defaults = transformers.PreTrainedConfig()
    same = [key for key, value in kwargs.items() if getattr(defaults, key) == value]
    if same:
        raise RuntimeError(f"_config_common_kwargs must use non-default values, not for {same}")
    return kwargs


def _install_stand_in(tests_dir: Path, dotted: str, attributes: dict) -> None:
    """Register module `PACKAGE.dotted` (and its parent packages) unless the extracted tree has the file."""
    if (tests_dir / (dotted.replace(".", "/") + ".py")).is_file():
        return
    parts = dotted.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join([PACKAGE, *parts[:depth]])
        if name in sys.modules:
            continue
        module = types.ModuleType(name, "stand-in for a file missing from the transformers sdist")
        if depth < len(parts):  # a package; real files beside the missing one stay importable
            module.__path__ = [str(tests_dir.joinpath(*parts[:depth]))]
        sys.modules[name] = module
        setattr(sys.modules[name.rpartition(".")[0]], parts[depth - 1], module)
    vars(sys.modules[f"{PACKAGE}.{dotted}"]).update(attributes)


def load_common_tests() -> tuple[types.ModuleType, types.ModuleType]:
    """Import (test_modeling_common, test_configuration_common) from the transformers sdist."""
    global GENERATION_TESTER_SHIPPED
    if importlib.util.find_spec("parameterized") is None:
        raise ModuleNotFoundError(
            "transformers' test_modeling_common.py imports `parameterized`: "
            "install it (it belongs in the `test` extra)"
        )
    if PACKAGE not in sys.modules:
        tests_dir = sdist_tests_dir()
        GENERATION_TESTER_SHIPPED = (tests_dir / "generation" / "test_utils.py").is_file()
        spec = importlib.util.spec_from_file_location(
            PACKAGE, tests_dir / "__init__.py", submodule_search_locations=[str(tests_dir)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
        _install_stand_in(tests_dir, "exporters.test_export", {"ExportTesterMixin": _ExportTesterMixin})
        _install_stand_in(tests_dir, "generation.test_utils", {"GenerationTesterMixin": _GenerationTesterMixin})
        _install_stand_in(
            tests_dir, "utils.test_configuration_utils", {"config_common_kwargs": _config_common_kwargs()}
        )
    return (
        importlib.import_module(f"{PACKAGE}.test_modeling_common"),
        importlib.import_module(f"{PACKAGE}.test_configuration_common"),
    )
