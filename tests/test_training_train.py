"""Tests of training/train.py (`attn train`): the paper's defaults, end-to-end runs, resume, fine-tuning,
multi-process data parallelism, the README commands (issue 10, checks 1, 2, 3, 5, 6, 7).

Cheap versions run by default on the `tiny` preset; the README main command and longer multi-process runs are
marked slow.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from modeling_attn.training.arguments import paper_learning_rate, paper_warmup_steps
from modeling_attn.training.synthetic import generate_pairs
from runs import ATTN_TRAIN, COMPARABLE, QUIET, SILENT, TINY_TASK, torchrun
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer

import modeling_attn  # noqa: F401
from modeling_attn.api.corpus import DataError
from modeling_attn.api.presets import load_preset
from modeling_attn.cli.main import main as attn
from modeling_attn.cli.train import main as cli_main
from modeling_attn.cli.train import parse_args
from modeling_attn.cli.train import train as main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# A tiny model on a slice of the embedded task: seconds per run.
TINY = [*TINY_TASK, "--generation_max_length", "16"]

# The README's main command and its documented score (section "Set up and run", kept in step with README.md).
# (Check 7, the README's Python with a plain Seq2SeqTrainer, runs in tests/test_readme.py.)
MAIN_COMMAND = ["attn", "train", "--output_dir", "outputs/dates"]
DOCUMENTED_TEST_BLEU = 95.0  # measured: 99.04-100.00 in three runs on a 2-core CPU, 187 s alone (README)


def paper_schedule(step: int, d_model: int, warmup_steps: int) -> float:
    """Eq. 3 of the paper, written out: lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (0 at step 0)."""
    if step == 0:
        return 0.0
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def train(tmp_path: Path, *args: str) -> Path:
    output_dir = tmp_path / "out"
    assert main(["--output_dir", str(output_dir), *TINY, *args]) == 0
    return output_dir


def trainer_losses(output_dir: Path) -> list[float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


@pytest.fixture(scope="module")
def trained_tiny(tmp_path_factory) -> Path:
    """A tiny model trained for 30 steps on the embedded task, with validation, averaging and the test run."""
    tmp_path = tmp_path_factory.mktemp("trained")
    return train(
        tmp_path,
        "--max_steps",
        "30",
        "--eval_steps",
        "15",
        "--save_steps",
        "10",
        "--logging_steps",
        "5",
        "--average_last_n",
        "2",
        "--warmup_steps",
        "10",
    )


def test_paper_defaults_and_learning_rate_schedule(tmp_path):
    """Check 5: Adam(0.9, 0.98, 1e-9) and lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Eq. 3)."""
    recipe, args = parse_args(["--output_dir", str(tmp_path), "--data", "unused", "--report_to", "none"])
    assert args.eval_strategy == "steps" and args.predict_with_generate
    args.eval_strategy = "no"  # no validation set in this test
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon, args.weight_decay) == (0.9, 0.98, 1e-9, 0.0)
    assert (args.label_smoothing_factor, args.generation_num_beams, recipe.length_penalty) == (0.1, 4, 0.6)
    assert (args.warmup_steps, args.lr_scheduler_type, recipe.average_last_n) == (4000, "inverse_sqrt", 5)
    d_model = 512
    args.learning_rate = paper_learning_rate(d_model, 4000)  # what main() does when --learning_rate is not given
    model = AutoModelForSeq2SeqLM.from_config(load_preset("tiny"))
    trainer = Seq2SeqTrainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=200_000)
    group = trainer.optimizer.param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.98), 1e-9, 0.0)
    # The rate Trainer logs at step n is the scheduler's after n steps.
    for step in range(1, 6):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(paper_schedule(step, d_model, 4000), rel=1e-12)
    for step in [10, 100, 1000, 3999, 4000, 4001, 10_000, 100_000]:
        rate = args.learning_rate * trainer.lr_scheduler.lr_lambdas[0](step)
        assert rate == pytest.approx(paper_schedule(step, d_model, 4000), rel=1e-12), step
    assert paper_schedule(4000, d_model, 4000) == pytest.approx(d_model**-0.5 * 4000**-0.5)


def test_a_warmup_ratio_sets_the_paper_rate_from_trainers_warmup_steps(tmp_path):
    """--warmup_steps below 1 is Trainer's ratio of the training steps; the paper's peak rate uses the same count."""
    common = ["--output_dir", str(tmp_path), "--data", "unused", "--report_to", "none", "--eval_strategy", "no"]
    _, args = parse_args([*common, "--warmup_steps", "0.1", "--max_steps", "4000"])
    assert paper_warmup_steps(args) == args.get_warmup_steps(4000) == 400
    _, args = parse_args([*common, "--warmup_steps", "400", "--max_steps", "4000"])
    assert paper_warmup_steps(args) == 400
    with pytest.raises(ValueError, match=r"--warmup_steps 0\.1 is a ratio .* give --max_steps"):
        parse_args([*common, "--warmup_steps", "0.1"])
    _, args = parse_args([*common, "--warmup_steps", "0.1", "--learning_rate", "0.001"])  # no rate to compute
    assert args.learning_rate == 0.001


def test_bad_data_stops_before_training_naming_file_and_line(tmp_path, capsys):
    """Check 6."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en").write_text("a cat\na dog\n")
    (data / "train.de").write_bytes(b"eine Katze\nein Hund\xff\n")
    (data / "valid.en").write_text("a cow\n")
    (data / "valid.de").write_text("eine Kuh\n")
    with pytest.raises(DataError, match=r"train\.de:2: not valid UTF-8"):
        main(["--data", str(data), "--output_dir", str(tmp_path / "out"), *TINY])
    assert cli_main(["--data", str(data), "--output_dir", str(tmp_path / "out"), *TINY]) == 2
    assert re.search(r"attn train: error: .*train\.de:2: not valid UTF-8", capsys.readouterr().err)
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_end_to_end_outputs(trained_tiny):
    """A full run writes the model, its tokenizer, the generation settings and the test results."""
    results = json.loads((trained_tiny / "test_results.json").read_text())
    assert {"test_bleu", "test_chrf", "test_exact_match", "samples"} <= set(results)
    assert results["test_bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    if importlib.util.find_spec("matplotlib") is not None:  # the [plot] extra: CI installs it
        assert (trained_tiny / "attention.png").stat().st_size > 0
    generation = json.loads((trained_tiny / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (4, 0.6)
    tokenizer = AutoTokenizer.from_pretrained(trained_tiny)
    model = AutoModelForSeq2SeqLM.from_pretrained(trained_tiny)
    assert model.config.vocab_size == len(tokenizer) and model.config.pad_token_id == tokenizer.pad_token_id
    history = json.loads((trained_tiny / "trainer_state.json").read_text())["log_history"]
    assert any("eval_bleu" in entry for entry in history) and any("loss" in entry for entry in history)
    # The saved model is the average of the last 2 checkpoints (steps 20 and 30).
    averaged = load_file(trained_tiny / "model.safetensors")
    last = [load_file(trained_tiny / f"checkpoint-{step}" / "model.safetensors") for step in (20, 30)]
    name = "model.shared.weight"
    torch.testing.assert_close(averaged[name], (last[0][name].double() + last[1][name].double()).div(2).float())


def test_model_card_of_a_trained_model_reports_its_test_results(trained_tiny, tmp_path):
    """`attn push` of a training folder: the card's model-index holds the numbers of its test_results.json."""
    results = json.loads((trained_tiny / "test_results.json").read_text())
    assert (results["source_lang"], results["target_lang"], results["split"]) == ("date", "iso", "test")
    assert (
        attn(["push", "--model", str(trained_tiny), "--repo-id", "me/dates", "--save-to", str(tmp_path / "hub")]) == 0
    )
    card = ModelCard.load(tmp_path / "hub" / "README.md")
    expected = {"bleu": round(results["test_bleu"], 2), "chrf": round(results["test_chrf"], 2)}
    assert {result.metric_type: result.metric_value for result in card.data.eval_results} == expected
    # The dates task is no language pair and no Hub dataset: the card's text describes it, its metadata does not.
    assert card.data.language is None and card.data.datasets is None and card.data.base_model is None
    assert "the embedded dates task of modeling-attn" in card.text and "attn_transformer" in card.data.tags
    assert "30 steps with `attn train`" in card.text
    picture = (tmp_path / "hub" / "attention.png").is_file()  # made by the run when matplotlib is installed
    assert ("![attention of one test translation](attention.png)" in card.text) == picture


def test_bad_flags_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match=r"--config_overrides: \['d_modle'\] are not fields of the 'tiny' preset"):
        train(tmp_path, "--config_overrides", "d_modle=32", *QUIET, "--max_steps", "1")
    missing = tmp_path / "never-trained"
    with pytest.raises(ValueError, match=f"--resume_from_checkpoint: --output_dir {missing} does not exist"):
        parse_args(["--output_dir", str(missing), "--resume_from_checkpoint", "last"])


def test_resume_gives_the_same_weights(tmp_path):
    """Check 3: stopped at step 6 and resumed to step 14 == 14 steps in one go (dropout on, CPU, same seed).

    The embedded slice has 8 token batches per epoch here, so the runs cross an epoch boundary after the resume.
    """
    common = [*QUIET, "--save_strategy", "steps", "--save_steps", "6", "--logging_steps", "1", "--seed", "7"]
    straight = train(tmp_path / "straight", *common, "--max_steps", "14")
    stopped = train(tmp_path / "resumed", *common, "--max_steps", "6")
    resumed = train(
        tmp_path / "resumed", *common, "--max_steps", "14", "--resume_from_checkpoint", str(stopped / "checkpoint-6")
    )
    assert json.loads((straight / "trainer_state.json").read_text())["epoch"] > 1
    expected, got = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    assert trainer_losses(straight)[6:] == trainer_losses(resumed)[-8:]


def _loss_on(model, tokenizer, pairs: list[tuple[str, str]]) -> float:
    batch = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs])
    features = [{k: batch[k][i] for k in ("input_ids", "attention_mask", "labels")} for i in range(len(pairs))]
    inputs = DataCollatorForSeq2Seq(tokenizer, model=model)(features)
    model.eval()
    with torch.no_grad():
        return model(**inputs).loss.item()


