"""Every user condition named, on every command that can meet it (issue 49): the table of conditions in
docs/reliability.md, one test per row.

An output that cannot be written (a read-only file system, a full disk, a folder the user may not write), a Hub that
cannot be reached, a results file that is not JSON or lacks its score, a config with zero layers: each command that can
meet it ends with one line of ours, `attn COMMAND: error: ...` naming the path or the setting and what to do, exit
status 2, no traceback, and leaves nothing behind. The commands of a row run one after another in one real `attn`
process (`in_one_process`), so that a row pays for one interpreter start; the file systems are real (a tmpfs, as root:
the rows that need one are skipped with the reason elsewhere).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from full_disk import small_tmpfs
from runs import NO_EVAL, TINY, free_port
from test_translate import save_tiny_model

# `attn ARGV` for each ARGV of argv[1] (a JSON list), one after another in this process: [status, stderr] each, a bug's
# traceback in its stderr with status 1, as the `attn` executable would end.
IN_ONE_PROCESS = """
import contextlib, io, json, sys, traceback
from modeling_attn.cli.main import main
results = []
for argv in json.loads(sys.argv[1]):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exit_:
            status = exit_.code
        except BaseException:
            status = 1
            traceback.print_exc()
    results.append([status, stderr.getvalue()])
print(json.dumps(results))
"""

ONE_STEP = [*TINY, *NO_EVAL, "--max_train_samples", "20", "--max_steps", "1"]
REPO = Path(__file__).resolve().parents[1]
HAS_SERVE = importlib.util.find_spec("fastapi") is not None
HAS_CTRANSLATE2 = importlib.util.find_spec("ctranslate2") is not None


def in_one_process(commands: dict[str, list[str]], cwd: Path, env: dict | None = None, preexec_fn=None) -> dict:
    """{name: (exit status, stderr)} of each `attn` command line of `commands`, run in one process."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "ATTN_DEBUG": "", **(env or {})}
    done = subprocess.run(
        [sys.executable, "-c", IN_ONE_PROCESS, json.dumps(list(commands.values()))],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        preexec_fn=preexec_fn,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(commands, map(tuple, json.loads(done.stdout.splitlines()[-1])), strict=True))


def assert_one_line(results: dict, expected: dict[str, str]) -> None:
    """Each command ended with exit status 2 and `attn COMMAND: error: LINE` as its last line, no traceback."""
    assert set(results) == set(expected)
    for name, (status, stderr) in results.items():
        command = name.split("-")[0]
        assert status == 2 and "Traceback" not in stderr, (name, stderr[-3000:])
        assert stderr.strip().splitlines()[-1] == f"attn {command}: error: {expected[name]}", name


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> SimpleNamespace:
    """A tiny model and a copy, a sentence and its reference, two bad results files, and the model with zero encoder
    layers, and with zero decoder layers."""
    root = tmp_path_factory.mktemp("conditions")
    world = SimpleNamespace(root=root, model=save_tiny_model(root / "model", "attn_transformer"))
    world.copy = Path(shutil.copytree(world.model, root / "copy"))
    (root / "source.txt").write_text("hello\n")
    (root / "reference.txt").write_text("hallo\n")
    world.data = ["--sources_file", str(root / "source.txt"), "--references_file", str(root / "reference.txt")]
    (root / "not-json.json").write_text("{bleu: 3}")
    (root / "no-score.json").write_text('{"chrf": 3.0}')
    for stack in ("encoder", "decoder"):
        folder = Path(shutil.copytree(world.model, root / f"zero-{stack}"))
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, f"{stack}_layers": 0}))
    return world


# -- an output that cannot be written ------------------------------------------------------------------------------


