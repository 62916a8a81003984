"""Every command, flag, module path and Python snippet that README.md, docs/*.md and bench's READMEs show exists.

- Shell commands: each fenced ```bash block of README.md and docs/*.md (README's unlabelled blocks too), and each
  inline `attn ...` / `python -m modeling_attn.training ...` / `torchrun ...` / `accelerate launch ...` span, is
  split into simple commands (shlex: `&&`, `|`, `;`, line continuations, comments, `VAR=value` prefixes). The flags
  of `attn COMMAND`, `python -m modeling_attn.training`, `torchrun` / `accelerate launch` (their own flags, then the
  training module's), `python -m bench NAME` and `python tests/...py` are checked against that command's real
  parser: the parser the command builds is caught where it starts parsing (`CommandParser.parse`, argparse's
  `parse_known_args`), so the names are the ones `--help` prints. Fenced commands are then parsed with it too, so a
  bad value (`--num_beams four`, a choice that does not exist) fails; a missing required flag does not (commands
  may be excerpts).
  A program the checker does not know is a failure: teach it the program rather than show an unchecked command.
- Python: each ```python block of README.md and docs/*.md imports only names that exist (each is imported), and the
  README's blocks run, in a folder holding a tiny `outputs/dates` model (seconds). The Hub upload of the README
  example is not made (CI has no Hub): its call is bound to the function's signature and the files it would upload
  are written by `save_for_hub`, the function `push_to_hub` uploads from (the upload itself: tests/test_hub.py,
  opt-in with a token).
- Names and paths: every `modeling_attn.x.y` named in backticks resolves (module import, then attributes), every
  backticked path under a folder of this repository exists, and every relative link points at a file (and heading).
The checks fail on planted mistakes: see the `test_planted_*` tests.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import importlib.metadata
import inspect
import re
import runpy
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from unittest import mock

import pytest
from runs import NO_EVAL, tiny_on

from bench import BENCHES
from modeling_attn.cli.main import COMMANDS
from modeling_attn.cli.parser import CommandParser

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# the bench suite's index and folder READMEs: their commands and paths are checked too
DOCUMENTS += [ROOT / "bench" / "README.md", *sorted((ROOT / "bench").glob("*/README.md"))]
TRAINING_MODULE = "modeling_attn.training"
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
# Programs shown in the documents whose flags are not this project's: not checked.
UNCHECKED = {"pip", "pip3", "pytest", "source", "cd", "echo", "cat", "git", "hf", "ruff", "mkdir", "ls", "export"}
UNCHECKED |= {"curl", "chromium"}
# benches (`python -m bench NAME`) that pass the flags their own parser does not know on to `attn train`
PASS_ON_TO_TRAIN = {"multi30k", "scale"}
REPO_FOLDERS = ("modeling_attn", "training", "configuration", "tests", "bench", "docs", ".ci")
REPO_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, REPO_FOLDERS)) + r")/[\w./-]*\w)")


# ---------------------------------------------------------------- the documents


def code_blocks(text: str) -> Iterator[tuple[str, str]]:
    """(language, code) of each fenced block."""
    for match in re.finditer(r"^```([\w-]*)[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        yield match.group(1).lower(), match.group(2)


def prose(text: str) -> str:
    """`text` without its fenced blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def inline_spans(text: str) -> list[str]:
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose(text))


def shell_commands(text: str, readme: bool) -> Iterator[tuple[str, bool]]:
    """(command line, whole): each line of the shell blocks (continuations joined), whole=True, and each inline span
    that starts with a project command, whole=False.

    README's unlabelled blocks count as shell (label output `text`).
    """
    for language, code in code_blocks(text):
        if language in SHELL_LANGUAGES or (readme and language == ""):
            for line in code.replace("\\\n", " ").splitlines():
                if line.strip():
                    yield line, True
    for span in inline_spans(text):
        if re.match(rf"(attn \w|python3? -m {TRAINING_MODULE}\b|torchrun |accelerate launch )", span):
            yield span, False


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line: split at `&&`, `||`, `|`, `;`, without redirections, comments,
    `VAR=value` prefixes, `...` placeholders and the brackets of optional flags (`[--private]`)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    commands: list[list[str]] = [[]]
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in ("&&", "||", "|", ";", "&"):
            commands.append([])
        elif token in (">", ">>", "<"):
            skip_next = True
        elif token.strip("[]") and token.strip("[]") != "...":
            commands[-1].append(token.strip("[]") if token.startswith(("[-", "-")) else token)
    for command in commands:
        while command and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", command[0]):
            command.pop(0)
    return [command for command in commands if command]