def test_fine_tuning_lowers_the_loss_on_new_data(trained_tiny, tmp_path):
    """Check 7: `--model_name_or_path` starts from saved weights, keeps their tokenizer, and learns the new data."""
    pairs = [(target, source) for source, target in generate_pairs(150, seed=99)]  # new task: ISO -> human dates
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs[:120]))
    (data / "valid.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs[120:]))
    tokenizer = AutoTokenizer.from_pretrained(trained_tiny)
    before = _loss_on(AutoModelForSeq2SeqLM.from_pretrained(trained_tiny), tokenizer, pairs[:120])
    finetuned = tmp_path / "finetuned"
    args = [
        "--model_name_or_path",
        str(trained_tiny),
        "--data",
        str(data),
        "--output_dir",
        str(finetuned),
        "--max_steps",
        "30",
        "--learning_rate",
        "1e-2",
        "--warmup_steps",
        "5",
        "--max_tokens_per_batch",
        "400",
        *SILENT,
        *QUIET,
    ]
    assert main(args) == 0
    after = _loss_on(AutoModelForSeq2SeqLM.from_pretrained(finetuned), tokenizer, pairs[:120])
    assert after < 0.9 * before, (before, after)
    assert (finetuned / "tokenizer.json").read_text() == (trained_tiny / "tokenizer.json").read_text()
    assert json.loads((finetuned / "origin.json").read_text())["source"] == str(trained_tiny.resolve())  # card's


def _two_processes_vs_one(tmp_path: Path, steps: int, extra: list[str]) -> tuple[list[float], list[float], Path, Path]:
    """Train with `torchrun --nproc_per_node 2` (gloo) and in one process accumulating 2 batches.

    BatchSamplerShard deals token batch i to process i % 2, so a 2-process step and a 1-process step with
    --gradient_accumulation_steps 2 see the same two batches; Trainer normalises the loss by the token count of the
    whole step in both cases. Dropout is off so that the only difference left is floating-point summation order.
    """
    common = [*TINY, *QUIET, *COMPARABLE, "--max_steps", str(steps), "--save_strategy", "no", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    two, one = tmp_path / "two", tmp_path / "one"
    launch = [*torchrun(), "--output_dir", str(two), *common]
    result = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    single = [*ATTN_TRAIN, "--output_dir", str(one), "--gradient_accumulation_steps", "2", *common]
    result = subprocess.run(single, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    return trainer_losses(two), trainer_losses(one), two, one


def _assert_same_training(two_losses, one_losses, two: Path, one: Path, steps: int) -> None:
    assert len(two_losses) == len(one_losses) == steps
    # Same batches, same normalisation, no dropout: only fp32 summation order differs (gloo's all-reduce, the
    # loss gather), about 1e-7 relative per operation; over a few dozen Adam steps that stays far below 1e-4.
    assert two_losses == pytest.approx(one_losses, rel=1e-4)
    assert two_losses[-1] < two_losses[0]
    expected, got = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-3, atol=1e-5)


def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    """Check 2, cheap version: 4 steps of the tiny model."""
    two_losses, one_losses, two, one = _two_processes_vs_one(tmp_path, 4, [])
    _assert_same_training(two_losses, one_losses, two, one, 4)


@pytest.mark.slow
def test_two_processes_match_one_process_small_model(tmp_path):
    """Check 2: 30 steps of the `small` preset."""
    two_losses, one_losses, two, one = _two_processes_vs_one(
        tmp_path, 30, ["--preset", "small", "--max_train_samples", "2000", "--max_tokens_per_batch", "600"]
    )
    _assert_same_training(two_losses, one_losses, two, one, 30)


@pytest.mark.slow
def test_readme_main_command_reaches_its_documented_score(tmp_path):
    """Check 1: the README's main command, as written, on this machine; its step budget is the default max_steps."""
    assert " ".join(MAIN_COMMAND) in README.read_text(), "the README's main command changed: update MAIN_COMMAND"
    start = time.time()
    result = subprocess.run(
        MAIN_COMMAND,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads((tmp_path / "outputs" / "dates" / "test_results.json").read_text())
    print(
        f"README main command: {time.time() - start:.0f} s, test BLEU {results['test_bleu']:.2f}, "
        f"exact match {results['test_exact_match']:.1f}%"
    )
    assert "Sample test translations:" in result.stdout and "Test BLEU" in result.stdout
    assert results["test_bleu"] >= DOCUMENTED_TEST_BLEU
    assert (tmp_path / "outputs" / "dates" / "attention.png").is_file()  # CI installs the [plot] extra


def test_rnn_model_type_trains(tmp_path):
    """The same recipe drives the classic RNN model (`--model_type attn_rnn`, default preset rnn-small)."""
    output_dir = train(tmp_path, *QUIET, "--model_type", "attn_rnn", "--preset", "rnn-tiny", "--max_steps", "4")
    assert AutoModelForSeq2SeqLM.from_pretrained(output_dir).config.model_type == "attn_rnn"
    with pytest.raises(ValueError, match="preset 'tiny' is a attn_transformer model but --model_type is attn_rnn"):
        main(["--output_dir", str(tmp_path / "x"), *TINY, *QUIET, "--model_type", "attn_rnn"])


@pytest.mark.slow
def test_a_second_run_into_the_same_output_dir_is_refused_with_the_first_ones_pid(tmp_path):
    """Issue 34: two `attn train` runs started into one --output_dir; the second stops in one line, naming the first
    one's pid, and the first runs on (its folder untouched by the second)."""
    out = tmp_path / "out"
    long_run = [
        *ATTN_TRAIN,
        "--output_dir",
        str(out),
        *TINY,
        *QUIET,
        *shlex.split("--max_steps 100000 --save_steps 100000"),
    ]
    first = subprocess.Popen(long_run, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (out / ".attn.lock").exists():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "modeling_attn.cli.main",
                "train",
                "--output_dir",
                str(out),
                *TINY,
                *QUIET,
                "--max_steps",
                "2",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert second.returncode == 2, second.stderr[-2000:]
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert (
            lines[-1] == f"attn train: error: {out} is in use by process {first.pid} (attn train); "
            "wait for it to end, or write somewhere else"
        )
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.wait()


def test_the_saved_config_names_the_language_pair(trained_tiny):
    """`attn translate --document` splits sentences by the rules of the model's `config.source_lang`."""
    config = json.loads((trained_tiny / "config.json").read_text())
    assert (config["source_lang"], config["target_lang"]) == ("date", "iso")
