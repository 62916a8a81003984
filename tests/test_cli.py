"""The `attn` command line (modeling_attn/cli/) and the flags of `attn average | preset | push | convert |
export`: one convention (modeling_attn/cli/parser.py), user errors as one line on stderr with exit status 2, and the
same result whichever way a flag is spelt or given (flag, positional argument, flags file)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_training_averaging import save_checkpoints
from tiny import tiny_model

import modeling_attn
from modeling_attn.api.hub import RESULTS_FILE
from modeling_attn.api.presets import load_preset
from modeling_attn.cli.main import COMMANDS
from modeling_attn.cli.main import main as attn


def run(argv: list[str]) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of `attn ...` run in this process (argparse exits through SystemExit)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            status = attn(argv)
        except SystemExit as exit_:
            status = exit_.code
    return status, stdout.getvalue(), stderr.getvalue()


def one_line_error(argv: list[str]) -> str:
    """The error line of a user error: exit status 2, exactly one line on stderr, `attn COMMAND: error: ...`."""
    status, _, stderr = run(argv)
    lines = stderr.splitlines()
    assert status == 2, (status, stderr)
    assert len(lines) == 1, stderr
    command = "attn" if argv[0] not in COMMANDS else f"attn {argv[0]}"
    assert lines[0].startswith(f"{command}: error: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A saved tiny model and a training folder with three checkpoints."""
    root = tmp_path_factory.mktemp("cli")
    tiny_model().save_pretrained(root / "model")
    (root / "run").mkdir()
    save_checkpoints(root / "run", 3)
    (root / "empty").mkdir()
    (root / "config_only").mkdir()
    shutil.copy(root / "model" / "config.json", root / "config_only")
    return root


def test_attn_alone_prints_the_commands_and_exits_2():
    status, stdout, stderr = run([])
    assert status == 2 and stdout == ""
    assert all(f"\n  {name} " in stderr for name in COMMANDS)


def test_help_lists_every_command_and_version_prints_the_package_version():
    status, stdout, _ = run(["--help"])
    assert status == 0
    listed = [line.split()[0] for line in stdout.split("commands:\n")[1].split("\n\n")[0].splitlines()]
    expected = ["train", "average", "translate", "distill", "score", "evaluate", "push", "convert", "export"]
    assert listed == list(COMMANDS) == [*expected, "explain", "preset", "serve"]
    assert run(["--version"])[:2] == (0, f"modeling-attn {modeling_attn.__version__}\n")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["trian"], "unknown command 'trian'; did you mean 'train'?"),
        (["exprot", "--model", "m"], "unknown command 'exprot'; did you mean 'export'?"),
        (
            ["zzz"],
            "unknown command 'zzz'; one of "
            "train, average, translate, distill, score, evaluate, push, convert, export, explain, preset, serve",
        ),
        (["--verbose"], "unknown option '--verbose'; a command comes first"),
    ],
)
def test_an_unknown_command_is_one_line(argv, expected):
    assert expected in one_line_error(argv)


# -- what needs no model answers at once --------------------------------------------------------------------------

# Command lines that need no model: `attn` answers them without importing torch or transformers (issue 55: 4 s each,
# when importing the package loaded both). Not `attn train`: its flags are transformers' Seq2SeqTrainingArguments.
WITHOUT_A_MODEL = [
    ["--help"],
    ["--version"],
    ["tarnslate", "--model", "m"],
    ["preset"],
    ["preset", "tyny"],
    *([command, "--help"] for command in COMMANDS if command != "train"),
    *([command, "--bogus"] for command in COMMANDS if command != "train"),
    ["translate", "--model", "m", "--batch_size", "0"],  # out of its declared range
    ["serve", "--model", "m", "--engine", "tensorflow"],  # not one of the choices
    ["evaluate", "--model", "m", "--num_beams", "two"],  # not a number
]


def fresh_attn(argv: list[str], module: bool = False) -> tuple[int, str, list[str], set[str]]:
    """`attn ARGV` in a fresh process, as the console script (or `python -m modeling_attn.cli.main`): its exit status,
    stdout, stderr lines, and the top-level packages it imported (Python's -X importtime report)."""
    executable = Path(sys.executable).with_name("attn")
    command = [sys.executable, "-m", "modeling_attn.cli.main"] if module else [str(executable)]
    assert module or executable.exists(), "the attn console script is not installed (pip install -e .)"
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([*command, *argv], capture_output=True, text=True, env=env, timeout=300)
    report = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in report[1:]}  # [0] is the header
    messages = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    return result.returncode, result.stdout, messages, imported