# ---------------------------------------------------------------- the parsers


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


def _catch(owner: type, method: str, run: Callable[[], object]) -> argparse.ArgumentParser:
    """The parser on which `run` calls `owner.method` first (the call is stopped there: nothing else runs)."""

    def stop(self, *args, **kwargs):
        raise _Caught(self)

    with mock.patch.object(owner, method, stop):
        try:
            run()
        except _Caught as caught:
            return caught.parser
    raise AssertionError(f"{run} never parsed its flags")


@cache
def attn_parser(command: str) -> argparse.ArgumentParser:
    """The parser `attn COMMAND` builds (`modeling_attn.cli.<command>.main`), caught as it starts parsing."""
    main = importlib.import_module(f"modeling_attn.cli.{command}").main
    return _catch(CommandParser, "parse", lambda: main([]))


@cache
def script_parser(script: str) -> argparse.ArgumentParser:
    """The argparse parser of a script, caught as it starts parsing (the script's imports run, nothing else)."""
    path = ROOT / script
    with mock.patch.object(sys, "argv", [str(path)]), mock.patch.object(sys, "path", [str(path.parent), *sys.path]):
        return _catch(
            argparse.ArgumentParser, "parse_known_args", lambda: runpy.run_path(str(path), run_name="__main__")
        )


@cache
def bench_parser(name: str) -> argparse.ArgumentParser:
    """The argparse parser of the bench NAME (`python -m bench NAME`), caught as its `main` starts parsing."""
    main = importlib.import_module(BENCHES[name]).main
    return _catch(argparse.ArgumentParser, "parse_known_args", lambda: main([]))


@cache
def launcher_parser(launcher: str) -> argparse.ArgumentParser:
    if launcher == "torchrun":
        from torch.distributed.run import get_args_parser

        return get_args_parser()
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser()


def check_flags(parser: argparse.ArgumentParser, argv: list[str], whole: bool, where: str) -> list[str]:
    """Each `--flag` of `argv` is one of `parser`'s (exactly: no abbreviations); if `whole`, `argv` parses."""
    known = {option for action in parser._actions for option in action.option_strings}
    problems = []
    for argument in argv[: argv.index("--")] if "--" in argv else argv:
        flag = argument.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            near = [option for option in known if option.startswith("--")]
            guess = difflib.get_close_matches(flag, near, n=1)
            problems.append(
                f"{where}: {parser.prog} has no flag {flag}" + (f" (did you mean {guess[0]}?)" if guess else "")
            )
    if whole and not problems:
        problems += _parse_values(parser, argv, where)
    return problems


def _parse_values(parser: argparse.ArgumentParser, argv: list[str], where: str) -> list[str]:
    """argparse's own verdict on `argv` (types, choices, counts), except for required flags left out."""

    def refuse(message: str):
        raise ValueError(message)

    with mock.patch.object(parser, "error", refuse):
        try:
            arguments = [argument for argument in argv if argument != "--"]
            bare = getattr(parser, "bare_optional_flags", None)  # CommandParser.parse's first step
            parser.parse_known_args(bare(arguments) if bare else arguments)
        except ValueError as error:
            if not str(error).startswith("the following arguments are required"):
                return [f"{where}: {parser.prog} refuses it: {error}"]
    return []


# ---------------------------------------------------------------- the checks


