"""Killed training (issue 8, check 2): SIGKILL `python -m modeling_attn.training` at random moments, during
checkpoint saves among them, resume with `--resume_from_checkpoint last`, and end with the same weights as a run
never killed.

After every kill each `checkpoint-*` folder on disk must be complete and loadable (modeling_attn.training.trainer
writes a checkpoint into `.checkpoint-staging/` and renames it into place). The final weights must equal the
uninterrupted run's bitwise: on one CPU thread, with the same seed, a resumed run restores the model, optimizer,
scheduler, RNG states and the position in the token-batch order exactly, so there is no tolerance to allow for.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from modeling_attn.training.trainer import STAGING_DIR
from runs import ATTN_TRAIN, NO_EVAL, tiny_on
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

import modeling_attn  # noqa: F401  (registers the model types)

REPO = Path(__file__).resolve().parents[1]
STEPS = 60
# A tiny model on 120 pairs of the embedded task, 8 token batches per epoch: 60 steps cross 7 epoch boundaries,
# a checkpoint every 5 steps, at most 2 kept (so rotation deletes folders while the job may be killed).
ARGS = [*tiny_on(120), *NO_EVAL, "--max_steps", str(STEPS)]
ARGS += shlex.split("--save_steps 5 --save_total_limit 2 --logging_steps 1 --seed 7")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
CHECKPOINT_FILES = (
    "model.safetensors",
    "config.json",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pth",
    "trainer_state.json",
    "tokenizer.json",
)
# How each attempt is killed: when a save starts (a checkpoint appears in the staging folder), after a random number
# of optimizer steps plus a random delay, right after a new checkpoint appears (the rename, then rotation), and last
# when the final model is being written after training (the resumed run then trains no step and writes it again).
KILLS = ["during_save", "random_step", "after_checkpoint", "during_save", "random_step", "during_save", "at_end"]


def start(output_dir: Path, resume: bool, log: Path) -> subprocess.Popen:
    command = [*ATTN_TRAIN, "--output_dir", str(output_dir), *ARGS]
    if resume:
        command += ["--resume_from_checkpoint", "last"]
    with open(log, "w") as stderr:  # a file, not a pipe: the child must never block on a full pipe
        return subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=stderr, text=True)


def checkpoints(output_dir: Path) -> list[Path]:
    return sorted(output_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))


def staged(output_dir: Path) -> list[Path]:
    root = output_dir / STAGING_DIR
    return [path for path in root.iterdir() if path.name.startswith("checkpoint-")] if root.is_dir() else []


def assert_complete(checkpoint: Path) -> None:
    """Every file a resume needs is there and loads; the state is the folder's step."""
    missing = [name for name in CHECKPOINT_FILES if not (checkpoint / name).is_file()]
    assert not missing, f"{checkpoint} is half-written: {missing} missing"
    step = int(checkpoint.name.split("-")[1])
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    assert load_file(checkpoint / "model.safetensors")
    assert torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    AutoModelForSeq2SeqLM.from_pretrained(checkpoint)


def kill_when(process: subprocess.Popen, output_dir: Path, how: str, rng: random.Random) -> bool:
    """SIGKILL the process at the moment `how` names; False if it finished first."""
    steps = []  # one entry per optimizer step: Trainer prints a {'loss': ...} line each step (logging_steps 1)
    reader = threading.Thread(target=lambda: steps.extend(line for line in process.stdout if "'loss'" in line))
    reader.start()
    seen = {path.name for path in checkpoints(output_dir)}
    done = max([int(name.split("-")[1]) for name in seen], default=0)
    # at least 5 steps before the end, so that the 0-50 ms delay cannot reach it (a step takes about 30 ms here)
    target_steps, delay, hit_at = rng.randint(1, max(1, STEPS - done - 5)), rng.uniform(0, 0.05), None
    while process.poll() is None:
        if how == "during_save":
            hit = bool(staged(output_dir))
        elif how == "after_checkpoint":
            hit = bool({path.name for path in checkpoints(output_dir)} - seen)
        elif how == "at_end":
            hit = (output_dir / "model.safetensors").exists()
        else:
            hit = len(steps) >= target_steps
            if hit and hit_at is None:
                hit_at = time.monotonic()
            hit = hit and time.monotonic() - hit_at >= delay
        if hit:
            process.send_signal(signal.SIGKILL)
            process.wait()
            reader.join()
            return True
        time.sleep(0.001)
    reader.join()
    return False


def losses(output_dir: Path) -> list[tuple[int, float]]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]


@pytest.mark.slow
def test_killed_training_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    rng = random.Random(8)
    reference = tmp_path / "reference"
    began = time.monotonic()
    process = start(reference, resume=False, log=tmp_path / "reference.log")
    process.communicate()
    assert process.returncode == 0, (tmp_path / "reference.log").read_text()[-4000:]
    run_seconds = time.monotonic() - began

    output_dir = tmp_path / "killed"
    kills, during_save = [], 0
    for attempt, how in enumerate(KILLS):
        log = tmp_path / f"attempt-{attempt}.log"
        process = start(output_dir, resume=bool(checkpoints(output_dir)), log=log)
        assert kill_when(process, output_dir, how, rng), f"attempt {attempt} ({how}) ended before its kill: {log}"
        kills.append(how)
        during_save += bool(staged(output_dir))  # the kill left a checkpoint mid-write in the staging folder
        for checkpoint in checkpoints(output_dir):
            assert_complete(checkpoint)
    process = start(output_dir, resume=True, log=tmp_path / "last.log")
    process.communicate()
    assert process.returncode == 0, (tmp_path / "last.log").read_text()[-4000:]
    print(
        f"survived {len(kills)} kills {kills} ({during_save} during a checkpoint save); uninterrupted run "
        f"{run_seconds:.1f} s"
    )
    assert during_save >= 1

    assert not (output_dir / STAGING_DIR).exists()
    for checkpoint in checkpoints(output_dir):
        assert_complete(checkpoint)
    assert [path.name for path in checkpoints(output_dir)] == ["checkpoint-55", "checkpoint-60"]
    expected, got = load_file(reference / "model.safetensors"), load_file(output_dir / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    assert losses(output_dir) == losses(reference)