@pytest.mark.parametrize("argv", WITHOUT_A_MODEL, ids=" ".join)
def test_help_presets_and_command_line_errors_import_neither_torch_nor_transformers(argv):
    status, stdout, messages, imported = fresh_attn(argv)
    assert "modeling_attn" in imported  # the report is read
    assert not {"torch", "transformers"} & imported
    if messages:  # a command-line error: one line, exit status 2
        assert (status, len(messages)) == (2, 1) and ": error: " in messages[0], messages
    else:
        assert status == 0 and stdout


def test_python_m_answers_without_torch_too_and_a_model_command_still_registers_the_models(tmp_path):
    status, stdout, _, imported = fresh_attn(["export", "--help"], module=True)
    assert status == 0 and "--ctranslate2" in stdout and not {"torch", "transformers"} & imported
    status, _, messages, imported = fresh_attn(["translate", "--bogus"], module=True)
    assert status == 2 and len(messages) == 1 and not {"torch", "transformers"} & imported
    # printing a preset builds its config: transformers is imported, and the check above would see it
    status, stdout, _, imported = fresh_attn(["preset", "tiny"])
    assert status == 0 and json.loads(stdout)["model_type"] == "attn_transformer" and "transformers" in imported


def test_importing_the_package_elsewhere_registers_the_models_at_once():
    """`import modeling_attn` in any process but the `attn` command's registers the model types and the pipeline."""
    code = (
        "import modeling_attn\n"
        "from transformers import AutoConfig, pipelines\n"
        "print(type(AutoConfig.for_model('attn_rnn')).__name__, pipelines.check_task('translation_en_to_de')[2])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["AttnRNNConfig", "('en',", "'de')"], result.stderr[-2000:]


# For each command: an unknown flag, a misspelt flag (named with its closest valid flag), bad values.
CASES = [
    (lambda w: ["average", str(w / "run"), "--output_dir", str(w / "a"), "--zzz"], "unrecognized flag --zzz (see"),
    (
        lambda w: ["average", str(w / "run"), "--ouput_dir", str(w / "a")],
        "unrecognized flag --ouput_dir; did you mean --output_dir?",
    ),
    (
        lambda w: ["average", str(w / "run"), "--output_dir", str(w / "a"), "--last", "0"],
        "argument --last: must be a positive integer, got 0",
    ),
    (
        lambda w: ["average", str(w / "run"), "--output_dir", str(w / "a"), "--last", "two"],
        "argument --last: invalid int value: 'two'",
    ),
    (lambda w: ["average", str(w / "absent"), "--output_dir", str(w / "a")], "{w}/absent: no such model folder"),
    (lambda w: ["average", str(w / "empty"), "--output_dir", str(w / "a")], r"empty: no model*.safetensors file"),
    (
        lambda w: ["average", "--output_dir", str(w / "a")],
        "the following arguments are required: INPUTS (or --inputs)",
    ),
    (lambda w: ["preset", "--zzz"], "unrecognized flag --zzz (see"),
    (lambda w: ["preset", "--nmae", "base"], "unrecognized flag --nmae; did you mean --name?"),
    (lambda w: ["preset", "bsae"], "unknown preset 'bsae'; did you mean 'base'?"),
    (lambda w: ["preset", "small", "--name", "base"], "NAME given twice: as an argument (small) and as --name"),
    (lambda w: ["push", "--model", str(w / "model"), "--repo-id", "me/m", "--zzz"], "unrecognized flag --zzz (see"),
    (
        lambda w: ["push", "--model", str(w / "model"), "--repo_idd", "me/m"],
        "unrecognized flag --repo_idd; did you mean --repo_id?",
    ),
    (lambda w: ["push", "--model", str(w / "absent"), "--repo-id", "me/m"], "{w}/absent: no such model folder"),
    (lambda w: ["push", "--model", str(w / "model"), "--repo-id", "me/a b"], "--repo_id me/a b: Repo id must use"),
    (
        lambda w: ["push", "--model", str(w / "model"), "--repo-id", "me/m", "--results", str(w / "none.json")],
        "--results {w}/none.json: no such file",
    ),
    (
        lambda w: ["push", "--model", str(w / "config_only"), "--repo-id", "me/m", "--save-to", str(w / "p")],
        "{w}/config_only: no tokenizer (tokenizer.json / tokenizer_config.json)",
    ),
    (
        lambda w: ["push", "--model", str(w / "model"), "--repo-id", "me/m", "--private", "maybe"],
        "argument --private: Truthy value expected: got maybe",
    ),
    (
        lambda w: ["convert", "--from-marian", str(w / "model"), "--to", str(w / "c"), "--zzz"],
        "unrecognized flag --zzz (see",
    ),
    (
        lambda w: ["convert", "--from-mariann", str(w / "model"), "--to", str(w / "c")],
        "unrecognized flag --from-mariann; did you mean --from_marian?",
    ),
    (
        lambda w: ["convert", "--to", str(w / "c")],
        "give one of --from_marian SRC (Marian to attn_transformer) or --to_marian SRC (back)",
    ),
    (
        lambda w: ["convert", "--from-marian", str(w / "absent"), "--to", str(w / "c")],
        "{w}/absent: no such model folder",
    ),
    (
        lambda w: ["convert", "--from-marian", str(w / "model"), "--to", str(w / "c")],
        "holds a 'attn_transformer' model, not a Marian one",
    ),
    (
        lambda w: ["convert", "--to-marian", str(w / "empty"), "--to", str(w / "c")],
        "{w}/empty: no config.json (a folder written by save_pretrained or attn train)",
    ),
    (
        lambda w: ["convert", "--to-marian", str(w / "config_only"), "--to", str(w / "c")],
        "{w}/config_only: no safetensors weights (model.safetensors) found",
    ),
    (lambda w: ["export", str(w / "model"), "--ctranslate2", str(w / "e"), "--zzz"], "unrecognized flag --zzz (see"),
    (
        lambda w: ["export", str(w / "model"), "--ctranslate2", str(w / "e"), "--quantisation", "int8"],
        "unrecognized flag --quantisation; did you mean --quantization?",
    ),
    (
        lambda w: ["export", str(w / "model"), "--ctranslate2", str(w / "e"), "--quantization", "int3"],
        "argument --quantization: invalid choice: 'int3'",
    ),
    (lambda w: ["export", str(w / "absent"), "--ctranslate2", str(w / "e")], "{w}/absent: no such model folder"),
    (
        lambda w: ["export", str(w / "empty"), "--ctranslate2", str(w / "e")],
        "{w}/empty: no config.json (a folder written by save_pretrained or attn train)",
    ),
    (
        lambda w: ["export", str(w / "config_only"), "--ctranslate2", str(w / "e")],
        "{w}/config_only: no safetensors weights (model.safetensors) found",
    ),
    (lambda w: ["export", "--ctranslate2", str(w / "e")], "the following arguments are required: MODEL (or --model)"),
    (
        lambda w: ["export", str(w / "model"), "--model", str(w / "model"), "--ctranslate2", str(w / "e")],
        "MODEL given twice",
    ),
    (
        lambda w: ["export", str(w / "model"), "--ctranslate2", str(w / "model"), "--force"],
        "--ctranslate2 {w}/model is --model {w}/model: writing it would destroy the input",
    ),
    (
        lambda w: ["export", str(w / "model"), "--ctranslate2", str(w / "run")],
        "--ctranslate2 {w}/run holds files that attn export did not write "
        "(checkpoint-10/, checkpoint-20/, checkpoint-30/)",
    ),
    (
        lambda w: ["average", str(w / "run"), "--output_dir", str(w / "run" / "checkpoint-30")],
        "--output_dir {w}/run/checkpoint-30 is input checkpoint 3 {w}/run/checkpoint-30: writing it would destroy",
    ),
    (
        lambda w: ["average", str(w / "run"), "--output_dir", str(w / "model")],
        "--output_dir {w}/model holds files that attn average did not write "
        "(config.json, generation_config.json, model.safetensors and ",
    ),
    (
        lambda w: ["convert", "--to_marian", str(w / "model"), "--to", str(w / "model" / "marian")],
        "--to {w}/model/marian is inside --to_marian {w}/model: write it somewhere else",
    ),
    (
        lambda w: ["push", "--model", str(w / "model"), "--repo_id", "u/m", "--save_to", str(w / "model" / "hub")],
        "--save_to {w}/model/hub is inside --model {w}/model",
    ),
]


@pytest.mark.parametrize(("argv", "expected"), CASES)
def test_a_user_error_is_one_line_with_exit_status_2(argv, expected, world):
    if argv(world)[0] in ("export",):
        pytest.importorskip("ctranslate2", reason="the fast extra's ctranslate2 is not installed")
    assert expected.format(w=world) in one_line_error(argv(world))


def test_every_command_of_this_module_is_covered_by_the_error_cases(world):
    assert {argv(world)[0] for argv, _ in CASES} == {"average", "preset", "push", "convert", "export"}


# Every subcommand, the same three user errors: a misspelt flag (named with its closest valid flag), a flag no
# command has, and a bad value. Each ends in one line on stderr and exit status 2, before any model is loaded.
EVERY_COMMAND = {
    "train": (["--output_dir", "{w}/t"], "--max_step", "--max_steps", ["--max_steps", "many"]),
    "translate": (["--model", "{w}/model"], "--batchsize", "--batch_size", ["--batch_size", "many"]),
    "evaluate": (["--model", "{w}/model"], "--max_sample", "--max_samples", ["--max_samples", "many"]),
    "average": (["{w}/run", "--output_dir", "{w}/a"], "--lastt", "--last", ["--last", "many"]),
    "preset": ([], "--nam", "--name", ["tiny", "--name", "small"]),
    "push": (["--model", "{w}/model", "--repo-id", "a/b"], "--privat", "--private", ["--private", "maybe"]),
    "convert": (["--to", "{w}/c"], "--from_mariam", "--from_marian", ["--to", "{w}/c", "--from_marian"]),
    "export": (["{w}/model", "--ctranslate2", "{w}/e"], "--quantisation", "--quantization", ["--quantization", "x"]),
    "serve": (["--model", "{w}/model"], "--max_queu", "--max_queue", ["--max_queue", "0"]),
    "score": (["--model", "{w}/model"], "--batchsize", "--batch_size", ["--batch_size", "many"]),
    "distill": (
        ["--model", "{w}/model", "--data", "{w}", "--source_lang", "a", "--target_lang", "b", "--output_dir", "{w}/d"],
        "--keep_orignal",
        "--keep_original",
        ["--num_beams", "0"],
    ),
    "explain": (
        ["--model", "{w}/model", "--output", "{w}/x.html", "a"],
        "--num_beam",
        "--num_beams",
        ["--num_beams", "0"],
    ),
}


def test_the_error_cases_below_cover_every_command():
    assert set(EVERY_COMMAND) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(EVERY_COMMAND))