def check_command(argv: list[str], whole: bool, where: str) -> list[str]:
    """What is wrong with one simple command of a document (nothing: [])."""
    program, rest = argv[0], argv[1:]
    if program in ("time", "/usr/bin/time"):  # the timed command is checked (`-v`: time's own flag)
        return check_command([argument for argument in rest if argument != "-v"], whole, where)
    if program in UNCHECKED or (program in ("python", "python3") and rest[:2] in (["-m", "venv"], ["-m", "pip"])):
        return _check_extras(argv, where) if "install" in rest else []
    if program == "attn":
        if not rest or rest[0] in ("-h", "--help", "-V", "--version"):
            return []
        if rest[0] not in COMMANDS:
            return [f"{where}: attn has no command {rest[0]!r} (commands: {', '.join(COMMANDS)})"]
        return check_flags(attn_parser(rest[0]), rest[1:], whole, where)
    if program in ("python", "python3"):
        if rest[:2] == ["-m", TRAINING_MODULE]:
            return check_flags(attn_parser("train"), rest[2:], whole, where)
        if rest[:2] == ["-m", "bench"]:
            return _check_bench(rest[2:], whole, where)
        if rest and rest[0].startswith("tests/") and rest[0].endswith(".py"):  # scripts with argparse
            return _check_script(rest[0], rest[1:], whole, where)
        return [f"{where}: cannot check {' '.join(argv[:3])!r} (a module or script this test does not know)"]
    if program == "torchrun" or argv[:2] == ["accelerate", "launch"]:
        return _check_launch(program, rest if program == "torchrun" else rest[1:], whole, where)
    return [f"{where}: cannot check the program {program!r}: teach tests/test_readme.py its flags"]


def _check_launch(launcher: str, argv: list[str], whole: bool, where: str) -> list[str]:
    module = next((i for i, argument in enumerate(argv) if argument == TRAINING_MODULE), None)
    if module is None and not whole:  # an excerpt of the launcher's own flags
        return check_flags(launcher_parser(launcher), argv, False, where)
    if module is None or module == 0 or argv[module - 1] not in ("-m", "--module"):
        return [f"{where}: {launcher} does not start `-m {TRAINING_MODULE}`"]
    return check_flags(launcher_parser(launcher), argv[: module + 1], whole, where) + check_flags(
        attn_parser("train"), argv[module + 1 :], whole, where
    )


def _check_script(script: str, argv: list[str], whole: bool, where: str) -> list[str]:
    if not (ROOT / script).is_file():
        return [f"{where}: no script {script}"]
    return check_flags(script_parser(script), argv, whole, where)


def _check_bench(argv: list[str], whole: bool, where: str) -> list[str]:
    if not argv or argv[0] in ("-h", "--help"):
        return []
    if argv[0] not in BENCHES:
        return [f"{where}: python -m bench has no bench {argv[0]!r} (benches: {', '.join(BENCHES)})"]
    name, parser, argv = argv[0], bench_parser(argv[0]), argv[1:]
    if name not in PASS_ON_TO_TRAIN:
        return check_flags(parser, argv, whole, where)
    own = {option for action in parser._actions for option in action.option_strings}
    split = argv.index("--") if "--" in argv else len(argv)
    theirs = [a for a in argv[:split] if a.split("=", 1)[0] not in own and a.startswith("--")] + argv[split + 1 :]
    mine = [a for a in argv[:split] if a not in theirs]
    return check_flags(parser, mine, False, where) + check_flags(attn_parser("train"), theirs, False, where)


def _check_extras(argv: list[str], where: str) -> list[str]:
    """`pip install ...modeling-attn[extra]` / `-e ".[extra]"`: each extra exists (the installed package's metadata,
    from pyproject.toml)."""
    extras = importlib.metadata.metadata("modeling-attn").get_all("Provides-Extra")
    problems = []
    for argument in argv:
        match = re.fullmatch(r"(?:\.|modeling-attn)\[([\w,-]+)\]", argument)
        for extra in match.group(1).split(",") if match else []:
            if extra not in extras:
                problems.append(f"{where}: modeling-attn has no extra {extra!r} (extras: {', '.join(extras)})")
    return problems


