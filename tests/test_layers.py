"""The layers import downward only (README, "Architecture"):

- the model package: the flat modules of `modeling_attn/` (what remote code needs, and the Python API over it);
- the training recipe: `training/`, beside it: it may import the model package;
- the application layer: `modeling_attn/app/`, on top: it may import both.

Nothing in the model package imports `training` or the application layer; nothing in `training` imports the
application layer. Imports are read from the source (every `import` statement, including those inside functions).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL_PACKAGE = sorted((ROOT / "modeling_attn").glob("*.py"))
TRAINING = sorted((ROOT / "training").glob("*.py"))
APP = sorted((ROOT / "modeling_attn" / "app").glob("*.py"))


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of the modules `source` (a module of `package`) imports, relative imports resolved."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            names.add(module)
            names |= {f"{module}.{alias.name}" for alias in node.names}  # `from pkg import submodule`
    return names


def forbidden_imports(path: Path, package: str, forbidden: tuple[str, ...]) -> list[str]:
    modules = imported_modules(path.read_text(), package)
    return sorted(name for name in modules if any(name == f or name.startswith(f + ".") for f in forbidden))


def test_the_checker_sees_relative_absolute_and_nested_imports():
    source = "from .app import cli\nimport training.data\ndef f():\n    from ..training import train\n"
    assert imported_modules(source, "modeling_attn") >= {"modeling_attn.app", "modeling_attn.app.cli",
                                                         "training.data"}  # fmt: skip
    assert imported_modules("from . import hub\n", "modeling_attn.app") == {
        "modeling_attn.app",
        "modeling_attn.app.hub",
    }
    assert imported_modules("from .. import hub\n", "modeling_attn.app") == {"modeling_attn", "modeling_attn.hub"}


def test_the_layers_are_where_the_test_looks():
    names = {path.name for path in MODEL_PACKAGE}
    assert {"modeling_transformer.py", "modeling_rnn.py", "attention.py", "translation.py"} <= names
    assert {"cli.py", "translate.py", "push.py"} <= {path.name for path in APP}
    assert {"train.py", "data.py"} <= {path.name for path in TRAINING}


@pytest.mark.parametrize("path", MODEL_PACKAGE, ids=lambda path: path.name)
def test_the_model_package_imports_neither_training_nor_the_application_layer(path):
    assert forbidden_imports(path, "modeling_attn", ("training", "modeling_attn.app")) == []


@pytest.mark.parametrize("path", TRAINING, ids=lambda path: path.name)
def test_training_does_not_import_the_application_layer(path):
    assert forbidden_imports(path, "training", ("modeling_attn.app",)) == []


def relative_imports(path: Path) -> set[str]:
    """The sibling modules `path` imports as `from .x import ...` (what remote code copies next to the weights)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_code_that_travels_to_the_hub_is_the_models_own():
    """The modules a saved checkpoint carries (those the model and config files import, transitively) hold no
    Python API over the models: those import tokenizers, matplotlib or the Hub client, which remote code need not."""
    folder = ROOT / "modeling_attn"
    travelling = {path.stem for path in folder.glob("modeling_*.py")} | {
        path.stem for path in folder.glob("configuration_*.py")
    }
    frontier = set(travelling)
    while frontier:
        frontier = set().union(*(relative_imports(folder / f"{name}.py") for name in frontier)) - travelling
        travelling |= frontier
    assert {"encoder_decoder", "attention", "beam_search", "loss"} <= travelling  # the closure is computed
    assert travelling.isdisjoint({"hub", "translation", "heatmaps", "presets", "app"}), sorted(travelling)
