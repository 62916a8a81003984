"""Every figure that README.md, docs/*.md and the bench READMEs cite comes from a record, or says that it has none.

- Each `bench/results/...` path they name exists (a stem as `--output` takes it: its .json; `NAME.{json,md}`: each).
- Each claim that cites a bench (`python -m bench NAME ...` or `bench/NAME.py`) and a figure (outside code: a
  decimal number, a ratio `1.4x` or a percentage) names the record it came from: a claim is a paragraph, a list item
  or a table row; a fenced command belongs to the paragraphs just before and after its block. The record is a
  `bench/results/` path that exists (or in a bench folder's README, that folder's `results.json`), else the claim
  says that there is none (`NO_RECORD`: "no results file", "not measured", "not run"). A command with no figure
  beside it is an instruction, not a claim.
- Each JSON record in bench/results names the command that made it.
The checks fail on planted documents (`test_planted_*`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "bench" / "README.md",
    *sorted((ROOT / "bench").glob("*/README.md")),
]
RESULTS_PATH = re.compile(r"bench/results/[\w.{},-]*[\w}]")
RECORD = re.compile(r"bench/(?:results/[\w.{},-]*[\w}]|[\w]+/results\.json)")
BENCH_COMMAND = re.compile(r"python -m bench [a-z]|bench/[\w/]+\.py")  # a bench's command or its module
NO_RECORD = ("no results file", "not measured", "not run")
FIGURE = re.compile(r"(?<![\w.-])\d[\d,]*(?:(?:\.\d+)?(?:x\b|%)|\.\d+(?![.\d]))")  # 1.4x, 55%, 2.31; not 0.2.0
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def expand(path: str) -> list[str]:
    """`a.{json,md}` -> [`a.json`, `a.md`]; anything else as it is."""
    match = re.fullmatch(r"(.*)\{([\w,]+)\}(.*)", path)
    return [f"{match[1]}{part}{match[3]}" for part in match[2].split(",")] if match else [path]


def exists(path: str, root: Path = ROOT) -> bool:
    return all((root / one).exists() or (root / f"{one}.json").is_file() for one in expand(path.rstrip(".,")))


def blocks(text: str) -> list[tuple[str, list[str]]]:
    """The Markdown's blocks in order, each (kind, lines): "fence", "row" (one table row), "heading", "item" (a list
    item with its continuation lines) or "paragraph"."""
    found: list[tuple[str, list[str]]] = []
    fenced, current = False, None
    for line in text.splitlines():
        if fenced or line.startswith("```"):
            if not fenced:
                found.append(("fence", []))
            found[-1][1].append(line)
            fenced = not fenced if line.startswith("```") else fenced
            current = None
        elif not line.strip():
            current = None
        elif line.startswith(("|", "#")):
            found.append(("row" if line.startswith("|") else "heading", [line]))
            current = None
        elif re.match(r"\s*(?:[-*]|\d+\.) ", line) or current is None:
            current = ("item" if re.match(r"\s*(?:[-*]|\d+\.) ", line) else "paragraph", [line])
            found.append(current)
        else:
            current[1].append(line)
    return found


def claims(text: str) -> list[str]:
    """The claims of a Markdown text: paragraphs, list items and table rows; a fenced block joined to the paragraph
    (or item) just before it and the paragraph just after it."""
    found = blocks(text)
    units = []
    for index, (kind, lines) in enumerate(found):
        if kind != "fence":
            units.append(lines)
            continue
        before = found[index - 1][1] if index and found[index - 1][0] in ("paragraph", "item") else []
        after = found[index + 1][1] if index + 1 < len(found) and found[index + 1][0] == "paragraph" else []
        units.append(before + lines + after)
    return ["\n".join(unit) for unit in units]


def document_problems(text: str, where: str, root: Path = ROOT) -> list[str]:
    """What `text` (the document `where`, relative to `root`) cites without a record."""
    folder = (root / where).parent
    local = "results.json" if folder.parent == root / "bench" and (folder / "results.json").is_file() else None
    problems = [
        f"{where}: {path} does not exist" for path in sorted(set(RESULTS_PATH.findall(text))) if not exists(path, root)
    ]
    for claim in claims(text):
        if not BENCH_COMMAND.search(claim) or not FIGURE.search(CODE.sub("", claim)):
            continue
        records = [path for path in RECORD.findall(claim) if exists(path, root)]
        records += [local] if local and local in claim else []
        if not records and not any(marker in claim.lower() for marker in NO_RECORD):
            first = next(line for line in claim.splitlines() if BENCH_COMMAND.search(line))
            problems.append(f"{where}: a claim cites `{first.strip()[:80]}` but names no record (or says it has none)")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_each_cited_figure_has_its_record(path):
    assert document_problems(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))) == []


def test_each_record_names_its_command():
    records = sorted((ROOT / "bench" / "results").glob("*.json"))
    assert records  # the folder is read
    assert [path.name for path in records if "command" not in json.loads(path.read_text())] == []


PLANTED = """
The step is 1.4x faster (`python -m bench train_step --compare logits`).

Measured, bench/results/small-cpu.json:

```bash
python -m bench speed --preset small
```

| row | python -m bench decode_step --part breakdown: 5.27 s | bench/results/gone.json |
| row | python -m bench beam_search --model m: 2x, no results file: measured before the suite wrote one |

- a figure, 2.5x, from `python -m bench int8 --model m`, record bench/results/int8-cpu.{json,md,txt}
"""


def test_planted_claims_without_a_record_are_found(tmp_path):
    for name in ("small-cpu.json", "int8-cpu.json", "int8-cpu.md"):
        (tmp_path / "bench" / "results").mkdir(parents=True, exist_ok=True)
        (tmp_path / "bench" / "results" / name).write_text("{}")
    problems = document_problems(PLANTED, "planted.md", tmp_path)
    assert problems == [
        "planted.md: bench/results/gone.json does not exist",
        "planted.md: bench/results/int8-cpu.{json,md,txt} does not exist",
        "planted.md: a claim cites `The step is 1.4x faster (`python -m bench train_step --compare logits`).` "
        "but names no record (or says it has none)",
        "planted.md: a claim cites `| row | python -m bench decode_step --part breakdown: 5.27 s | bench/results/gon` "
        "but names no record (or says it has none)",
        "planted.md: a claim cites `- a figure, 2.5x, from `python -m bench int8 --model m`, record "
        "bench/results/in` "
        "but names no record (or says it has none)",
    ]
    fixed = PLANTED.replace("gone.json", "small-cpu.json").replace(",txt}", "}").replace("`).", "`, no results file).")
    assert document_problems(fixed, "planted.md", tmp_path) == []
