"""Tests of the recipe's speed settings and compute accounting (issue 41): the CUDA fast path `validate` chooses
(`resolve_cuda_fast_path`, with the GPU's capability mocked), Trainer's `total_flos` by the project's formula
(`modeling_attn.flops`, against the formula written out here sentence by sentence), and the MFU line's peaks table
(`training/throughput.py`)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from modeling_attn.training import throughput, validate
from modeling_attn.training.train import run
from modeling_attn.training.trainer import TranslationTrainer
from transformers import AutoModelForSeq2SeqLM, Seq2SeqTrainingArguments
from transformers.training_args import OptimizerNames

from modeling_attn.api.presets import load_preset
from modeling_attn.cli.train import parse_args

TINY = ["--preset", "tiny", "--vocab_size", "200", "--max_train_samples", "40", "--max_tokens_per_batch", "200"]
QUIET = ["--report_to", "none", "--disable_tqdm", "True", "--dataloader_pin_memory", "False"]


def mock_gpu(monkeypatch, native_bf16: bool = True) -> None:
    """A CUDA GPU as `validate` asks about it (its own `torch`; Trainer's device set-up stays on the CPU): present,
    with or without native bf16 (Ampere or newer)."""
    cuda = SimpleNamespace(is_available=lambda: True, is_bf16_supported=lambda including_emulation=True: native_bf16)
    monkeypatch.setattr(validate, "torch", SimpleNamespace(cuda=cuda))


def flags(tmp_path, *extra: str) -> Seq2SeqTrainingArguments:
    return parse_args([*TINY, *QUIET, "--output_dir", str(tmp_path / "run"), *extra])[1]


def fast_path(args: Seq2SeqTrainingArguments) -> tuple:
    return args.bf16, args.mixed_precision, args.tf32, OptimizerNames(args.optim)


def test_on_a_gpu_with_bf16_the_fast_path_is_the_default(tmp_path, monkeypatch):
    assert fast_path(flags(tmp_path)) == (False, "no", None, OptimizerNames.ADAMW_TORCH_FUSED)  # the CPU: fp32
    mock_gpu(monkeypatch)
    assert fast_path(flags(tmp_path)) == (True, "bf16", True, OptimizerNames.ADAMW_TORCH_FUSED)


def test_an_older_gpu_trains_in_float32(tmp_path, monkeypatch):
    mock_gpu(monkeypatch, native_bf16=False)
    assert fast_path(flags(tmp_path)) == (False, "no", None, OptimizerNames.ADAMW_TORCH_FUSED)


def test_trainers_own_flags_win_and_one_flag_turns_the_fast_path_off(tmp_path, monkeypatch):
    mock_gpu(monkeypatch)
    given = flags(tmp_path, "--bf16", "false", "--tf32", "false", "--optim", "adamw_torch")
    assert fast_path(given) == (False, "no", False, OptimizerNames.ADAMW_TORCH)
    fused = OptimizerNames.ADAMW_TORCH_FUSED  # the default on every device
    assert fast_path(flags(tmp_path, "--cuda_fast_path", "false")) == (False, "no", None, fused)
    assert fast_path(flags(tmp_path, "--use_cpu", "true")) == (False, "no", None, fused)


@pytest.fixture
def fp16_allowed(monkeypatch):
    """Trainer refuses --fp16 on a CPU when the flags are built, before `validate`: let it through for the check."""
    original = Seq2SeqTrainingArguments.__post_init__

    def post_init(self):
        fp16, self.fp16 = self.fp16, False
        original(self)
        self.fp16 = fp16

    monkeypatch.setattr(Seq2SeqTrainingArguments, "__post_init__", post_init)


def test_given_fp16_keeps_fp16(tmp_path, monkeypatch, fp16_allowed):
    mock_gpu(monkeypatch)
    args = flags(tmp_path, "--fp16", "true")
    assert (args.fp16, args.bf16, args.tf32, OptimizerNames(args.optim)) == (
        True,
        False,
        True,
        OptimizerNames.ADAMW_TORCH_FUSED,
    )


def test_the_run_says_which_settings_it_trained_with(tmp_path, capsys):
    """... and --threads sets torch's threads for the run (recorded as cpu_threads), the process's own after it."""
    small = ["--max_steps", "2", "--eval_strategy", "no", "--max_predict_samples", "4", "--generation_max_length", "8"]
    recipe, args = parse_args([*TINY, *QUIET, "--output_dir", str(tmp_path / "run"), *small, "--threads", "1"])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run(recipe, args)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    expected = {
        "device": "cpu",
        "mixed_precision": "no",
        "optim": "adamw_torch_fused",
        "tf32": False,
        "torch_compile": False,
        "cpu_threads": 1,
    }
    results = json.loads((tmp_path / "run" / "all_results.json").read_text())
    assert {key: results[f"train_{key}"] for key in expected} == expected
    assert json.loads((tmp_path / "run" / "test_results.json").read_text())["training_settings"] == expected
    printed = capsys.readouterr().out  # Trainer's metrics table: the flags as words, not as 0/1
    assert re.search(r"train_tf32 += +false$", printed, re.MULTILINE), printed
    assert re.search(r"train_torch_compile += +false$", printed, re.MULTILINE), printed


@pytest.mark.parametrize(
    ("device", "compiled", "warned"), [("cpu", True, True), ("cpu", False, False), ("cuda", True, False)]
)
def test_a_compiled_cpu_run_is_warned_that_eager_is_faster(device, compiled, warned):
    warning = throughput.cpu_compile_warning({"device": device, "torch_compile": compiled})
    assert (warning is not None) == warned
    if warned:
        assert warning.startswith("--torch_compile on the CPU: measured slower than eager")


def formula(config, source_lengths: list[int], target_lengths: list[int]) -> float:
    """bench/gpu.py's FLOP_FORMULA for attn_transformer, written out sentence by sentence: 3 x forward."""
    width, inner, vocab = config.d_model, config.d_ff, config.decoder_vocab_size
    total = 0
    for s, t in zip(source_lengths, target_lengths, strict=True):
        encoder = 2 * s * (4 * width**2 + 2 * width * inner) + 4 * s * s * width
        decoder = 2 * t * (4 * width**2 + 2 * width * inner) + 2 * (2 * t * width**2 + 2 * s * width**2)
        decoder += 4 * t * (t + s) * width
        total += config.encoder_layers * encoder + config.decoder_layers * decoder + 2 * t * width * vocab
    return 3 * total


class OneBatch(torch.utils.data.Dataset):
    """Three sentence pairs of known lengths (source 5, 3, 1; target 2, 4, 3 with the end token), padded."""

    rows = [([5, 6, 7, 8, 9], [5, 2]), ([5, 6, 7], [6, 7, 8, 2]), ([9], [9, 9, 2])]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        source, target = self.rows[index]
        return {"input_ids": source, "attention_mask": [1] * len(source), "labels": target}


def test_total_flos_is_the_formula_on_real_tokens(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(load_preset("tiny", vocab_size=20, pad_token_id=0))

    def collate(rows):
        width = {key: max(len(row[key]) for row in rows) for key in rows[0]}
        fill = {"input_ids": 0, "attention_mask": 0, "labels": -100}
        return {
            key: torch.tensor([row[key] + [fill[key]] * (width[key] - len(row[key])) for row in rows]) for key in fill
        }

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=3, report_to="none", use_cpu=True
    )
    trainer = TranslationTrainer(model=model, args=args, train_dataset=OneBatch(), data_collator=collate)
    trainer.train()
    expected = formula(model.config, [5, 3, 1], [2, 4, 3])
    assert trainer.state.total_flos == pytest.approx(expected, rel=1e-12)
    # not transformers' generic estimate, 6 x weights x padded source positions
    assert trainer.state.total_flos != 6 * 15 * model.num_parameters(exclude_embeddings=True)


def test_the_rnn_counts_its_weights_per_real_token():
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(load_preset("rnn-tiny", vocab_size=20, pad_token_id=0))
    batch = {
        "input_ids": torch.tensor([[5, 6, 7], [5, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        "labels": torch.tensor([[5, 6, 2, -100], [5, 6, 7, 2]]),
    }
    base, config = model.model, model.config
    encoder = sum(p.numel() for p in base.encoder.parameters()) - base.encoder.embed_tokens.weight.numel()
    decoder = sum(p.numel() for p in base.decoder.parameters()) - base.decoder.embed_tokens.weight.numel()
    s, t, st = 4, 7, 3 * 3 + 1 * 4
    forward = 2 * s * encoder + 2 * t * decoder + 4 * st * 2 * config.encoder_hidden_size
    forward += 2 * t * model.lm_head.weight.numel()
    assert model.floating_point_ops(batch) == pytest.approx(3 * forward, rel=1e-12)


def test_the_mfu_line_needs_a_gpu_the_table_names(monkeypatch):
    assert throughput.peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert throughput.peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert throughput.peak_bf16_flops("NVIDIA L40S") == 362e12
    assert throughput.peak_bf16_flops("Tesla T4") is None
    assert throughput.mfu_line(1e15, 10.0, 1) is None or torch.cuda.is_available()  # no GPU here: no line
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    assert throughput.mfu_line(989e12 * 10 * 2 / 4, 10.0, 2).startswith("MFU 25.0%")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Tesla T4")
    assert throughput.mfu_line(1e15, 10.0, 1) is None