def writers(world: SimpleNamespace, place: Path) -> dict[str, tuple[list[str], Path]]:
    """Every command that writes, each writing into `place`: (its command line, its output)."""
    model = str(world.model)
    outputs = {
        "train": (["train", "--output_dir", "{out}", *ONE_STEP], place / "run"),
        "translate": (["translate", "--model", model, "--output", "{out}", "hello"], place / "out.txt"),
        "evaluate-output": (["evaluate", "--model", model, *world.data, "--output", "{out}"], place / "results.json"),
        "evaluate-hypotheses": (["evaluate", "--model", model, *world.data, "--hypotheses", "{out}"], place / "h.txt"),
        "average": (["average", model, str(world.copy), "--output_dir", "{out}"], place / "average"),
        "convert": (["convert", "--to_marian", model, "--to", "{out}"], place / "marian"),
        "export": (["export", model, "--ctranslate2", "{out}"], place / "ct2"),
        "explain": (["explain", "--model", model, "--output", "{out}", "hello"], place / "page.html"),
        "push": (["push", "--model", model, "--repo_id", "me/model", "--save_to", "{out}"], place / "push"),
    }
    if not HAS_CTRANSLATE2:
        del outputs["export"]
    return {name: ([arg.replace("{out}", str(out)) for arg in argv], out) for name, (argv, out) in outputs.items()}


# A file output is staged beside it: where it cannot be written, its folder is named; a folder output is named itself.
FILE_OUTPUTS = {"translate", "evaluate-output", "evaluate-hypotheses", "explain"}


def named(name: str, output: Path) -> Path:
    return output.parent if name in FILE_OUTPUTS else output


def drop_file_permission_override() -> None:
    """In the child process, before it runs attn: root without CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER in
    its bounding set (prctl PR_CAPBSET_DROP), so that a folder's permission bits bind it as they bind any user (a
    user such as nobody could not run this interpreter where it lives under /root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def permission_override_refusal() -> str | None:
    """Why the no-permission row cannot run as root here, or None if it can."""
    try:
        done = subprocess.run(["true"], preexec_fn=drop_file_permission_override, capture_output=True)
    except (OSError, subprocess.SubprocessError) as error:
        return f"cannot drop root's file-permission override (prctl PR_CAPBSET_DROP, needs CAP_SETPCAP): {error}"
    return None if done.returncode == 0 else "cannot drop root's file-permission override"


@pytest.mark.slow  # one process, every command that writes: ~10 s
def test_a_read_only_output_is_named_on_every_command_that_writes(world, tmp_path):
    with small_tmpfs(tmp_path / "read-only", "1m", read_only=True) as place:
        commands = writers(world, place)
        results = in_one_process({name: argv for name, (argv, _) in commands.items()}, tmp_path)
        assert_one_line(
            results,
            {
                name: f"{named(name, output)}: read-only file system; give an output in a writable folder"
                for name, (_, output) in commands.items()
            },
        )
        assert list(place.iterdir()) == []


@pytest.mark.slow  # one process, every command that writes: ~10 s
def test_a_full_disk_is_named_on_every_command_that_writes_and_each_output_left_as_it_was(world, tmp_path):
    with small_tmpfs(tmp_path / "full", "64k") as place:
        with open(place / "filler", "wb", buffering=0) as filler, pytest.raises(OSError, match="No space left"):
            while True:  # every block of the disk taken
                filler.write(b"x" * 4096)
                filler.flush()
        commands = writers(world, place)
        results = in_one_process({name: argv for name, (argv, _) in commands.items()}, tmp_path)
        way_out = "(left as it was); free some space there, or give an output on another disk"
        assert_one_line(
            results,
            {
                name: f"No space left on device while writing {output} {way_out}"
                for name, (_, output) in commands.items()
            },
        )
        assert [path.name for path in place.iterdir()] == ["filler"]  # no folder, staging file or lock left


@pytest.mark.slow  # one process, every command that writes: ~10 s
def test_a_folder_the_user_may_not_write_is_named_on_every_command_that_writes(world, tmp_path):
    """As root, the commands run without root's override of permission bits (`drop_file_permission_override`); as
    another user, the folder's bits alone refuse the write."""
    root = os.geteuid() == 0
    if root and (reason := permission_override_refusal()):
        pytest.skip(reason)
    place = tmp_path / "not-mine"
    place.mkdir()
    place.chmod(0o555)
    try:
        commands = writers(world, place)
        results = in_one_process(
            {name: argv for name, (argv, _) in commands.items()},
            tmp_path,
            preexec_fn=drop_file_permission_override if root else None,
        )
        assert_one_line(
            results,
            {
                name: f"{named(name, output)}: no permission to write there; give an output in a folder you can write"
                for name, (_, output) in commands.items()
            },
        )
        assert list(place.iterdir()) == []
    finally:
        place.chmod(0o755)


