"""The shape of the code, read from the source with `ast`: short functions, short module docstrings, a module map.

The package is `modeling_attn/`, with `modeling_attn/api/` and `modeling_attn/cli/`; the recipe is `training/`; the
bench suite is `bench/`.
- No function longer than 80 lines (the team's rule, issue 29). A function's length runs from its first decorator
  (or its `def`) to its last line, docstring and comments included; methods and nested functions count on their own
  (named `Class.method`, `outer.inner`).
- Every module docstring opens with one summary sentence on its own line, then a blank line or its end (PEP 257),
  and is at most 16 lines: what a reader of the file needs; the rest lives in docs/ (issue 40).
- docs/architecture.md names every module file, and names no file that is gone (issue 40).
Each check runs on the real tree and, to show that it can fail, on planted cases.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("modeling_attn", "training", "bench")
LIMIT = 80
# Functions allowed over the limit, each with the reason; nothing else is (none today).
SPLIT_ELSEWHERE: set[str] = set()


def function_lengths(source: str, where: str) -> dict[str, int]:
    """`where::qualified name` -> lines, for every function and method defined in `source`."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([child.lineno] + [decorator.lineno for decorator in child.decorator_list])
                lengths[f"{where}::{prefix}{child.name}"] = child.end_lineno - first + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)  # functions defined under `if` / `try` at module or class level

    visit(ast.parse(source), "")
    return lengths


def tree_lengths(root: Path) -> dict[str, int]:
    lengths: dict[str, int] = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            lengths |= function_lengths(path.read_text(encoding="utf-8"), path.relative_to(root).as_posix())
    return lengths


def too_long(lengths: dict[str, int], allowed: set[str]) -> list[str]:
    return [
        f"{name} ({count} lines)" for name, count in sorted(lengths.items()) if count > LIMIT and name not in allowed
    ]


LENGTHS = tree_lengths(ROOT)


def test_the_checker_counts_decorators_methods_and_nested_functions():
    source = (
        "@cache\ndef f():\n    def inner():\n        pass\n    return 1\n\nclass A:\n    def m(self):\n        pass\n"
    )
    assert function_lengths(source, "x.py") == {"x.py::f": 5, "x.py::f.inner": 2, "x.py::A.m": 2}
    assert {"training/train.py::run", "modeling_attn/api/hub.py::model_card"} <= set(LENGTHS)  # it reads the tree


def test_a_planted_long_function_is_named():
    statements = [f"        x{line} = {line}" for line in range(LIMIT)]
    planted = "class Planted:\n    def long(self):\n" + "\n".join(statements) + "\n"  # def + 80 lines
    assert too_long(function_lengths(planted, "p.py"), set()) == [f"p.py::Planted.long ({LIMIT + 1} lines)"]
    assert too_long(function_lengths(planted, "p.py"), {"p.py::Planted.long"}) == []
    fits = "def fits():\n" + "\n".join(line[4:] for line in statements[1:]) + "\n"  # def + 79 lines
    assert too_long(function_lengths(fits, "p.py"), set()) == []


def test_no_function_is_longer_than_80_lines():
    assert too_long(LENGTHS, SPLIT_ELSEWHERE) == []


def test_each_allowed_exception_is_still_needed():
    """An exception that no longer exists or now fits must leave `SPLIT_ELSEWHERE`."""
    stale = [name for name in sorted(SPLIT_ELSEWHERE) if LENGTHS.get(name, 0) <= LIMIT]
    assert not stale, f"remove from SPLIT_ELSEWHERE (gone or at most {LIMIT} lines now): {stale}"


DOCSTRING_LINES = 16
# Module docstrings not checked yet, each with the reason.
DOCSTRING_PENDING: dict[str, str] = {}  # module -> why its docstring may wait (none waits now)


def docstring_problem(source: str) -> str | None:
    """What is wrong with the module docstring of `source` (None: nothing)."""
    docstring = ast.get_docstring(ast.parse(source))
    if docstring is None:
        return "no module docstring"
    lines = docstring.splitlines()
    if not lines[0].rstrip().endswith((".", "?", "!")) or (len(lines) > 1 and lines[1].strip()):
        return f"its first line is not one sentence followed by a blank line: {lines[0]!r}"
    if len(lines) > DOCSTRING_LINES:
        return f"{len(lines)} lines (at most {DOCSTRING_LINES}: move the rest to docs/)"
    return None


def test_a_planted_module_docstring_is_named():
    assert docstring_problem('"""One sentence.\n\nMore text.\n"""\n') is None
    assert docstring_problem('"""One sentence."""\nx = 1\n') is None
    assert docstring_problem("x = 1\n") == "no module docstring"
    assert "first line" in docstring_problem('"""A sentence that runs\nonto the next line.\n"""\n')
    assert "first line" in docstring_problem('"""One sentence.\nNo blank line after it.\n"""\n')
    long = '"""One sentence.\n\n' + "line\n" * (DOCSTRING_LINES - 1) + '"""\n'
    assert (
        docstring_problem(long) == f"{DOCSTRING_LINES + 1} lines (at most {DOCSTRING_LINES}: move the rest to docs/)"
    )


def test_every_module_docstring_opens_with_one_sentence_and_is_short():
    problems = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name not in DOCSTRING_PENDING and (problem := docstring_problem(path.read_text(encoding="utf-8"))):
                problems[name] = problem
    assert problems == {}


MODULE_FOLDERS = ("modeling_attn", "modeling_attn/api", "modeling_attn/cli", "training")
NAMED_MODULE = re.compile(r"`((?:modeling_attn/api/|modeling_attn/cli/|modeling_attn/|training/)\w+\.py)`")


def named_modules(text: str) -> set[str]:
    return set(NAMED_MODULE.findall(text))


def test_architecture_names_every_module_file_and_no_missing_one():
    on_disk = {path.relative_to(ROOT).as_posix() for folder in MODULE_FOLDERS for path in (ROOT / folder).glob("*.py")}
    named = named_modules((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert sorted(on_disk - named) == [], "name these modules in docs/architecture.md, one line each"
    assert sorted(named - on_disk) == [], "docs/architecture.md names these files, which do not exist"
    planted = "- `modeling_attn/attention.py`: x\n- `training/gone.py`: y\n- `modeling_attn/api/hub.py`\n"
    assert named_modules(planted) == {"modeling_attn/attention.py", "training/gone.py", "modeling_attn/api/hub.py"}


FORMAT_SKIPS = 10  # at most this many `# fmt: skip` markers, for tables whose alignment carries meaning (issue 40)


def test_ruff_format_is_switched_off_in_at_most_a_few_places():
    marker = "# fmt: " + "skip"  # spelled in two parts so that this file does not count itself
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("modeling_attn", "training", "configuration", "tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if marker in line or "# fmt: " + "off" in line
    ]
    assert len(found) <= FORMAT_SKIPS, found
