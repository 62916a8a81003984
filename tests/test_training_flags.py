"""Tests of `attn train`'s command line and flags (modeling_attn/cli/train.py, training/arguments.py,
training/validate.py, training/hub_push.py; issues 24, 25 and 29): the CommandParser convention
(flags files, aliases of run_translation.py's names, one-line errors), flags that would be silently beaten refused
up front, output folders never mixed, --load_best_model_at_end, --early_stopping_patience, the throughput Trainer
logs, and one decoding for the trained folder, the pushed folder and the card.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import Future
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
from huggingface_hub import ModelCard, get_token
from modeling_attn.training.data import load_parallel_data
from modeling_attn.training.hub_push import CheckpointPush, hub_uploads
from modeling_attn.training.train import TrainingRun
from modeling_attn.training.trainer import TranslationTrainer
from runs import ATTN_TRAIN, QUIET
from runs import TINY_TASK as TINY
from safetensors.torch import load_file
from tiny import tiny_model
from torch.nn.modules.module import _IncompatibleKeys
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

import modeling_attn  # noqa: F401
from modeling_attn.api.hub import save_for_hub
from modeling_attn.api.metrics import translation_scores
from modeling_attn.api.translation import translate_batch
from modeling_attn.cli.main import main as attn
from modeling_attn.cli.train import build_parser, parse_args
from modeling_attn.cli.train import main as cli_main
from modeling_attn.cli.train import train as main

REPO = Path(__file__).resolve().parents[1]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("attn train: error: ")
    return err


def test_unknown_and_abbreviated_flags_are_one_line_naming_the_closest(capsys):
    for flag, closest in (("--datta", "--data"), ("--learning_r", "--learning_rate"), ("--max-step", "--max_steps")):
        assert attn(["train", flag, "1"]) == 2
        assert f"did you mean {closest}?" in one_line_error(capsys)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        # issue 34: these trained anyway, decoded with NaN scores or ended in a traceback / an empty message
        (
            ["--max_steps", "0"],
            "argument --max_steps: must be a positive integer or -1 (-1: train for --num_train_epochs), got 0",
        ),
        (
            ["--max_steps=-5"],
            "argument --max_steps: must be a positive integer or -1 (-1: train for --num_train_epochs), got -5",
        ),
        (["--vocab_size", "0"], "argument --vocab_size: must be a positive integer, got 0"),
        (["--vocab_size=-7"], "argument --vocab_size: must be a positive integer, got -7"),
        (["--generation_num_beams", "0"], "argument --generation_num_beams: must be a positive integer, got 0"),
        (
            ["--label_smoothing_factor", "1.5"],
            "argument --label_smoothing_factor: must be a probability in [0, 1], got 1.5",
        ),
        (["--length_penalty", "nan"], "argument --length_penalty: must be a finite number, got nan"),
        (["--learning_rate", "inf"], "argument --learning_rate: must be a finite number above 0, got inf"),
        (["--bpe_dropout", "1.5"], "argument --bpe_dropout: must be a probability in [0, 1], got 1.5"),
        (["--max_tokens_per_batch=-1"], "argument --max_tokens_per_batch: must be an integer of 0 or more, got -1"),
        (
            ["--early_stopping_patience", "0", "--metric_for_best_model", "bleu"],
            "argument --early_stopping_patience: must be a positive integer, got 0",
        ),
        (
            ["--per_device_eval_batch_size", "0"],
            "argument --per_device_eval_batch_size: must be a positive integer, got 0",
        ),
    ],
)
def test_a_value_out_of_its_declared_range_is_one_line_naming_the_flag(tmp_path, capsys, flags, message):
    """The ranges declared with the flags (training/arguments.py) are checked by the parser, before any work."""
    argv = ["--output_dir", str(tmp_path / "out"), "--report_to", "none", *flags]
    assert cli_main(argv) == 2
    assert one_line_error(capsys) == f"attn train: error: {message} (see attn train --help)"
    assert not (tmp_path / "out").exists()


def test_every_declared_default_is_in_its_range():
    """The paper's defaults, the embedded task's and the dataclasses' own pass the declared checks."""
    for embedded in (False, True):
        parser = build_parser(embedded_task=embedded)
        parser.check_ranges(parser.parse_known_args(["--output_dir", "x"])[0])  # would exit 2 on a bad default
        declared = [action.dest for action in parser._actions if getattr(action, "range", None)]
        assert {"max_steps", "vocab_size", "bpe_dropout", "generation_num_beams", "label_smoothing_factor"} <= set(
            declared
        )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--per_device_train_batch_size", "64"], r"--per_device_train_batch_size: .* give --max_tokens_per_batch 0"),
        (["--train_sampling_strategy", "sequential"], r"--train_sampling_strategy: these shape batches of sentences"),
        (["--sortish_sampler"], r"--sortish_sampler does nothing in transformers 5"),
        (["--generation_config", "x.json"], r"--generation_config: the decoding of `attn train` is set by"),
        (["--remove_unused_columns", "false"], r"--remove_unused_columns false: the datasets keep each pair's raw"),
        (["--predict_with_generate", "false"], r"--predict_with_generate false: validation and test scores"),
        (
            ["--load_best_model_at_end", "--eval_steps", "10", "--save_steps", "10", "--average_last_n", "3"],
            r"--load_best_model_at_end keeps the best checkpoint .* --average_last_n 3 .* give one of them",
        ),
        (["--early_stopping_patience", "2", "--eval_strategy", "no"], r"--early_stopping_patience watches the valid"),
        (
            ["--early_stopping_patience", "2"],
            r"--early_stopping_patience: name the validation metric .* "
            r"--metric_for_best_model",
        ),
        (["--overwrite_output_dir", "--resume_from_checkpoint", "somewhere"], r"give one of them"),
        # a preset's config with the overrides is built here, before any work: its own checks run
        (
            ["--config_overrides", "d_model=30"],
            r"--config_overrides d_model=30: "
            r"AttnTransformerConfig\.d_model \(30\) must be divisible by num_heads \(4\)$",
        ),
        (
            ["--config_overrides", "dropout=0.1,colour=1"],
            r"--config_overrides: \['colour'\] are not fields of the "
            r"'small' preset's config",
        ),
        (
            ["--preset", "rnn-small", "--model_type", "attn_transformer"],
            r"preset 'rnn-small' is a attn_rnn model but --model_type is attn_transformer",
        ),
        (
            ["--streaming", "--max_steps", "2", "--dataloader_num_workers", "1"],
            r"--streaming packs the token batches of the stream in this process: it needs --dataloader_num_workers 0, "
            r"got 1",
        ),
    ],
)
def test_flags_that_would_be_ignored_are_refused_with_the_reason(tmp_path, capsys, flags, message):
    argv = ["--output_dir", str(tmp_path / "out"), "--report_to", "none", *flags]
    with pytest.raises(ValueError, match=message):
        parse_args(argv)
    assert cli_main(argv) == 2  # on the command line: one line, exit status 2, before any work
    assert one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_sentence_batches_take_trainers_batch_flags(tmp_path):
    recipe, args = parse_args(
        [
            "--output_dir",
            str(tmp_path),
            "--max_tokens_per_batch",
            "0",
            "--per_device_train_batch_size",
            "64",
            "--report_to",
            "none",
        ]
    )
    assert (recipe.max_tokens_per_batch, args.per_device_train_batch_size) == (0, 64)