@pytest.mark.slow  # one process, every command that reads a model folder: ~10 s
def test_an_input_the_user_may_not_read_is_named_on_every_command_that_reads_one(world, tmp_path):
    """A model folder, data, sources and a results file whose files the user may not read (mode 000; as root, the
    commands run without root's override of permission bits)."""
    root = os.geteuid() == 0
    if root and (reason := permission_override_refusal()):
        pytest.skip(reason)
    model = Path(shutil.copytree(world.model, tmp_path / "locked-model"))
    data = tmp_path / "locked-data"
    data.mkdir()
    for name, text in {"train.en": "a b\n", "train.de": "c d\n", "valid.en": "a\n", "valid.de": "c\n"}.items():
        (data / name).write_text(text)
    sources, results = tmp_path / "locked-sources.txt", tmp_path / "locked-results.json"
    sources.write_text("hello\n")
    results.write_text('{"bleu": 3.0}')
    locked = [*model.iterdir(), *data.iterdir(), sources, results]
    out = tmp_path / "out"
    commands = {
        "translate": ["translate", "--model", str(model), "hello"],
        "evaluate-model": ["evaluate", "--model", str(model), *world.data],
        "evaluate-sources": ["evaluate", "--model", str(world.model), *world.data[2:], "--sources_file", str(sources)],
        "explain": ["explain", "--model", str(model), "hello", "--output", str(tmp_path / "page.html")],
        "average": ["average", str(model), "--output_dir", str(out / "average")],
        "convert": ["convert", "--to_marian", str(model), "--to", str(out / "marian")],
        "export": ["export", str(model), "--ctranslate2", str(out / "ct2")],
        "push-model": ["push", "--model", str(model), "--repo_id", "me/model", "--save_to", str(out / "push")],
        "push-results": [
            *["push", "--model", str(world.model), "--repo_id", "me/model", "--results", str(results)],
            *["--save_to", str(out / "push")],
        ],
        "train": ["train", "--data", str(data), "--output_dir", str(out / "run"), *ONE_STEP],
    }
    if HAS_SERVE:
        commands["serve"] = ["serve", "--model", str(model), "--port", "0"]
    for path in locked:
        path.chmod(0o000)
    try:
        ran = in_one_process(commands, tmp_path, preexec_fn=drop_file_permission_override if root else None)
    finally:
        for path in locked:
            path.chmod(0o644)
    way_out = "no permission to read it; ask its owner for read access, or give a copy you can read"
    expected = {name: f"{model / 'config.json'}: {way_out}" for name in commands}
    expected |= {"evaluate-sources": f"{sources}: {way_out}", "push-results": f"{results}: {way_out}"}
    expected["train"] = ran["train"][1].strip().splitlines()[-1].removeprefix("attn train: error: ")
    assert re.fullmatch(rf"{re.escape(str(data))}/(train|valid)\.(en|de): {way_out}", expected["train"])
    assert_one_line(ran, expected)
    assert not out.exists() and not (tmp_path / "page.html").exists()


# -- what a command reads: the Hub, a results file, a config -------------------------------------------------------

HUB_ID = "someone/no-such-model"