def check_shell(text: str, name: str, readme: bool) -> list[str]:
    problems = []
    for line, whole in shell_commands(text, readme):
        for argv in simple_commands(line):
            problems += check_command(argv, whole, f"{name}: `{' '.join(argv)[:100]}`")
    return problems


def imported_names(code: str) -> list[tuple[str, str | None]]:
    """(module, name or None) of each import of a Python snippet."""
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [(node.module, alias.name) for alias in node.names]
    return names


def check_imports(code: str, where: str) -> list[str]:
    problems = []
    for module, name in imported_names(code):
        try:
            imported = importlib.import_module(module)
            if name is not None and not hasattr(imported, name):
                importlib.import_module(f"{module}.{name}")  # a submodule not imported by its package
        except ImportError as error:
            problems.append(f"{where}: {'from ' + module + ' ' if name else ''}import {name or module}: {error}")
    return problems


def check_names(text: str, where: str) -> list[str]:
    """Every `modeling_attn.x.y` in a span resolves; every span path under a repository folder exists (a report's
    stem, as `--output` takes it: its .json); every relative link is a file."""
    problems = []
    for span in inline_spans(text):
        for dotted in re.findall(r"\bmodeling_attn(?:\.[A-Za-z_]\w*)+", span):
            if not _resolves(dotted):
                problems.append(f"{where}: `{dotted}` does not exist")
        for path in re.findall(REPO_PATH, span):
            if not (ROOT / path).exists() and not (ROOT / f"{path}.json").is_file():
                problems.append(f"{where}: `{path}` does not exist in the repository")
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", prose(text)):
        if "://" in target:
            continue
        linked = (ROOT / where).parent / target if target else ROOT / where
        if not linked.exists():
            problems.append(f"{where}: the link ({target}) points at no file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text(encoding="utf-8")):
            problems.append(f"{where}: the link ({target}#{anchor}) points at no heading of {target or where}")
    return problems


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text: lowercase, punctuation dropped, spaces as dashes."""
    headings = re.findall(r"^#+ (.+)$", prose(text), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def document_problems(path: Path, text: str | None = None) -> list[str]:
    """Everything the checks above find wrong in one document."""
    text = path.read_text(encoding="utf-8") if text is None else text
    name = str(path.relative_to(ROOT)) if path.is_absolute() else str(path)
    problems = check_shell(text, name, readme=path.name == "README.md" and path.parent == ROOT)
    problems += check_names(text, name)
    for number, (language, code) in enumerate(code_blocks(text)):
        if language == "python":
            problems += check_imports(code, f"{name}, Python block {number}")
    return problems


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_command_flag_name_and_import_of_the_documents_exists(path):
    assert document_problems(path) == []


def test_the_readme_shows_the_commands_ci_runs():
    """The "Tests" section holds exactly the commands .ci/run runs (and nothing more runs there): the quick suite, the
    slow one, and the quick one again on AVX2 kernels."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    shown = [line.strip() for _, code in code_blocks(section) for line in code.splitlines() if line.strip()]
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().split("unchanged:")[1].splitlines() if line.strip()]
    avx2 = "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 pytest"
    assert shown == ci == ["pytest", "pytest -m slow", avx2]