def test_every_command_refuses_bad_flags_in_one_line(command, world):
    base, misspelt, closest, bad_value = EVERY_COMMAND[command]
    base = [argument.format(w=world) for argument in base]
    line = one_line_error([command, *base, misspelt, "1"])
    assert f"unrecognized flag {misspelt}; did you mean {closest}?" in line
    assert "unrecognized flag --no_such_flag_anywhere" in one_line_error([command, *base, "--no_such_flag_anywhere"])
    one_line_error([command, *base, *(argument.format(w=world) for argument in bad_value)])
    assert not any((world / name).exists() for name in ("t", "a", "c", "e"))


def test_export_without_the_interop_extra_names_it(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # what an environment without ctranslate2 gives: ImportError
    line = one_line_error(["export", str(world / "model"), "--ctranslate2", str(world / "e")])
    assert line.endswith('needs the ctranslate2 package: pip install "modeling-attn[interop]"')
    assert not (world / "e").exists()


def test_the_attn_executable_gives_the_same_one_line_errors(world):
    """The installed console script (pyproject's [project.scripts]) in a fresh process, not only `main`."""
    executable = Path(sys.executable).with_name("attn")
    if not executable.exists():
        executable = shutil.which("attn")
    assert executable is not None, "the attn console script is not installed (pip install -e .)"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    argv = ["export", str(world / "model"), "--ctranslate2", str(world / "e"), "--quantisation", "int8"]
    result = subprocess.run([str(executable), *argv], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "attn export: error: unrecognized flag --quantisation; did you mean --quantization? (see attn export --help)"
    ]
    result = subprocess.run([str(executable), "--version"], capture_output=True, text=True, env=env, timeout=300)
    assert (result.returncode, result.stdout) == (0, f"modeling-attn {modeling_attn.__version__}\n")


def test_help_shows_the_defaults_that_apply():
    status, stdout, _ = run(["average", "--help"])
    assert status == 0 and "(default: 5)" in stdout.split("--last LAST")[-1]
    status, stdout, _ = run(["export", "--help"])
    assert status == 0 and "(default: float32)" in stdout
    status, stdout, _ = run(["push", "--help"])  # the file it names without importing the API
    assert status == 0 and f"(default: the model folder's {RESULTS_FILE})" in " ".join(stdout.split())


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_average_flags_in_any_spelling_give_the_same_model(world, tmp_path):
    """Positional folder vs --inputs checkpoint folders, --output_dir vs --output-dir, a YAML flags file: the same
    average, and it is the element-wise mean of the last two checkpoints."""
    run_dir = world / "run"
    assert run(["average", str(run_dir), "--last", "2", "--output_dir", str(tmp_path / "a")])[0] == 0
    checkpoints = [str(run_dir / "checkpoint-20"), str(run_dir / "checkpoint-30")]
    assert run(["average", "--inputs", *checkpoints, "--output-dir", str(tmp_path / "b")])[0] == 0
    flags = tmp_path / "average.yaml"
    flags.write_text(f"inputs: [{run_dir}]\nlast: 2\noutput-dir: {tmp_path / 'c'}\n")
    assert run(["average", str(flags)])[0] == 0
    a, b, c = (weights(tmp_path / name) for name in "abc")
    two = [weights(Path(path)) for path in checkpoints]
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]) and torch.equal(tensor, c[name])
        torch.testing.assert_close(tensor, ((two[0][name].double() + two[1][name].double()) / 2).to(tensor.dtype))