# --load_best_model_at_end with an evaluation at each save.
BEST_AT_END = shlex.split("--load_best_model_at_end --eval_steps 10 --save_steps 10")


def test_load_best_model_at_end_turns_averaging_off(tmp_path):
    recipe, args = parse_args(["--output_dir", str(tmp_path), *BEST_AT_END, "--report_to", "none"])
    assert args.load_best_model_at_end and args.metric_for_best_model == "loss" and recipe.average_last_n == 1


@pytest.mark.parametrize(
    ("metric", "given", "greater"),
    [
        ("ter", [], False),
        ("eval_ter", [], False),
        ("ter", ["--greater_is_better", "true"], True),
        ("bleu", [], True),
        ("loss", [], False),
    ],
)
def test_the_best_checkpoint_is_the_one_with_the_lowest_ter(tmp_path, metric, given, greater):
    """Trainer guesses the direction of --metric_for_best_model from its name (only "loss" is lower-is-better);
    TER is an error rate: lower is better, unless --greater_is_better says otherwise."""
    flags = [*BEST_AT_END, "--metric_for_best_model", metric, *given]
    _, args = parse_args(["--output_dir", str(tmp_path), *flags, "--report_to", "none"])
    assert args.greater_is_better is greater


def test_run_translation_names_are_aliases_and_both_spellings_work(tmp_path):
    recipe, _ = parse_args(
        [
            "--output_dir",
            str(tmp_path),
            "--dataset_name",
            "wmt14",
            "--dataset-config-name",
            "de-en",
            "--tokenizer_name",
            "some/tokenizer",
            "--report_to",
            "none",
        ]
    )
    assert (recipe.data, recipe.data_config, recipe.tokenizer_name_or_path) == ("wmt14", "de-en", "some/tokenizer")
    assert recipe.vocab_size == 37000  # --data given (as --dataset_name): the embedded task's defaults do not apply
    recipe, _ = parse_args(["--output_dir", str(tmp_path), "--tokenizer-name-or-path", "t", "--report_to", "none"])
    assert recipe.tokenizer_name_or_path == "t" and recipe.vocab_size == 1000  # no --data: the dates task's defaults


