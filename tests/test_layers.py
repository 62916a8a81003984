"""The four layers import downward only, and no module of the package imports itself back through others
(docs/architecture.md):

1. the model core: the flat modules of `modeling_attn/` (what a checkpoint carries to the Hub); they import only
   each other;
2. the Python API: `modeling_attn/api/`; it may import the core;
3. the training recipe: the repository's `training/`, installed as `modeling_attn.training`; it may import the
   API and the core;
4. the commands: `modeling_attn/cli/` (and `training/__main__.py`, the `python -m modeling_attn.training` entry
   point); they may import everything below, and no command module imports the dispatcher `cli/main.py` or another
   command module (what several commands share lives in `cli/options.py`, `cli/parser.py`, `cli/report.py`);
5. the bench suite: `bench/` (not installed; `python -m bench NAME`); it may import everything below. Inside it, a
   bench imports the registry `bench`, `bench.harness`, `bench.common` and its own subpackage's modules, never
   another bench or the dispatcher `bench/__main__.py`; the harness imports no model code.

Imports are read from the source: every `import` statement, including those inside functions. The checks run on
the real tree and, to show that they can fail, on trees with a planted upward import and a planted cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from modeling_attn.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
# where each installed package lives in the repository (pyproject.toml's package-dir)
PACKAGE_DIRS = {
    "modeling_attn": ROOT / "modeling_attn",
    "modeling_attn.api": ROOT / "modeling_attn" / "api",
    "modeling_attn.api.evaluate_modules": ROOT / "modeling_attn" / "api" / "evaluate_modules",
    "modeling_attn.cli": ROOT / "modeling_attn" / "cli",
    "modeling_attn.training": ROOT / "training",
    "modeling_attn.configuration": ROOT / "configuration",
    "bench": ROOT / "bench",
    "bench.multi30k": ROOT / "bench" / "multi30k",
    "bench.scale": ROOT / "bench" / "scale",
    "bench.serve": ROOT / "bench" / "serve",
}
LAYERS = ("core", "api", "training", "commands", "bench")
# what any bench module may import from the suite itself (besides its own subpackage)
BENCH_SHARED = {"bench", "bench.harness", "bench.common"}
COMMAND_MODULES = {f"modeling_attn.cli.{name}" for name in COMMANDS}  # one module per command


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


def package_modules(package_dirs: dict[str, Path]) -> dict[str, tuple[Path, str]]:
    """Every module of the package: its dotted name -> (file, the package its relative imports start from)."""
    modules = {}
    for package, folder in package_dirs.items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = (path, package)
    return modules


def layer_of(module: str) -> str:
    if module == "bench" or module.startswith("bench."):
        return "bench"
    if module.startswith("modeling_attn.cli") or module == "modeling_attn.training.__main__":
        return "commands"
    if module.startswith("modeling_attn.training"):
        return "training"
    if module.startswith("modeling_attn.api"):
        return "api"
    return "core"  # modeling_attn and its flat modules (and the presets' data package)


def import_graph(package_dirs: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (names that are not modules of the package are dropped)."""
    modules = package_modules(package_dirs)
    graph = {}
    for name, (path, package) in modules.items():
        imported = imported_modules(path.read_text(), package)
        graph[name] = {module for module in imported if module in modules and module != name}
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for each import of a higher layer, each command module that imports the dispatcher, and each command
    module that imports another command module."""
    found = []
    for module, imported in graph.items():
        for target in imported:
            upward = LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(module))
            dispatcher = target == "modeling_attn.cli.main" and layer_of(module) == "commands"
            sideways = module in COMMAND_MODULES and target in COMMAND_MODULES
            if upward or dispatcher or sideways:
                found.append(f"{module} -> {target}")
    return sorted(found)


def bench_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for each import inside the suite that is not allowed: a bench importing another bench (not the
    registry, the harness, `common` or a module of its own subpackage), anything importing the dispatcher, and the
    harness importing model code."""
    found = []
    for module, imported in graph.items():
        if layer_of(module) != "bench":
            continue
        for target in imported:
            same_subpackage = module.count(".") == 2 and target.rpartition(".")[0] == module.rpartition(".")[0]
            model_code = module == "bench.harness" and target != "bench"
            other_bench = layer_of(target) == "bench" and target not in BENCH_SHARED and not same_subpackage
            if model_code or other_bench or target == "bench.__main__":
                found.append(f"{module} -> {target}")
    return sorted(found)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(components)


GRAPH = import_graph(PACKAGE_DIRS)


def test_the_checker_sees_relative_absolute_and_nested_imports():
    source = "from .cli import train\nimport modeling_attn.training.data\ndef f():\n    from ..training import train\n"
    assert imported_modules(source, "modeling_attn") >= {
        "modeling_attn.cli",
        "modeling_attn.cli.train",
        "modeling_attn.training.data",
    }
    assert imported_modules("from . import hub\n", "modeling_attn.api") == {
        "modeling_attn.api",
        "modeling_attn.api.hub",
    }
    assert imported_modules("from .. import x\n", "modeling_attn.api") == {"modeling_attn", "modeling_attn.x"}