@pytest.fixture(scope="module")
def reading(world) -> SimpleNamespace:
    """The commands of the rows below, in one process with a Hub endpoint nothing listens on and an empty Hub cache."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    out = world.root / "out"
    model, zero_encoder, zero_decoder = (
        str(world.model),
        str(world.root / "zero-encoder"),
        str(world.root / "zero-decoder"),
    )
    hub = {
        "translate": ["translate", "--model", HUB_ID, "hello"],
        "evaluate": ["evaluate", "--model", HUB_ID, *world.data],
        "explain": ["explain", "--model", HUB_ID, "hello", "--output", str(world.root / "page.html")],
        "convert": ["convert", "--from_marian", HUB_ID, "--to", str(out / "converted")],
        "push": ["push", "--model", model, "--repo_id", "me/model"],
        "train-model": ["train", "--model_name_or_path", HUB_ID, "--output_dir", str(out / "a"), *ONE_STEP[2:]],
        "train-tokenizer": ["train", "--tokenizer_name_or_path", HUB_ID, "--output_dir", str(out / "b"), *ONE_STEP],
        "train-data": ["train", "--data", HUB_ID, "--output_dir", str(out / "c"), *ONE_STEP],
    }
    results = {}
    for bad in ("not-json", "no-score"):
        path = str(world.root / f"{bad}.json")
        results[f"push-save-{bad}"] = ["push", "--model", model, "--repo_id", "me/m", "--results", path, "--save_to"]
        results[f"push-save-{bad}"].append(str(out / "push"))
        results[f"push-upload-{bad}"] = ["push", "--model", model, "--repo_id", "me/m", "--results", path]
    zero = {
        "train-transformer": [
            "train",
            "--output_dir",
            str(out / "d"),
            *ONE_STEP,
            "--config_overrides",
            "encoder_layers=0",
        ],
        "train-rnn": [
            *["train", "--output_dir", str(out / "e"), *ONE_STEP, "--model_type", "attn_rnn", "--preset", "rnn-tiny"],
            *["--config_overrides", "decoder_layers=0"],
        ],
        "train-model": ["train", "--model_name_or_path", zero_encoder, "--output_dir", str(out / "f"), *ONE_STEP[2:]],
        "translate-encoder": ["translate", "--model", zero_encoder, "hello"],
        "translate-decoder": ["translate", "--model", zero_decoder, "hello"],
        "evaluate": ["evaluate", "--model", zero_encoder, *world.data],
        "explain": ["explain", "--model", zero_encoder, "hello", "--output", str(world.root / "page.html")],
        "average": ["average", zero_encoder, "--output_dir", str(out / "average")],
        "export": ["export", zero_encoder, "--ctranslate2", str(out / "ct2")],
        "convert": ["convert", "--to_marian", zero_encoder, "--to", str(out / "marian")],
        "push": ["push", "--model", zero_encoder, "--repo_id", "me/model", "--save_to", str(out / "push")],
    }
    if HAS_SERVE:
        hub["serve"] = ["serve", "--model", HUB_ID, "--port", "0"]
        zero["serve"] = ["serve", "--model", zero_encoder, "--port", "0"]
    rows = {"hub": hub, "results": results, "zero": zero}
    commands = {f"{row}:{name}": argv for row, named_commands in rows.items() for name, argv in named_commands.items()}
    env = {"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_unused", "HF_HOME": str(world.root / "hf")}
    ran = in_one_process(commands, world.root, env)
    by_row = {
        row: {name.split(":", 1)[1]: result for name, result in ran.items() if name.startswith(f"{row}:")}
        for row in rows
    }
    left = [path for path in (out, world.root / "page.html") if path.exists()]
    return SimpleNamespace(endpoint=endpoint, left=left, **by_row)


@pytest.mark.slow  # its share of one process: ~11 s, the commands of three rows
def test_an_unreachable_hub_is_named_on_every_command_that_takes_a_hub_id(reading):
    """At once (one request of at most 5 s), not transformers' half a minute of retries; both readings named."""
    unreachable = f"could not be reached to look for the repository {HUB_ID} (ConnectError)"
    model = f"{HUB_ID}: no such model folder here, and the Hub ({reading.endpoint}) {unreachable}"
    expected = {
        name: model for name in ("translate", "evaluate", "explain", "convert", "serve") if name in reading.hub
    }
    expected |= {
        "push": f"the Hub ({reading.endpoint}) could not be reached: [Errno 111] Connection refused; check the "
        "network or HF_ENDPOINT",
        "train-model": f"--model_name_or_path {model}",
        "train-tokenizer": f"--tokenizer_name_or_path {HUB_ID}: no such tokenizer folder here, and the Hub "
        f"({reading.endpoint}) {unreachable}",
        "train-data": f"--data {HUB_ID}: no such data folder here, and the Hub ({reading.endpoint}) {unreachable}",
    }
    assert_one_line(reading.hub, expected)