def test_flags_file_with_overrides_after_it(tmp_path):
    flags = tmp_path / "recipe.yaml"
    flags.write_text(
        f"data: {tmp_path}\noutput_dir: {tmp_path / 'out'}\nmax_steps: 7\nwarmup_steps: 3\nreport_to: none\n"
    )
    recipe, args = parse_args([str(flags), "--max_steps", "9"])
    assert (recipe.data, args.output_dir, args.max_steps, args.warmup_steps) == (
        str(tmp_path),
        str(tmp_path / "out"),
        9,
        3,
    )
    assert args.learning_rate is None  # computed from d_model and the warmup by main()
    assert recipe.vocab_size == 37000  # the file names --data: the paper's defaults, not the dates task's


def test_help_shows_the_defaults_that_apply():
    text = " ".join(build_parser().format_help().split())
    assert "--warmup_steps WARMUP_STEPS" in text and "(default: 4000)" in text and "(default: 0.98)" in text
    assert "computed from the model's d_model and --warmup_steps" in text and "5e-05" not in text
    assert "--data DATA, --dataset_name DATA" in text
    assert "--vocab_size 1000" in text  # the description: the embedded task's defaults without --data


def run_tiny(output_dir: Path, *flags: str) -> int:
    return main(["--output_dir", str(output_dir), *TINY, *flags])