def test_the_layers_are_where_the_test_looks():
    layers = {layer: {name for name in GRAPH if layer_of(name) == layer} for layer in LAYERS}
    assert {"modeling_attn.modeling_transformer", "modeling_attn.attention", "modeling_attn.registry"} <= layers[
        "core"
    ]
    assert {"modeling_attn.api.translation", "modeling_attn.api.hub", "modeling_attn.api.corpus"} <= layers["api"]
    assert {"modeling_attn.training.train", "modeling_attn.training.data"} <= layers["training"]
    assert {"modeling_attn.cli.main", "modeling_attn.cli.train", "modeling_attn.training.__main__"} <= layers[
        "commands"
    ]
    assert GRAPH["modeling_attn.cli.train"] >= {"modeling_attn.training.train", "modeling_attn.cli.parser"}


def test_every_import_goes_downward():
    assert upward_imports(GRAPH) == []


def test_no_import_cycle_in_the_package():
    assert cycles(GRAPH) == []


def test_benches_import_only_the_harness_common_and_their_own_subpackage():
    assert {"bench.harness", "bench.common"} <= GRAPH["bench.train_step"]  # the suite is read
    assert "bench.multi30k.recipe" in GRAPH["bench.multi30k.ensemble"]
    assert bench_imports(GRAPH) == []


def test_planted_bench_imports_fail(tmp_path):
    dirs = _tree(
        tmp_path,
        {
            "bench.harness": "from . import BENCHES\nfrom modeling_attn import attention\n",  # model code
            "bench.common": "from . import harness\n",
            "bench.speed": "from . import common, harness\nfrom .engines import RUNTIMES\n",  # another bench
            "bench.engines": "from . import harness\n",
            "bench.__main__": "from . import BENCHES\n",
            "bench.gpu": "from .__main__ import main\n",  # the dispatcher
            "bench.multi30k.recipe": "from .bleu import x\nfrom .. import harness\n",  # its own subpackage: fine
            "bench.multi30k.bleu": "",
            "bench.serve.bench": "from ..multi30k import bleu\n",  # another subpackage's module
            "modeling_attn.attention": "",
            "modeling_attn.api.hub": "from bench import harness\n",  # the API importing the suite: upward
        },
    )
    (dirs["bench"] / "__init__.py").write_text("BENCHES = {}\n")
    graph = import_graph(dirs)
    assert bench_imports(graph) == [
        "bench.gpu -> bench.__main__",
        "bench.harness -> modeling_attn.attention",
        "bench.serve.bench -> bench.multi30k.bleu",
        "bench.speed -> bench.engines",
    ]
    assert upward_imports(graph) == ["modeling_attn.api.hub -> bench", "modeling_attn.api.hub -> bench.harness"]


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    dirs = {package: tmp_path / package.replace(".", "_") for package in PACKAGE_DIRS}
    for folder in dirs.values():
        folder.mkdir()
    for name, source in files.items():
        package, _, stem = name.rpartition(".")
        (dirs[package] / f"{stem}.py").write_text(source)
    return dirs


def test_a_planted_upward_import_and_a_planted_cycle_fail_the_checks(tmp_path):
    dirs = _tree(
        tmp_path,
        {
            # core -> api, inside a function
            "modeling_attn.attention": "def f():\n    from .api import translation\n",
            "modeling_attn.api.translation": "from ..training import data\n",  # api -> training
            # training -> commands
            "modeling_attn.training.data": "from modeling_attn.cli.parser import CommandParser\n",
            "modeling_attn.cli.parser": "",
            "modeling_attn.cli.push": "from .main import COMMANDS\n",  # a command imports the dispatcher
            "modeling_attn.cli.main": "from . import push\n",
            "modeling_attn.cli.translate": "",
            "modeling_attn.cli.serve": "from .translate import load_models\n",  # a command imports another
        },
    )
    graph = import_graph(dirs)
    assert upward_imports(graph) == [
        "modeling_attn.api.translation -> modeling_attn.training.data",
        "modeling_attn.attention -> modeling_attn.api.translation",
        "modeling_attn.cli.push -> modeling_attn.cli.main",
        "modeling_attn.cli.serve -> modeling_attn.cli.translate",
        "modeling_attn.training.data -> modeling_attn.cli.parser",
    ]
    assert cycles(graph) == [["modeling_attn.cli.main", "modeling_attn.cli.push"]]


def test_a_cycle_inside_one_layer_is_found(tmp_path):
    dirs = _tree(
        tmp_path,
        {
            "modeling_attn.api.a": "from . import b\n",
            "modeling_attn.api.b": "from .c import x\n",
            "modeling_attn.api.c": "def g():\n    from .a import y\n",
        },
    )
    assert cycles(import_graph(dirs)) == [["modeling_attn.api.a", "modeling_attn.api.b", "modeling_attn.api.c"]]


def relative_imports(path: Path) -> set[str]:
    """The sibling modules `path` imports as `from .x import ...` (what remote code copies next to the weights)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_code_that_travels_to_the_hub_is_the_models_own():
    """The modules a saved checkpoint carries (those the model and config files import, transitively) are core
    modules: the API imports tokenizers, matplotlib or the Hub client, which remote code need not."""
    folder = ROOT / "modeling_attn"
    travelling = {path.stem for path in folder.glob("modeling_*.py")} | {
        path.stem for path in folder.glob("configuration_*.py")
    }
    frontier = set(travelling)
    while frontier:
        frontier = set().union(*(relative_imports(folder / f"{name}.py") for name in frontier)) - travelling
        travelling |= frontier
    assert {"encoder_decoder", "attention", "beam_search", "loss"} <= travelling  # the closure is computed
    assert all((folder / f"{name}.py").is_file() for name in travelling), sorted(travelling)
