"""Training in several processes on CPU (gloo, 2 processes), through the launchers the README documents.

- DDP: `torchrun --nproc_per_node 2 -m modeling_attn.training` equals
  `python -m modeling_attn.training --gradient_accumulation_steps 2` (the same global batch: Accelerate deals token
  batch i to process i % 2, and one process accumulates batches 2k, 2k+1).
- FSDP2: `accelerate launch --config_file configuration/accelerate-fsdp.yaml --num_processes 2 --mixed_precision no`
  (the shipped file; `--mixed_precision no` overrides its bf16, the one field a CPU run changes) trains, matches the
  DDP losses, saves a full model that `from_pretrained` loads, and resumes from a checkpoint.
- `accelerate launch --cpu --num_processes 2` is refused with the command that works.
DeepSpeed is not tested: it is not verified on CPU here (README).

Dropout is off (`--config_overrides dropout=0`): each process draws its own dropout masks, so with dropout two
processes cannot reproduce one process accumulating two batches. Every run is a real process tree and a real Trainer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from runs import COMPARABLE, QUIET, free_port, tiny_on, torchrun
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

import modeling_attn  # noqa: F401  (registers the model types with the Auto classes)

REPO = Path(__file__).resolve().parents[1]
STEPS = 20
# The tiny preset on 400 pairs of the embedded task, token batches of 200: about a second per step on 2 cores.
COMMON = [*tiny_on(400), *QUIET, *COMPARABLE, "--max_steps", str(STEPS)]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
# DDP against one process: the README's requirement. FSDP against DDP: the same, see test_fsdp_matches_ddp.
LOSS_TOLERANCE = 1e-5


def _accelerate_fsdp() -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        "configuration/accelerate-fsdp.yaml",
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "modeling_attn.training",
    ]


def _run(launcher: list[str], output_dir: Path, *flags: str) -> Path:
    start = time.time()
    command = [*launcher, "--output_dir", str(output_dir), *COMMON, *flags]
    result = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"{output_dir.name}: {time.time() - start:.0f} s")
    return output_dir


def _losses(output_dir: Path) -> list[float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


def _largest_difference(first: list[float], second: list[float]) -> float:
    assert len(first) == len(second) == STEPS
    return max(abs(a - b) for a, b in zip(first, second, strict=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The four training runs the tests compare (about 3 minutes on 2 cores)."""
    root = tmp_path_factory.mktemp("distributed")
    one = ["--gradient_accumulation_steps", "2", "--save_strategy", "no"]
    resume = ["--save_steps", "10", "--resume_from_checkpoint", str(root / "fsdp" / "checkpoint-10")]
    return {
        "one": _run([sys.executable, "-m", "modeling_attn.training"], root / "one", *one),
        "ddp": _run(torchrun(), root / "ddp", "--save_strategy", "no"),
        "fsdp": _run(_accelerate_fsdp(), root / "fsdp", "--save_steps", "10"),
        "fsdp_resumed": _run(_accelerate_fsdp(), root / "fsdp-resumed", *resume),
    }


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process_accumulating_two_batches(runs):
    ddp, one = _losses(runs["ddp"]), _losses(runs["one"])
    difference = _largest_difference(ddp, one)
    print(f"DDP vs 1 process: largest loss difference {difference:.3g} over {STEPS} steps")
    assert difference <= LOSS_TOLERANCE
    assert ddp[-1] < ddp[0]  # it trained
    state = json.loads((runs["ddp"] / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    expected, got = load_file(runs["one"] / "model.safetensors"), load_file(runs["ddp"] / "model.safetensors")
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_fsdp_matches_ddp(runs):
    """FSDP2 reduce-scatters the gradients (each rank keeps its shard) where DDP all-reduces them, and takes the
    clipping norm from the shards: the same arithmetic in another fp32 summation order. Measured on 2 cores: at most
    9.5e-7 (two float32 ulps at a loss of 5) over 20 steps; 1e-5 (the DDP requirement) leaves room for another CPU's
    rounding."""
    fsdp, ddp = _losses(runs["fsdp"]), _losses(runs["ddp"])
    difference = _largest_difference(fsdp, ddp)
    print(f"FSDP vs DDP: largest loss difference {difference:.3g} over {STEPS} steps")
    assert difference <= LOSS_TOLERANCE


@pytest.mark.slow
def test_fsdp_saves_a_full_model_that_from_pretrained_loads(runs):
    output_dir = runs["fsdp"]
    model, info = AutoModelForSeq2SeqLM.from_pretrained(output_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    # The run's final weights, as accelerate's own FSDP checkpoint of the last step holds them (another save path).
    final = torch.load(output_dir / f"checkpoint-{STEPS}" / "pytorch_model_fsdp.bin", weights_only=True)
    loaded = model.state_dict()
    assert set(final) <= set(loaded)
    for name, tensor in final.items():
        assert torch.equal(loaded[name], tensor), name
    ddp = load_file(runs["ddp"] / "model.safetensors")
    for name, tensor in ddp.items():  # the same training: Adam turns the tiny loss differences into < 1e-3
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=1e-3)
    # The model code travels with the weights, not the class FSDP2 derives from it.
    config = json.loads((output_dir / "config.json").read_text())
    own_class = "modeling_transformer.AttnTransformerForConditionalGeneration"
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == own_class
    assert (output_dir / "modeling_transformer.py").is_file()
    assert not list(output_dir.glob("_fsdp*.py"))


@pytest.mark.slow
def test_fsdp_resumes_from_a_checkpoint(runs):
    """On CPU the resumed run repeats the uninterrupted one exactly: the same batches, RNG states and arithmetic."""
    resumed, uninterrupted = _losses(runs["fsdp_resumed"]), _losses(runs["fsdp"])
    assert resumed == uninterrupted  # steps 1-10 come from checkpoint-10's trainer_state, 11-20 are trained again
    expected = load_file(runs["fsdp"] / "model.safetensors")
    got = load_file(runs["fsdp_resumed"] / "model.safetensors")
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


@pytest.mark.slow
def test_accelerate_launch_cpu_with_several_processes_is_refused(tmp_path):
    """accelerate's `--cpu` launcher starts one process for `--num_processes 2`: refused, naming what works."""
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--cpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "modeling_attn.training",
        "--output_dir",
        str(tmp_path / "out"),
        *COMMON,
    ]
    result = subprocess.run(launch, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "start N CPU processes with `torchrun --nproc_per_node N -m modeling_attn.training ...`" in result.stderr
    assert not (tmp_path / "out" / "trainer_state.json").exists()