def test_an_output_dir_with_another_runs_checkpoints_is_refused_overwritten_or_resumed(tmp_path, capsys):
    """The issue's case: a shorter run into a folder with a longer run's checkpoints would average them in."""
    out = tmp_path / "out"
    common = [*QUIET, "--save_steps", "2", "--warmup_steps", "2", "--generation_max_length", "16"]
    assert run_tiny(out, *common, "--max_steps", "4") == 0
    assert [path.name for path in sorted(out.glob("checkpoint-*"))] == ["checkpoint-2", "checkpoint-4"]
    before = (out / "model.safetensors").stat().st_mtime_ns
    with pytest.raises(
        ValueError,
        match=r"holds checkpoints of an earlier run \(checkpoint-2, checkpoint-4\).*"
        r"--resume_from_checkpoint last.*--overwrite_output_dir",
    ):
        run_tiny(out, *common, "--max_steps", "2")
    capsys.readouterr()  # the first run's progress bars
    assert cli_main(["--output_dir", str(out), *TINY, *common, "--max_steps", "2"]) == 2
    assert "holds checkpoints of an earlier run" in one_line_error(capsys)
    with pytest.raises(ValueError, match=r"also holds later checkpoints \(checkpoint-4\)"):
        run_tiny(out, *common, "--max_steps", "6", "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert (out / "model.safetensors").stat().st_mtime_ns == before  # refused before any work
    # Continuing it is allowed; so is starting afresh, which deletes the old checkpoints first.
    assert run_tiny(out, *common, "--max_steps", "6", "--resume_from_checkpoint", "last") == 0
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6
    assert run_tiny(out, *common, "--max_steps", "2", "--overwrite_output_dir", "--average_last_n", "5") == 0
    assert [path.name for path in out.glob("checkpoint-*")] == ["checkpoint-2"]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2


def test_logged_throughput_counts_the_sentences_and_target_tokens_consumed(tmp_path):
    """One epoch consumes each of the 120 training pairs once: Trainer would count per_device_train_batch_size (8)
    sentences per step instead."""
    out = tmp_path / "out"
    assert (
        run_tiny(
            out,
            *QUIET,
            "--max_steps",
            "-1",
            "--num_train_epochs",
            "1",
            "--save_strategy",
            "no",
            "--generation_max_length",
            "16",
        )
        == 0
    )
    tokenizer = AutoTokenizer.from_pretrained(out)
    targets = list(load_parallel_data(None).splits["train"]["target"][:120])
    tokens = sum(len(ids) for ids in tokenizer(text_target=targets)["input_ids"])
    final = [
        entry
        for entry in json.loads((out / "trainer_state.json").read_text())["log_history"]
        if "train_runtime" in entry
    ][-1]
    assert (final["train_samples"], final["train_target_tokens"]) == (120, tokens)
    assert final["train_samples_per_second"] == round(120 / final["train_runtime"], 3)
    assert final["train_target_tokens_per_second"] == round(tokens / final["train_runtime"], 3)
    assert json.loads((out / "train_results.json").read_text())["train_samples"] == 120


def test_load_best_model_at_end_and_early_stopping(tmp_path):
    """--early_stopping_patience 1 with a threshold no change reaches: the second evaluation stops the run (step 4
    of 40); the final model is the best checkpoint's weights, not an average."""
    out = tmp_path / "out"
    assert (
        run_tiny(
            out,
            *shlex.split("--max_steps 40 --eval_steps 2 --save_steps 2 --warmup_steps 2"),
            "--load_best_model_at_end",
            "--metric_for_best_model",
            "loss",
            "--early_stopping_patience",
            "1",
            "--early_stopping_threshold",
            "1e9",
            "--generation_max_length",
            "16",
            "--do_predict",
            "False",
        )
        == 0
    )
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    evaluations = [entry["eval_loss"] for entry in state["log_history"] if "eval_loss" in entry]
    assert len(evaluations) == 2 and state["best_metric"] == min(evaluations)
    best = Path(state["best_model_checkpoint"])
    assert best.name == f"checkpoint-{2 * (1 + evaluations.index(min(evaluations)))}"
    final, expected = load_file(out / "model.safetensors"), load_file(best / "model.safetensors")
    assert final.keys() == expected.keys() and all(torch.equal(final[name], expected[name]) for name in final)


def test_trained_and_pushed_folders_decode_alike_and_the_card_says_how(tmp_path):
    """The paper's decoding (beam 4, length penalty 0.6, source length + 50, early stop) is used everywhere.

    It is the generation config of the trained folder, of its checkpoints, of what `attn push` uploads, and what
    test_results.json / the card state.
    """
    out = tmp_path / "out"
    flags = shlex.split("--max_steps 2 --eval_strategy no --save_steps 2 --average_last_n 1 --max_predict_samples 4")
    assert run_tiny(out, *flags) == 0
    assert attn(["push", "--model", str(out), "--repo-id", "me/dates", "--save-to", str(tmp_path / "hub")]) == 0
    trained, pushed = (GenerationConfig.from_pretrained(folder).to_diff_dict() for folder in (out, tmp_path / "hub"))
    checkpoint = GenerationConfig.from_pretrained(out / "checkpoint-2").to_diff_dict()
    assert trained == pushed == checkpoint
    assert (trained["num_beams"], trained["length_penalty"], trained["early_stopping"]) == (4, 0.6, True)
    assert trained["max_length_over_source"] == 50
    recorded = json.loads((out / "test_results.json").read_text())["generation"]
    assert recorded == {"num_beams": 4, "length_penalty": 0.6, "early_stopping": True, "max_length_over_source": 50}
    card = ModelCard.load(tmp_path / "hub" / "README.md")
    assert "decoding with num_beams 4, length_penalty 0.6, early_stopping True, max_length_over_source 50" in card.text
    # What --hub_strategy every_save / checkpoint uploads at a save: the checkpoint's model with the same decoding
    save_for_hub(out / "checkpoint-2", tmp_path / "checkpoint-hub", "me/dates")
    assert GenerationConfig.from_pretrained(tmp_path / "checkpoint-hub").to_diff_dict() == trained
    assert "2 steps with `attn train`" in ModelCard.load(tmp_path / "checkpoint-hub" / "README.md").text


def test_a_fixed_generation_max_length_is_the_decoding_everywhere(tmp_path):
    out = tmp_path / "out"
    decoding = shlex.split("--generation_max_length 16 --generation_num_beams 2 --length_penalty 1.0")
    assert run_tiny(out, *QUIET, "--max_steps", "1", "--save_strategy", "no", *decoding) == 0
    assert attn(["push", "--model", str(out), "--repo-id", "me/dates", "--save-to", str(tmp_path / "hub")]) == 0
    trained, pushed = (GenerationConfig.from_pretrained(folder).to_diff_dict() for folder in (out, tmp_path / "hub"))
    assert trained == pushed
    assert (trained["num_beams"], trained["length_penalty"], trained["max_length"]) == (2, 1.0, 16)
    assert trained.get("max_length_over_source") is None


def test_hub_strategy_uploads_as_transformers_documents(tmp_path):
    """What one checkpoint save uploads per --hub_strategy (the uploads themselves need the real Hub: see the opt-in
    test below)."""
    checkpoint, model = tmp_path / "checkpoint-20", tmp_path / "for-hub"
    assert hub_uploads("end", checkpoint, model) == []
    assert hub_uploads("every_save", checkpoint, model) == [(model, None)]
    assert hub_uploads("checkpoint", checkpoint, model) == [(model, None), (checkpoint, "last-checkpoint")]
    assert hub_uploads("all_checkpoints", checkpoint, model) == [(model, None), (checkpoint, "checkpoint-20")]
    with pytest.raises(ValueError, match="sometimes is not a valid HubStrategy"):
        hub_uploads("sometimes", checkpoint, model)


class FolderPush(CheckpointPush):
    """`CheckpointPush` with each upload copied into a local folder standing for the repository (the local Hub server
    of tests/hub_server.py serves no uploads; the real upload is the opt-in test below): Trainer's `on_save`, the
    checkpoint it names, `save_for_hub` and `hub_uploads` are the real ones."""

    def __init__(self, repo_id: str, repository: Path):
        super().__init__(repo_id)
        self.repository, self.commits = repository, []

    def upload(self, args, folder, path_in_repo, message):
        shutil.copytree(folder, self.repository / (path_in_repo or ""), dirs_exist_ok=True)
        self.commits.append(message)
        done = Future()
        done.set_result(None)
        return done


# The steps of the recipe (training/train.py's `run`) that build its Trainer, in order.
TO_TRAINER = shlex.split(
    "load_data build_tokenizer build_model tokenize build_trainer_arguments build_training_set collate build_trainer"
)


def test_checkpoint_pushes_run_as_a_callback_at_each_save(tmp_path):
    """--hub_strategy checkpoint through the recipe's own steps and `CheckpointPush` (a `TrainerCallback`, `on_save`):
    each save pushes the checkpoint's model with the files of `attn push` to the root and the checkpoint itself (what
    resuming needs) to last-checkpoint/; after training, both are the last save's."""
    out, repository = tmp_path / "out", tmp_path / "repository"
    recipe, args = parse_args(
        [
            "--output_dir",
            str(out),
            *TINY,
            *QUIET,
            *shlex.split("--max_steps 4 --save_steps 2 --warmup_steps 2 --hub_strategy checkpoint"),
        ]
    )
    training = TrainingRun(recipe, args)
    for step in TO_TRAINER:
        getattr(training, step)()
    trainer = training.trainer
    push = FolderPush("me/dates", repository)
    trainer.add_callback(push)
    trainer.train()
    assert push.commits == [
        "Training in progress, step 2",
        "Training in progress, step 2, checkpoint",
        "Training in progress, step 4",
        "Training in progress, step 4, checkpoint",
    ]
    assert {
        "model.safetensors",
        "README.md",
        "generation_config.json",
        "pipeline_translation.py",
        "tokenizer.json",
        "config.json",
    } <= {path.name for path in repository.iterdir()}
    assert json.loads((repository / "last-checkpoint" / "trainer_state.json").read_text())["global_step"] == 4
    assert (repository / "last-checkpoint" / "optimizer.pt").is_file()
    pushed, saved = load_file(repository / "model.safetensors"), load_file(out / "checkpoint-4" / "model.safetensors")
    assert pushed.keys() == saved.keys() and all(torch.equal(pushed[name], saved[name]) for name in saved)
    assert "4 steps with `attn train`" in ModelCard.load(repository / "README.md").text


@pytest.mark.slow
@pytest.mark.skipif(
    get_token() is None,
    reason="no Hub token configured (HF_TOKEN or `hf auth login`): uploads to the real Hub are opt-in",
)
def test_hub_strategy_checkpoint_pushes_to_the_real_hub(tmp_path):
    from huggingface_hub import HfApi

    api = HfApi()
    repo_id = f"{api.whoami()['name']}/modeling-attn-strategy-{tmp_path.name[-8:]}"
    try:
        assert (
            run_tiny(
                tmp_path / "out",
                *QUIET,
                "--max_steps",
                "2",
                "--save_steps",
                "2",
                "--push_to_hub",
                "--hub_model_id",
                repo_id,
                "--hub_private_repo",
                "true",
                "--hub_strategy",
                "checkpoint",
            )
            == 0
        )
        files = set(api.list_repo_files(repo_id))
        assert {
            "model.safetensors",
            "README.md",
            "generation_config.json",
            "pipeline_translation.py",
            "last-checkpoint/trainer_state.json",
            "last-checkpoint/optimizer.pt",
        } <= files
    finally:
        api.delete_repo(repo_id, missing_ok=True)


def test_validation_during_training_decodes_with_the_saved_generation_config(tmp_path):
    """The scores logged by the validation at the last step equal those of the saved model (the same weights: no
    averaging) translating the validation set with its own generation_config.json (the paper's decoding)."""
    out = tmp_path / "out"
    steps = shlex.split("--max_steps 40 --eval_steps 40 --save_steps 40 --warmup_steps 10")
    assert run_tiny(out, *steps, "--average_last_n", "1", "--do_predict", "False") == 0
    logged = [
        entry for entry in json.loads((out / "trainer_state.json").read_text())["log_history"] if "eval_chrf" in entry
    ][-1]
    model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    assert model.generation_config.max_length_over_source == 50 and model.generation_config.early_stopping is True
    validation = load_parallel_data(None).splits["validation"].select(range(16))
    with torch.no_grad():
        hypotheses, _ = translate_batch(model, AutoTokenizer.from_pretrained(out), list(validation["source"]))
    scores = translation_scores(hypotheses, list(validation["target"]))
    assert logged["eval_chrf"] > 0
    assert (logged["eval_bleu"], logged["eval_chrf"]) == pytest.approx((scores["bleu"], scores["chrf"]), abs=1e-9)


def test_push_to_hub_without_a_hub_stops_before_any_work(tmp_path):
    """As Trainer's init_hf_repo, the repository is created first: offline, the run ends with one line, exit status 2,
    before the data is read."""
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [*ATTN_TRAIN, "--output_dir", str(out), *TINY, *QUIET, "--max_steps", "1"]
    command += shlex.split("--push_to_hub --hub_model_id me/dates --hub_strategy checkpoint")
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.search(
        r"^attn train: error: --push_to_hub: cannot create the Hub repository me/dates \(.*offline",
        result.stderr.strip().splitlines()[-1],
        re.IGNORECASE,
    )
    assert not (out / "tokenizer").exists()


class Warnings(logging.Handler):
    """The messages transformers logs (its loggers do not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_warnings():
    handler = Warnings()
    logging.getLogger("transformers").addHandler(handler)
    yield handler.messages
    logging.getLogger("transformers").removeHandler(handler)


def test_resuming_a_tied_model_warns_of_missing_keys_only_for_untied_ones(transformers_warnings):
    """A checkpoint stores a tied matrix once: its other names are not missing. A key missing for real still is."""
    trainer = object.__new__(TranslationTrainer)  # only `model` is read
    trainer.model = tiny_model()
    tied = ["lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]
    lost = "model.encoder.layers.0.self_attn.q_proj.weight"
    trainer._issue_warnings_after_load(_IncompatibleKeys(missing_keys=tied, unexpected_keys=[]))
    assert transformers_warnings == []
    trainer._issue_warnings_after_load(_IncompatibleKeys(missing_keys=[*tied, lost], unexpected_keys=[]))
    assert transformers_warnings == [f"There were missing keys in the checkpoint model loaded: ['{lost}']."]


def test_a_run_stopped_before_its_first_checkpoint_says_to_rerun_it(tmp_path, capsys, transformers_warnings):
    """Ctrl-C before the first save: the run says that rerunning is the way; so does --resume_from_checkpoint last. A
    run resumed from a checkpoint of the tied model warns of no missing key."""
    out = tmp_path / "out"
    common = [*QUIET, "--save_steps", "2", "--generation_max_length", "16"]
    stopped = "at step 1, before the first checkpoint: no checkpoint was written; rerun the same command"
    with pytest.raises(KeyboardInterrupt, match=stopped), patch.object(TranslationTrainer, "training_step", stop(2)):
        run_tiny(out, *common, "--max_steps", "4")
    with pytest.raises(ValueError, match="no checkpoint was written in .*; rerun the same command without --resume"):
        run_tiny(out, *common, "--max_steps", "4", "--resume_from_checkpoint", "last")
    stopped = r"at step 3; the last checkpoint is .*checkpoint-2: continue with the same command and --resume_from"
    with pytest.raises(KeyboardInterrupt, match=stopped), patch.object(TranslationTrainer, "training_step", stop(4)):
        run_tiny(out, *common, "--max_steps", "4")
    assert run_tiny(out, *common, "--max_steps", "4", "--resume_from_checkpoint", "last") == 0
    assert not [message for message in transformers_warnings if "missing keys" in message]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4


def stop(step: int):
    """A training step that raises KeyboardInterrupt (as Ctrl-C does) at the `step`-th call."""
    calls = []
    original = TranslationTrainer.training_step

    def training_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    return training_step