def test_preset_name_as_argument_flag_or_file(tmp_path):
    expected = json.dumps(load_preset("small").to_diff_dict(), indent=2) + "\n"
    (tmp_path / "preset.json").write_text('{"name": "small"}')
    for argv in (["preset", "small"], ["preset", "--name", "small"], ["preset", str(tmp_path / "preset.json")]):
        assert run(argv)[:2] == (0, expected)
    status, stdout, _ = run(["preset"])
    assert status == 0 and stdout.split() == sorted(stdout.split()) and "small" in stdout.split()


def test_export_takes_the_model_as_argument_as_flag_or_from_a_file(world, tmp_path):
    """`attn export MODEL --ctranslate2 DIR` (the old form), `--model MODEL`, and a JSON flags file: one export."""
    pytest.importorskip("ctranslate2", reason="the fast extra's ctranslate2 is not installed")
    model = str(world / "model")
    assert run(["export", model, "--ctranslate2", str(tmp_path / "a")])[0] == 0
    assert run(["export", "--model", model, "--ctranslate2", str(tmp_path / "b"), "--quantization", "float32"])[0] == 0
    (tmp_path / "export.json").write_text(json.dumps({"model": model, "ctranslate2": str(tmp_path / "c")}))
    assert run(["export", str(tmp_path / "export.json")])[0] == 0
    files = [(tmp_path / name / "model.bin").read_bytes() for name in "abc"]
    assert files[0] == files[1] == files[2]
    assert run(["export", model, "--ctranslate2", str(tmp_path / "a"), "--force"])[0] == 0  # --force: overwrite


def test_push_save_to_takes_both_spellings(world, tmp_path):
    """`--repo-id` / `--repo_id`, `--save-to` / `--save_to`: the same files (no upload)."""
    pytest.importorskip("tokenizers", reason="needs the tokenizers package (a dependency of transformers)")
    from test_translate import save_tiny_model

    model = save_tiny_model(tmp_path / "model", "attn_transformer")
    assert run(["push", "--model", str(model), "--repo-id", "me/m", "--save-to", str(tmp_path / "a")])[0] == 0
    assert run(["push", "--model", str(model), "--repo_id", "me/m", "--save_to", str(tmp_path / "b")])[0] == 0
    names = sorted(path.name for path in (tmp_path / "a").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "b").iterdir()) and "README.md" in names
    for name in ("config.json", "generation_config.json", "README.md"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