def test_ci_installs_with_the_readmes_set_up_command():
    """.ci/run runs the first line of the README's "Set up and run" block as written (the same extras), and no other
    pip install: a test that passes in CI passes after the README's set-up."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Set up and run\n", 1)[1].split("\n## ", 1)[0]
    setup = next(code_blocks(section))[1].splitlines()[0]
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8")
    assert setup.startswith("python3 -m venv .venv") and "pip install -e" in setup
    assert "setup=\"$(grep -m1 '^python3 -m venv .venv' README.md)\"" in ci and 'eval "$setup"' in ci
    assert "pip install" not in ci.replace(setup, "")


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, len(lines)


PLANTED = """
```bash
attn train --output_dir outputs/dates --max_step 10
attn tarin --output_dir outputs/dates
attn translate --model outputs/dates --num_beams four "3. März 1987"
torchrun --nproc_per_node 2 -m modeling_attn.training --ouput_dir outputs/x
accelerate launch --config_file configuration/accelerate-fsdp.yaml --num_procs 2 -m modeling_attn.training
python -m training --output_dir outputs/dates
python -m bench speed --preset small --thread 1
python -m bench multi30k --source_lang en --target_lang de --output_dir o --max_stepz 10
python -m bench sped --preset small
pip install -e ".[test,plots]"
wget https://example.com/model.bin
```
Fine-tune with `attn train --model_name_or_pth outputs/dates`; see `modeling_attn.app.cli` and `training/nothing.py`.
```python
from modeling_attn.api.hub import push_to_hubb
```
[the guide](docs/no-such-page.md), [its flags](docs/training.md#flagz)
"""


def test_planted_mistakes_are_found():
    """A README with one mistake per line: each is reported, naming the flag and the closest real one."""
    problems = "\n".join(document_problems(ROOT / "README.md", PLANTED))
    expected = [
        "attn train has no flag --max_step (did you mean --max_steps?)",
        "attn has no command 'tarin'",
        "attn translate refuses it: argument --num_beams/--num-beams: invalid int value: 'four'",
        "attn train has no flag --ouput_dir (did you mean --output_dir?)",
        "Accelerate launch command has no flag --num_procs",
        "cannot check 'python -m training'",
        "has no flag --thread (did you mean --threads?)",
        "python -m bench has no bench 'sped'",
        "attn train has no flag --max_stepz (did you mean --max_steps?)",
        "modeling-attn has no extra 'plots'",
        "cannot check the program 'wget'",
        "attn train has no flag --model_name_or_pth (did you mean --model_name_or_path?)",
        "`modeling_attn.app.cli` does not exist",
        "`training/nothing.py` does not exist",
        "import push_to_hubb",
        "the link (docs/no-such-page.md) points at no file",
        "the link (docs/training.md#flagz) points at no heading of docs/training.md",
    ]
    missing = [line for line in expected if line not in problems]
    assert not missing, problems
    assert len(problems.splitlines()) == len(expected), problems


def test_the_same_lines_spelt_right_pass():
    """The planted lines with the mistakes fixed: nothing reported (the checks fail for the mistakes only)."""
    fixed = (
        PLANTED.replace("--max_step 10", "--max_steps 10")
        .replace("tarin", "train")
        .replace("four", "4")
        .replace("--ouput_dir", "--output_dir")
        .replace("--num_procs", "--num_processes")
        .replace("-m training", f"-m {TRAINING_MODULE}")
        .replace("--thread 1", "--threads 1")
        .replace("bench sped", "bench speed")
        .replace("--max_stepz", "--max_steps")
        .replace("plots", "plot")
        .replace("wget https://example.com/model.bin\n", "")
        .replace("_or_pth", "_or_path")
        .replace("`modeling_attn.app.cli`", "`modeling_attn.cli.main`")
        .replace("training/nothing.py", "training/train.py")
        .replace("push_to_hubb", "push_to_hub")
        .replace("docs/no-such-page.md", "docs/training.md")
        .replace("#flagz", "#flags")
    )
    assert document_problems(ROOT / "README.md", fixed) == []


# ---------------------------------------------------------------- the README's Python runs


def _tiny_dates_model(folder: Path) -> None:
    """A tiny untrained Transformer with a BPE tokenizer of dates: what `attn train` writes, in miniature."""
    import torch
    from modeling_attn.training.tokenizer import train_bpe_tokenizer

    from modeling_attn import AttnTransformerConfig, AttnTransformerForConditionalGeneration

    dates = ["1 May 2030", "May 2, 2030", "03.05.2030", "2030-05-01", "2030-05-02", "2030-05-03", "3. März 1987"]
    tokenizer = train_bpe_tokenizer(dates * 3, vocab_size=60, min_frequency=1)
    special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    config = AttnTransformerConfig(
        vocab_size=len(tokenizer),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        num_heads=2,
        d_ff=32,
        dropout=0.0,
        **special,
    )
    torch.manual_seed(0)
    AttnTransformerForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.mark.slow  # a minute on a loaded 2-core machine: 20 Trainer steps
def test_the_readme_python_runs(tmp_path, monkeypatch, capsys):
    """Each ```python block of README.md runs as written in a folder with a tiny `outputs/dates`; a Hub upload
    (`push_to_hub(...)`) is checked, not made: its arguments bind to the function, and `save_for_hub` writes the
    files it would upload, from a folder whose weights the block's Trainer changed."""
    from safetensors.torch import load_file

    from modeling_attn.api.hub import push_to_hub, save_for_hub

    blocks = [code for language, code in code_blocks((ROOT / "README.md").read_text()) if language == "python"]
    assert blocks, "README.md shows no Python"
    monkeypatch.chdir(tmp_path)
    _tiny_dates_model(tmp_path / "outputs" / "dates")
    pushed = []
    for code in blocks:
        namespace: dict = {"__name__": "readme"}
        for statement in ast.parse(code).body:
            call = statement.value if isinstance(statement, ast.Expr) else None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "push_to_hub":
                assert namespace["push_to_hub"] is push_to_hub
                arguments = ast.fix_missing_locations(ast.Expression(ast.List(call.args, ast.Load())))
                args = eval(compile(arguments, "README.md", "eval"), namespace)
                bound = inspect.signature(push_to_hub).bind(*args).arguments
                pushed.append(save_for_hub(bound["model_dir"], tmp_path / "hub", bound["repo_id"]))
                continue
            exec(compile(ast.Module([statement], []), "README.md", "exec"), namespace)
        if "print(" in code:  # the block's translation, as a list of strings
            assert re.fullmatch(r"\[.*\]", capsys.readouterr().out.strip().splitlines()[-1])
    start = load_file(tmp_path / "outputs" / "dates" / "model.safetensors")
    for folder in pushed:
        assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= {
            p.name for p in folder.iterdir()
        }
        trained = load_file(folder / "model.safetensors")
        assert trained.keys() == start.keys() and any(not trained[k].equal(start[k]) for k in start)


@pytest.mark.slow  # two tiny `attn train` runs and an ensemble: a minute on a loaded 2-core machine
def test_the_readme_s_ensemble_runs_share_a_tokenizer_as_it_says(tmp_path):
    """The README's ensemble (`attn translate --model RUN_A --model RUN_B`) says how its runs share a tokenizer: its
    `attn train --tokenizer_name_or_path RUN_A` line, run as shown (with a tiny run's flags and RUN_B's folder),
    gives RUN_B the tokenizer of RUN_A, and the two decode as one ensemble."""
    from modeling_attn.cli.main import main as attn

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "attn translate --model RUN_A --model RUN_B" in readme
    shown = [span for span in inline_spans(readme) if re.match(r"attn train .*--tokenizer_name_or_path RUN_A", span)]
    assert len(shown) == 1, "README.md does not say how RUN_A and RUN_B share a tokenizer"
    tiny = [*tiny_on(120), "--max_steps", "5", *NO_EVAL]
    train = [sys.executable, "-m", TRAINING_MODULE]
    for argv in (["--output_dir", "RUN_A", "--seed", "1"], [*shlex.split(shown[0])[2:], "--output_dir", "RUN_B"]):
        done = subprocess.run([*train, *argv, *tiny], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    runs = [tmp_path / "RUN_A", tmp_path / "RUN_B"]
    assert (runs[0] / "tokenizer.json").read_bytes() == (runs[1] / "tokenizer.json").read_bytes()
    assert attn(["translate", "--model", str(runs[0]), "--model", str(runs[1]), "May 2, 2030", "--no_progress"]) == 0
