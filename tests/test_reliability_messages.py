"""What users met, tried as new users would (issue 40): each case ends in one line of ours naming the flag or path
and the problem, with exit status 2, and no command replaces another model's files without --force.

The runs are real: `attn train` writes the folders that the other commands are pointed at.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_reliability_inputs import run_cli
from transformers import AutoModelForSeq2SeqLM

from modeling_attn.api.outputs import MANIFEST
from modeling_attn.loading import WeightsError

# a Transformer or RNN run of two steps, a checkpoint each, on a slice of the embedded dates task
TINY_RUN = shlex.split(
    "--vocab_size 120 --max_train_samples 40 --max_eval_samples 8 --max_steps 2 --save_steps 1 --eval_strategy no "
    "--do_predict False --report_to none --disable_tqdm True --average_last_n 1 --generation_max_length 12"
)


def one_line(argv: list[str]) -> str:
    """The error line of a user error: exit status 2, and the last line of stderr (a progress bar may precede it)."""
    status, stderr = run_cli(argv)
    assert status == 2, stderr[-2000:]
    return stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> SimpleNamespace:
    """Two real `attn train` runs: a Transformer (the model the commands read) and an RNN (another model)."""
    root = tmp_path_factory.mktemp("runs")
    torch.set_num_threads(1)
    for name, flags in {
        "transformer": ["--preset", "tiny"],
        "rnn": ["--model_type", "attn_rnn", "--preset", "rnn-tiny"],
    }.items():
        status, stderr = run_cli(["train", *flags, *TINY_RUN, "--output_dir", str(root / name)])
        assert status == 0, stderr[-3000:]
    return SimpleNamespace(root=root, transformer=root / "transformer", rnn=root / "rnn")


def rnn_files(runs: SimpleNamespace) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in runs.rnn.iterdir() if path.is_file()}


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (lambda runs: ["average", str(runs.transformer), "--output_dir", str(runs.rnn)], "--output_dir"),
        (lambda runs: ["convert", "--to_marian", str(runs.transformer), "--to", str(runs.rnn)], "--to"),
        (lambda runs: ["export", str(runs.transformer), "--onnx", str(runs.rnn)], "--onnx"),
    ],
    ids=["average", "convert", "export"],
)
def test_a_command_never_replaces_another_run_that_attn_wrote(argv, flag, runs):
    before = rnn_files(runs)
    line = one_line(argv(runs))
    assert line.startswith(f"attn {argv(runs)[0]}: error: {flag} {runs.rnn} holds another model, written by ")
    assert f"`attn train --output_dir {runs.rnn.resolve()}`" in line and "pass --force" in line
    assert rnn_files(runs) == before


def test_force_replaces_another_model_and_then_the_folder_is_the_new_writers(runs, tmp_path):
    target = tmp_path / "rnn-copy"
    shutil.copytree(runs.rnn, target)
    assert run_cli(["average", str(runs.transformer), "--output_dir", str(target)])[0] == 2
    assert run_cli(["average", str(runs.transformer), "--output_dir", str(target), "--force"])[0] == 0
    assert json.loads((target / "config.json").read_text())["model_type"] == "attn_transformer"
    assert run_cli(["average", str(runs.transformer), "--output_dir", str(target)])[0] == 0  # its own output now


def test_explain_writes_only_its_page(runs, tmp_path):
    page = tmp_path / "page"
    page.mkdir()
    status, stderr = run_cli(
        ["explain", "--model", str(runs.transformer), "1 May 2030", "--output", str(page / "x.html")]
    )
    assert status == 0, stderr[-2000:]
    assert sorted(path.name for path in page.iterdir()) == ["x.html"]
    assert not (page / MANIFEST).exists()


def test_a_missing_model_name_or_path_is_named_as_a_folder(tmp_path):
    line = one_line(["train", "--model_name_or_path", "./folder", "--output_dir", str(tmp_path / "o")])
    assert line == "attn train: error: --model_name_or_path ./folder: no such model folder"


def test_a_mistyped_run_folder_is_named_at_once_with_the_nearest_one(runs, monkeypatch):
    """`outputs/datse` where outputs/ exists: no Hub lookup (no retries to huggingface.co), the nearest folder."""
    monkeypatch.chdir(runs.root.parent)
    mistyped = f"{runs.root.name}/transfromer"
    line = one_line(["translate", "--model", mistyped, "1 May 2030"])
    assert (
        line == f"attn translate: error: {mistyped}: no such model folder; did you mean {runs.root.name}/transformer?"
    )


def _edited_copy(runs: SimpleNamespace, tmp_path: Path, name: str, **fields) -> Path:
    folder = tmp_path / name
    shutil.copytree(runs.transformer, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


def test_a_misspelt_model_type_is_named_with_the_nearest_one(runs, tmp_path):
    folder = _edited_copy(runs, tmp_path, "typo", model_type="attn_transformr")
    assert one_line(["translate", "--model", str(folder), "1 May 2030"]) == (
        f"attn translate: error: {folder}/config.json: model_type 'attn_transformr' is not a model type of "
        "transformers or modeling_attn; did you mean 'attn_transformer'?"
    )


def test_a_config_whose_vocabulary_does_not_fit_the_weights_names_the_tensor(runs, tmp_path):
    config = json.loads((runs.transformer / "config.json").read_text())
    vocabulary, width = config["vocab_size"], config["d_model"]
    folder = _edited_copy(runs, tmp_path, "vocab", vocab_size=vocabulary + 8, decoder_vocab_size=vocabulary + 8)
    expected = (
        f"{folder}/model.safetensors: the weights do not fit config.json (model.shared.weight is "
        f"[{vocabulary}, {width}] in the weights, [{vocabulary + 8}, {width}] by the config)"
    )
    for command in (
        ["translate", "--model", str(folder), "1 May 2030"],
        ["export", str(folder), "--ctranslate2", str(tmp_path / "c")],
    ):
        line = one_line(command)
        assert line.startswith(f"attn {command[0]}: error: {expected}"), line


def test_corrupt_weights_are_named_by_the_commands_and_by_a_plain_from_pretrained(runs, tmp_path):
    folder = _edited_copy(runs, tmp_path, "corrupt")
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 3])
    line = one_line(["export", str(folder), "--ctranslate2", str(tmp_path / "c")])
    assert line.startswith(f"attn export: error: {folder}/model.safetensors: the safetensors weights are corrupt")
    with pytest.raises(WeightsError, match=rf"^{folder}/model\.safetensors: the safetensors weights are corrupt"):
        AutoModelForSeq2SeqLM.from_pretrained(folder)


def test_a_config_with_zero_layers_names_that_field(runs, tmp_path):
    for model_type, run in (("attn_transformer", runs.transformer), ("attn_rnn", runs.rnn)):
        folder = tmp_path / model_type
        shutil.copytree(run, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "encoder_layers": 0}))
        line = one_line(["translate", "--model", str(folder), "1 May 2030"])
        config_class = "AttnTransformerConfig" if model_type == "attn_transformer" else "AttnRNNConfig"
        assert line == (
            f"attn translate: error: {folder}: invalid config.json: {config_class}.encoder_layers=0: zero encoder "
            "layers; a model needs at least one encoder layer (give 1 or more)"
        )


def test_table_and_text_training_files_together_are_named(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("a b\tc d\n")
    for split in ("train", "valid"):
        (data / f"{split}.en").write_text("a b\n")
        (data / f"{split}.de").write_text("c d\n")
    line = one_line(["train", "--data", str(data), "--output_dir", str(tmp_path / "o"), "--max_steps", "1"])
    assert line == (
        f"attn train: error: {data}: train.tsv and train.{{de,en}} are both training data; keep one format (one file "
        "per language, or one TSV / JSONL file per split)"
    )


def test_overwriting_and_resuming_together_are_named_as_a_contradiction(tmp_path):
    line = one_line(
        ["train", "--output_dir", str(tmp_path / "new"), "--overwrite_output_dir", "--resume_from_checkpoint", "last"]
    )
    assert line == (
        "attn train: error: --overwrite_output_dir deletes the checkpoints of --output_dir, --resume_from_checkpoint "
        "continues from one: give one of them"
    )


@pytest.mark.parametrize("files", [{}, {"train.en": "a\n", "train.de": "b\n", "valid.en": "a\n", "valid.de": "b\n"}])
def test_evaluate_without_a_test_split_speaks_of_the_test_split_and_its_own_flags(files, runs, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name, text in files.items():
        (data / name).write_text(text)
    line = one_line(["evaluate", "--model", str(runs.transformer), "--data", str(data)])
    present = "it has train, validation" if files else "it has none"
    assert line == (
        f"attn evaluate: error: --data {data}: no test split (looked for files test.*, or a dataset split named test; "
        f"{present}); choose another --split, or give --sources_file and --references_file"
    )
    assert "--do_predict" not in line


def test_a_successful_onnx_export_prints_no_warnings(runs, tmp_path):
    pytest.importorskip("onnxscript", reason="the ONNX export needs the onnx extra")
    argv = [
        sys.executable,
        "-m",
        "modeling_attn.cli.main",
        "export",
        str(runs.transformer),
        "--onnx",
        str(tmp_path / "x"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]
    assert printed == [], printed