@pytest.mark.slow  # its share of one process
def test_a_results_file_that_is_not_json_or_lacks_its_score_is_named_before_any_upload(reading, world):
    """`attn push --results`, writing a folder or uploading: the file named with what it should hold, before the Hub
    is asked anything (it cannot be reached here)."""
    not_json = (
        f"{world.root / 'not-json.json'}: the evaluation results (the JSON of `attn evaluate --output`) is not valid "
        "JSON (Expecting property name enclosed in double quotes at line 1, column 2)"
    )
    no_score = f"{world.root / 'no-score.json'}: no 'bleu' or 'test_bleu' score; expected the JSON of `attn evaluate "
    no_score += "--output`"
    expected = {
        f"push-{way}-{bad}": line
        for way in ("save", "upload")
        for bad, line in (("not-json", not_json), ("no-score", no_score))
    }
    assert_one_line(reading.results, expected)


@pytest.mark.slow  # its share of one process
def test_a_config_with_zero_layers_is_named_as_zero_layers_on_every_command(reading, world):
    """Zero encoder or decoder layers: named as such (not "must be a positive integer"), for a new model's config
    (attn train --config_overrides, both model types) and for a model folder every command loads."""

    def zero(model_type: str, stack: str) -> str:
        return (
            f"{model_type}.{stack}_layers=0: zero {stack} layers; a model needs at least one {stack} layer (give 1 or "
            "more)"
        )

    encoder = zero("AttnTransformerConfig", "encoder")
    in_folder = f"{world.root / 'zero-encoder'}: invalid config.json: {encoder}"
    expected = {name: in_folder for name in reading.zero}
    expected |= {
        "train-transformer": f"--config_overrides encoder_layers=0: {encoder}",
        "train-rnn": f"--config_overrides decoder_layers=0: {zero('AttnRNNConfig', 'decoder')}",
        "train-model": f"--model_name_or_path {in_folder}",
        "translate-decoder": f"{world.root / 'zero-decoder'}: invalid config.json: "
        + zero("AttnTransformerConfig", "decoder"),
    }
    assert_one_line(reading.zero, expected)


@pytest.mark.slow  # its share of one process
def test_the_commands_that_read_leave_no_folder_and_no_file_when_they_fail(reading):
    """None of the commands above wrote anything, nor left a folder it created for its output (`--save_to out/push`
    creates out/ for its staging folder: removed again)."""
    assert reading.left == []


# -- the table in docs/reliability.md -------------------------------------------------------------------------------

TABLE_TITLE = "## Every user condition, on every command"


def test_every_cell_of_the_table_in_the_docs_names_tests_that_exist():
    """Each cell a command can meet names its tests by the legend's letters, and each test the legend names exists."""
    section = (REPO / "docs" / "reliability.md").read_text(encoding="utf-8").split(TABLE_TITLE)[1].split("\n## ")[0]
    legend = {}
    for letters, path, function in re.findall(r"\b([A-Z]{1,2})\s+`(tests/[\w/]+\.py)?(?:::(test_\w+))?`", section):
        source = (REPO / (path or "tests/test_reliability_conditions.py")).read_text(encoding="utf-8")
        assert not function or f"def {function}(" in source, f"{letters}: {path}::{function} does not exist"
        legend[letters] = function
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")][2:]
    assert len(rows) == 7 and {len(row) for row in rows} == {11}
    for condition, _, *cells in rows:
        for cell in cells:
            if cell.strip() in ("-", "local folders only"):
                continue
            named = re.findall(r"(?:^|, )([A-Z]{1,2})\b", cell.strip())
            assert named and set(named) <= set(legend), (condition, cell)
