"""The bench suite runs its benches on tiny presets and reports what they promise: the speed numbers are not checked
here (they are the benchmark's job), only that each report is complete, its values sane and its file written; the
harness's timing order, first-call check, envelope and writer, and the `python -m bench` entry point, by hand."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAINING_PEERS = ["attn_transformer", "MarianMTModel (sdpa)", "MarianMTModel (eager)", "torch.nn.Transformer"]
HEADER = (
    "| model | params | train tok/s | greedy b32 tok/s | beam4 b32 tok/s | greedy b1 ms/sent | beam4 b1 ms/sent "
    "| train peak MB |"
)


def bench_module(name: str):
    """The module of the bench NAME (`bench.BENCHES`), imported as the suite's entry point imports it."""
    from bench import BENCHES

    return importlib.import_module(BENCHES[name])


@pytest.fixture(scope="module")
def common():
    """bench/common.py, what the model benches share."""
    return importlib.import_module("bench.common")


@pytest.fixture(scope="module")
def speed():
    return bench_module("speed")


def run_quick(speed, output_dir: Path, *extra: str) -> tuple[dict, str]:
    speed.main(["--quick", "--output_dir", str(output_dir), *extra])
    report = json.loads((output_dir / "tiny-cpu.json").read_text())
    table = (output_dir / "tiny-cpu.md").read_text()
    assert (output_dir / "tiny-cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return report, table


def check_report(common, report: dict, table: str) -> dict:
    (result,) = report["results"]
    assert result["preset"] == "tiny"
    models = result["models"]
    assert set(TRAINING_PEERS) <= set(models)
    expected = common.reference_model("tiny", 128, seed=0).num_parameters()
    for name in TRAINING_PEERS:
        entry = models[name]
        # Same architecture, same weights: equal parameter counts and (in eval mode) the same loss.
        assert entry["parameters"] == expected, name
        assert entry["loss_difference"] < 1e-4, name
        for key in ("train_tokens_per_s", "greedy_batch_tokens_per_s", "greedy_single_ms_per_sentence"):
            assert math.isfinite(entry[key]) and entry[key] > 0, (name, key)
    for name in ("attn_transformer", "MarianMTModel (sdpa)", "MarianMTModel (eager)"):
        assert models[name]["beam4_batch_tokens_per_s"] > 0
    assert "beam4_batch_tokens_per_s" not in models["torch.nn.Transformer"]  # it has no beam search

    sweep = result["length_sweep"]
    assert sweep["lengths"] == [32, 64]
    for name in TRAINING_PEERS:
        assert len(sweep["train_tokens_per_s"][name]) == 2 and min(sweep["train_tokens_per_s"][name]) > 0

    lines = table.splitlines()
    start = lines.index(HEADER) + 2
    main_table = lines[start : lines.index("", start)]
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in main_table}
    assert set(TRAINING_PEERS) <= set(rows)
    assert f"| attn_transformer | {expected:,} |" in rows["attn_transformer"]
    assert any(line.startswith("- training vs MarianMTModel") for line in lines)
    return models


def test_quick_run_without_memory(speed, common, tmp_path):
    report, table = run_quick(speed, tmp_path, "--no_memory")
    models = check_report(common, report, table)
    assert all("memory" not in entry for entry in models.values())

    # --render rewrites the table from the JSON, adding what a second report measured (here: a memory figure).
    (tmp_path / "tiny-cpu.md").unlink()
    speed.main(["--render", str(tmp_path / "tiny-cpu.json")])
    assert (tmp_path / "tiny-cpu.md").read_text() == table
    extra = {"command": "second", "results": [{"preset": "tiny", "models": {"attn_transformer": {"memory": {}}}}]}
    extra["results"][0]["models"]["attn_transformer"]["memory"]["training_mb"] = 12.5
    (tmp_path / "memory.json").write_text(json.dumps(extra))
    speed.main(["--render", str(tmp_path / "tiny-cpu.json"), str(tmp_path / "memory.json")])
    rendered = (tmp_path / "tiny-cpu.md").read_text()
    assert rendered.splitlines()[0].endswith("; second`")
    row = next(line for line in rendered.splitlines() if line.startswith("| attn_transformer |"))
    assert row.endswith("| 12 |") and table != rendered


@pytest.mark.slow
def test_quick_run_with_memory_subprocesses(speed, common, tmp_path):
    report, table = run_quick(speed, tmp_path)
    models = check_report(common, report, table)
    for name in TRAINING_PEERS:
        memory = models[name]["memory"]
        assert memory["peak_mb"] >= memory["before_mb"] > 50, name  # torch alone takes more than 50 MB
        assert memory["training_mb"] == pytest.approx(memory["peak_mb"] - memory["before_mb"])
    assert any(line.startswith("- training peak memory vs MarianMTModel") for line in table.splitlines())


def test_each_part_is_saved_as_it_is_measured(speed):
    """A run cut short (a time limit on a lent GPU) keeps the parts it measured: `save` sees each as it comes."""
    args = speed.parse_args(["--quick", "--parts", "train", "generate"])
    snapshots = []
    speed.bench_preset(
        "tiny",
        args,
        ["attn_transformer", "MarianMTModel (sdpa)"],
        lambda r: snapshots.append(
            {
                name: sorted(key for key in entry if key.endswith(("tokens_per_s", "ms_per_sentence")))
                for name, entry in r["models"].items()
            }
        ),
    )
    # training, then greedy batch, greedy single, beam-4 batch (the quick run skips beam-4 single sentences)
    assert len(snapshots) == 4
    assert snapshots[0]["attn_transformer"] == ["train_tokens_per_s"]
    assert "greedy_batch_tokens_per_s" in snapshots[1]["MarianMTModel (sdpa)"]
    assert "beam4_batch_tokens_per_s" not in snapshots[2]["attn_transformer"]
    assert "beam4_batch_tokens_per_s" in snapshots[3]["attn_transformer"]


def test_mfu_counts_the_real_tokens_only(common):
    """Hand-computed FLOPs of one sentence; padding it (batching with a longer one) adds nothing."""
    from types import SimpleNamespace

    config = SimpleNamespace(d_model=4, d_ff=8, encoder_layers=1, decoder_layers=1, decoder_vocab_size=10)
    generator = __import__("torch").Generator().manual_seed(0)
    one = common.make_batch([(2, 2)], 10, generator)  # source 2 tokens, target 2 tokens + EOS
    # per token: q/k/v/out 4*4*4 + FFN 2*4*8 = 128; encoder 2*2*128 + scores 4*2*2*4 = 576;
    # decoder 2*3*128 + cross-attention projections 2*(3*2*16 + 2*2*16) + scores 4*3*(3+2)*4 = 1328;
    # output layer 2*3*4*10 = 240; training = 3 x forward
    assert common.training_flops(config, one) == 3 * (576 + 1328 + 240)
    other = common.make_batch([(5, 6)], 10, generator)
    both = common.make_batch([(2, 2), (5, 6)], 10, generator)
    assert common.training_flops(config, both) == common.training_flops(config, one) + common.training_flops(
        config, other
    )


def train_step_report(tmp_path: Path, *flags: str) -> tuple[dict, str]:
    report = bench_module("train_step").main(
        [*flags, "--reps", "1", "--threads", "1", "--output", str(tmp_path / "t")]
    )
    assert json.loads((tmp_path / "t.json").read_text()) == json.loads(json.dumps(report))
    table = (tmp_path / "t.md").read_text()
    assert table.startswith(f"Command: `python -m bench train_step {' '.join(flags)} --reps 1")
    assert all(f"| {name} |" in table for name in report["variants"])  # one row per variant
    assert all(min(entry["seconds"]) > 0 and entry["speedup"] > 0 for entry in report["variants"].values())
    return report, table


def test_train_step_bf16_measures_the_8_combinations(tmp_path):
    """--compare bf16: 2 models x training / beam search x float32 / bfloat16, each against its float32 twin."""
    report, _ = train_step_report(tmp_path, "--compare", "bf16", "--preset", "tiny")
    assert report["sentences"] == 32 and report["preset"] == "tiny"
    expected = [
        f"{model} {task}"
        for model in ("attn_transformer", "MarianMTModel (sdpa)")
        for task in ("train float32", "train bf16 autocast", "beam4 float32", "beam4 bfloat16 weights")
    ]
    assert list(report["variants"]) == expected
    assert report["variants"]["MarianMTModel (sdpa) beam4 bfloat16 weights"]["baseline"] == (
        "MarianMTModel (sdpa) beam4 float32"
    )


def test_train_step_fast_paths_times_the_4_combinations_and_restores_them(tmp_path):
    """--compare fast_paths: the 4 on/off combinations of the CPU fast paths; the patches hold inside a step only."""
    import torch

    from bench import harness, train_step
    from modeling_attn import loss, modeling_transformer

    shipped = (modeling_transformer.dropout, loss.fuses_output_loss)
    report, _ = train_step_report(tmp_path, "--preset", "tiny", "--batch_size", "8")
    assert report["compare"] == "fast_paths" and report["sentences"] == 8
    assert list(report["variants"]) == list(train_step.FAST_PATHS)
    assert (modeling_transformer.dropout, loss.fuses_output_loss) == shipped
    seen = []

    def probe() -> None:
        fused = loss.fuses_output_loss(torch.nn.Linear(2, 2, bias=False), torch.zeros(1, 2))
        seen.append((modeling_transformer.dropout, fused))

    harness.patched(probe, *train_step.FAST_PATHS["neither (PyTorch dropout, unfused loss)"])()
    assert seen == [(train_step.torch_dropout, False)]
    assert (modeling_transformer.dropout, loss.fuses_output_loss) == shipped


def test_train_step_logits_on_an_rnn_and_what_it_refuses(tmp_path):
    """--compare logits times full logits against skip_logits (an attn_rnn preset here); fast_paths refuses one."""
    report, _ = train_step_report(tmp_path, "--compare", "logits", "--preset", "rnn-tiny", "--batch_size", "8")
    assert list(report["variants"]) == ["full logits", "skip_logits (what attn train uses)"]
    with pytest.raises(SystemExit):
        bench_module("train_step").main(["--preset", "rnn-tiny", "--reps", "1"])


@pytest.mark.parametrize("preset", ["tiny", "multi30k-transformer"])  # post-LN and pre-LN
def test_decode_step_matches_the_models_decoder(preset, tmp_path, monkeypatch):
    """decode_step's static-buffer step computes what the model's decoder does (its run fails otherwise), for both
    layer-norm placements, and the check does fail on a step that differs."""
    module = bench_module("decode_step")
    flags = ["--preset", preset, "--rows", "6", "--steps", "4", "--max_length", "5", "--reps", "1", "--threads", "1"]
    report = module.main([*flags, "--no_compile", "--output", str(tmp_path / "d")])
    assert list(report["variants"]) == ["dynamic cache (generate's)", "static buffers"]
    assert all(min(entry["seconds"]) > 0 for entry in report["variants"].values())
    table = (tmp_path / "d.md").read_text()
    assert f"preset {preset}, 6 rows" in table and "| static buffers |" in table

    exact = module.static_step
    monkeypatch.setattr(module, "static_step", lambda model, rows: lambda *a: exact(model, rows)(*a) * 1.001)
    with pytest.raises(RuntimeError, match="static buffers: log-probabilities differ"):
        module.main([*flags, "--no_compile", "--output", str(tmp_path / "d")])


def test_decode_step_breakdown_and_what_it_refuses(tmp_path):
    """--part breakdown: generate() against its encoder, decoder steps and output projection (each a share of it)."""
    module = bench_module("decode_step")
    report = module.main(
        ["--part", "breakdown", "--preset", "tiny", "--batch_size", "4", "--output", str(tmp_path / "b")]
    )
    assert list(report["variants"]) == [
        "generate (beam 4)",
        "encoder",
        "decoder steps (incl. output projection)",
        "output projection alone",
    ]
    assert all(entry["seconds"][0] > 0 for entry in report["variants"].values())
    assert "| generate (beam 4) |" in (tmp_path / "b.md").read_text()
    with pytest.raises(ValueError, match="--steps 9 exceeds --max_length 8"):
        module.main(["--preset", "tiny", "--steps", "9", "--max_length", "8"])
    with pytest.raises(ValueError, match="has model_type attn_rnn"):
        module.main(["--preset", "rnn-tiny", "--steps", "2", "--max_length", "2", "--reps", "1"])


@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
def test_beam_search_runs_on_a_tiny_saved_model(model_type, tmp_path):
    """beam_search times ours against transformers' beam search (and Marian for a post-LN Transformer) on a saved
    model, after checking that ours and transformers' translate alike."""
    from test_translate import SENTENCES, save_tiny_model

    module = bench_module("beam_search")
    folder = save_tiny_model(tmp_path / "model", model_type)
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES * 3) + "\n")
    argv = ["--model", str(folder), "--source", str(source), "--batch_size", "4", "--reps", "1", "--threads", "1"]
    report = module.main([*argv, "--num_beams", "3", "--output", str(tmp_path / "beam")])
    expected = ["ours", "transformers' beam search"] + (["MarianMTModel"] if model_type == "attn_transformer" else [])
    assert list(report["variants"]) == expected
    assert all(entry["median_s"] > 0 for entry in report["variants"].values())
    assert report["sentences"] == len(SENTENCES) * 3
    table = (tmp_path / "beam.md").read_text()
    assert "| transformers' beam search |" in table and table.count("| yes |") == len(expected) - 1
    assert "rows of closed sentences in transformers' beam search" in table
    if model_type == "attn_rnn":
        assert "MarianMTModel not measured" in table


def test_translated_tokens_stop_at_the_first_end_token():
    import torch

    module = bench_module("beam_search")
    sequences = torch.tensor([[1, 5, 6, 2, 2, 2], [1, 7, 2, 0, 0, 0], [1, 3, 4, 5, 6, 8]])
    assert module.translated_tokens(sequences, eos_token_id=2) == 3 + 2 + 5


def finite_numbers(value) -> list[float]:
    """Every number in a JSON value (booleans are not numbers here)."""
    if isinstance(value, dict):
        return [n for item in value.values() for n in finite_numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in finite_numbers(item)]
    if isinstance(value, int | float) and not isinstance(value, bool):
        assert math.isfinite(value), value
        return [value]
    return []


def test_gpu_dry_run_measures_every_part(common, tmp_path, monkeypatch):
    """bench/gpu.py --dry-run runs each part on the CPU (tiny presets, float32): the JSON holds every part with finite
    numbers, sdpa agrees with eager within the stated tolerance, refused backends say why, the MFU arithmetic is the
    FLOP formula over the median round, and an sdpa that computes something else is caught."""
    import torch

    module = bench_module("gpu")
    output = tmp_path / "gpu.json"
    report = module.main(["--dry-run", "--output", str(tmp_path / "gpu"), "--peak_tflops", "2"])
    assert json.loads(output.read_text()) == report
    assert set(report["parts"]) == {"attention", "train", "attn_train", "generate", "compile"} and report["dry_run"]
    assert finite_numbers(report)  # and each of them finite

    attention = report["parts"]["attention"]
    transformer, rnn = attention["results"]
    assert attention["passed"] and not module.failed(report)
    assert not [entry for part in report["parts"].values() for entry in part["results"] if "error" in entry]
    sdpa = transformer["backends"]["sdpa"]
    assert transformer["model_type"] == "attn_transformer" and transformer["dtype"] == "float32"
    # in float32 eager's own error is 0 (it is the reference), so the allowance is the float32 floor
    assert transformer["eager_max_abs_error"] == 0 and transformer["tolerance"] == 1e-5
    assert sdpa["ran"] and sdpa["passed"] and sdpa["max_abs_error"] <= transformer["tolerance"]
    assert (
        0 <= sdpa["mean_abs_difference_from_eager"] <= sdpa["max_abs_difference_from_eager"] == sdpa["max_abs_error"]
    )
    assert not transformer["declares"]["flash_attention_2"]
    assert "does not support Flash Attention" in transformer["backends"]["flash_attention_2"]["refused"]
    assert rnn["model_type"] == "attn_rnn" and not rnn["backends"]["sdpa"]["ran"] and rnn["passed"] is None
    assert "scaled_dot_product_attention" in rnn["backends"]["sdpa"]["refused"]

    (trained,) = report["parts"]["train"]["results"]
    config = common.reference_model("tiny", 1024, seed=0).config
    batches = module.bucketed_batches(2, 8, config.vocab_size, seed=1)
    flops = sum(common.training_flops(config, batch) for batch in batches)
    median = sorted(trained["seconds_per_round"])[0] / 2 + sorted(trained["seconds_per_round"])[1] / 2
    assert trained["target_tokens_per_round"] == sum(batch.target_tokens for batch in batches)
    assert trained["model_tflops_per_s"] == pytest.approx(flops / median / 1e12)
    assert trained["mfu"] == pytest.approx(trained["model_tflops_per_s"] / 2)
    assert 0 < trained["loss_after"] < 10 and trained["target_tokens_per_s"] > 0
    # attn train itself (the dates task, 4 steps): Trainer's throughput, MFU from its total_flos, the CPU settings
    (recipe,) = report["parts"]["attn_train"]["results"]
    assert recipe["target_tokens_per_s"] > 0 and recipe["mfu"] == pytest.approx(recipe["model_tflops_per_s"] / 2)
    assert recipe["settings"] == {
        "device": "cpu",
        "mixed_precision": "no",
        "optim": "adamw_torch_fused",
        "tf32": False,
        "torch_compile": False,
    }
    (generated,) = report["parts"]["generate"]["results"]
    for key in ("greedy_batch4", "beam4_batch4"):
        assert generated[key]["target_tokens_per_s"] > 0 and generated[key]["ms_per_sentence"] > 0
    # compiled (the dry run: torch.compile's graph capture, "eager" backend) static-cache decoding gives the ids of
    # the eager dynamic cache's
    (compiled,) = report["parts"]["compile"]["results"]
    assert compiled["backend"] == "eager"
    for key in ("greedy_batch4", "beam4_batch4"):
        assert compiled[key]["same_ids"] is True
        for variant in ("eager, dynamic cache", "compiled, static cache"):
            assert compiled[key][variant]["target_tokens_per_s"] > 0 and compiled[key][variant]["first_call_s"] > 0

    # sdpa's output off by 1%: the check fails and the command would exit with status 1; a part that raises is kept
    # in the report as its error, after the parts before it
    exact = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: exact(*a, **k) * 1.01)
    flags = ["--dry-run", "--parts", "attention", "--attention_presets", "tiny", "--output", str(tmp_path / "gpu")]
    report = module.main(flags)
    (transformer,) = report["parts"]["attention"]["results"]
    assert not transformer["passed"] and not report["parts"]["attention"]["passed"] and module.failed(report)
    assert transformer["backends"]["sdpa"]["max_abs_error"] > transformer["tolerance"]

    monkeypatch.undo()
    monkeypatch.setattr(module, "train", lambda *args: torch.empty(2**62))
    report = module.main([*flags[:2], "attention", "train", *flags[3:]])
    assert report["parts"]["attention"]["passed"] and json.loads(output.read_text()) == report
    (crashed,) = report["parts"]["train"]["results"]
    assert crashed["preset"] == "tiny" and "RuntimeError" in crashed["error"] and module.failed(report)


def test_engines_quick_run_of_the_pytorch_runtimes(tmp_path):
    """engines --quick with the three PyTorch runtimes (torch.compile's graph capture without code generation): every
    search measured, and the static-cache runtimes, compiled or not, give the dynamic cache's ids."""
    module = bench_module("engines")
    runtimes = module.RUNTIMES[:3]
    report = module.main(["--quick", "--runtimes", *runtimes, "--output", str(tmp_path / "e")])
    assert json.loads((tmp_path / "e.json").read_text()) == json.loads(json.dumps(report))
    (result,) = report["results"]
    assert set(result["settings"]) == {"greedy_batch", "greedy_single", "beam4_batch", "beam4_single"}
    for entries in result["settings"].values():
        assert list(entries) == runtimes
        for entry in entries.values():
            assert entry["same_ids"] == 1.0 and entry["tokens_per_s"] > 0 and entry["first_call_s"] > 0
    table = (tmp_path / "e.md").read_text()
    assert table.startswith("Command: `python -m bench engines --quick --runtimes")
    assert "| PyTorch compiled, static cache |" in table


def test_decode_quick_run(tmp_path):
    """decode --quick: the engines a user picks with --engine, and CTranslate2 called directly, on the tiny preset
    (random weights, lengths forced by max_new_tokens): greedy translations equal the torch engine's on every
    engine; the table gives each engine's rate against CTranslate2 direct."""
    pytest.importorskip("ctranslate2", reason="the ctranslate2 engine and its peer need ctranslate2")
    module = bench_module("decode")
    engines = ["CTranslate2 direct", "generate()", "torch", "ctranslate2", "auto"]
    report = module.main(["--quick", "--engines", *engines, "--output", str(tmp_path / "d")])
    assert list(report["results"]) == ["batch 1 greedy", "batch 4 greedy", "batch 1 beam4", "batch 4 beam4"]
    for column, entries in report["results"].items():
        assert list(entries) == engines
        assert all(entry["sentences_per_s"] > 0 for entry in entries.values())
        if "greedy" in column:
            assert all(entry["same_as_torch"] == report["sentences"] for entry in entries.values()), column
    table = (tmp_path / "d.md").read_text()
    assert table.startswith("Command: `python -m bench decode --quick --engines") and "| auto | " in table
    assert "(1.00x)" in table  # CTranslate2 direct against itself


def test_fast_generation_run_on_a_tiny_preset_and_its_ceiling(tmp_path):
    """fast_generation on the tiny preset (random weights, forced lengths): the same ids as generate() on every
    sentence, and "the step's matmuls alone" timed on the steps the loop ran, as many as it ran."""
    module = bench_module("fast_generation")
    from modeling_attn import fast_generation

    argv = ["--preset", "tiny", "--sentences", "4", "--batch_sizes", "1", "2", "--max_new_tokens", "5", "--reps", "1"]
    report = module.main([*argv, "--output", str(tmp_path / "f")])
    assert [(entry["batch_size"], entry["num_beams"]) for entry in report["results"]] == [
        (1, 1),
        (1, 4),
        (2, 1),
        (2, 4),
    ]
    for entry in report["results"]:
        assert entry["same_ids"] == "4 of 4"
        assert (
            entry["ceiling"]
            == entry["sentences_per_s_cpu"]["matmuls alone"] / entry["sentences_per_s_cpu"]["generate"]
        )
    model, sources, encode, extra = module.preset_inputs(module.parse_args(argv))
    rows = module.step_rows(model, [encode(sources[:1])], {"num_beams": 4, **extra})
    assert set(rows) == {4} and 1 <= len(rows) <= 5  # the 4 beams of one sentence, at most max_new_tokens steps
    assert fast_generation.DecoderStep.__call__.__name__ == "__call__"  # the recording undone
    assert "| the step's matmuls alone | ceiling |" in (tmp_path / "f.md").read_text()


@pytest.mark.slow
def test_engines_quick_run(tmp_path):
    """engines --quick: the five runtimes on the tiny preset; onnxruntime and the compiled model give PyTorch's ids
    for every sentence (CTranslate2 runs its own search: its share is reported, not required)."""
    pytest.importorskip("ctranslate2", reason="the fast extra's ctranslate2 is not installed")
    pytest.importorskip("onnxruntime", reason="the onnx extra's onnxruntime is not installed")
    module = bench_module("engines")
    report = module.main(["--quick", "--output", str(tmp_path / "e")])
    (result,) = report["results"]
    assert set(result["settings"]) == {"greedy_batch", "beam4_batch", "greedy_single", "beam4_single"}
    for entries in result["settings"].values():
        assert list(entries) == module.RUNTIMES
        assert all(entries[name]["same_ids"] == 1.0 for name in module.RUNTIMES[:4])
        assert all(entry["sentences_per_s"] > 0 and 0 <= entry["same_ids"] <= 1 for entry in entries.values())
    assert result["setup"]["onnxruntime export s"] > 0 and result["setup"]["CTranslate2 export s"] > 0
    assert report["versions"]["onnxruntime"] and "| onnxruntime |" in (tmp_path / "e.md").read_text()


@pytest.mark.slow
def test_int8_quick_run(tmp_path):
    """bench/int8.py --quick: float32, each engine's int8 copy and CTranslate2 timed with lengths forced both ways
    (each run checks that every output has the forced length), and the quality part on a saved model: every run
    scored, the int8 runs' changes counted against float32."""
    pytest.importorskip("ctranslate2", reason="the fast extra's ctranslate2 is not installed")
    from test_serve import save_model

    module = bench_module("int8")
    model = save_model(tmp_path / "model")
    module.main(["--quick", "--model", str(model), "--max_samples", "8", "--output", str(tmp_path / "int8")])
    results = json.loads((tmp_path / "int8.json").read_text())
    int8_runs = [
        f"int8 ({engine}{', default' if engine == module.DEFAULT else ''})"
        for engine in ("x86", "onednn")
        if engine in module.ENGINES
    ] + ["int8 (rowwise)"]
    assert list(results["speed"]["threads"]["1"]) == ["min_new_tokens", "no_eos"]
    for runs in results["speed"]["threads"]["1"].values():
        assert list(runs) == ["float32", *int8_runs, "CTranslate2 int8", "CTranslate2 float32"]
        assert all(run["wall_tokens_per_s"] > 0 and run["cpu_tokens_per_s"] > 0 for run in runs.values())
    quality = results["quality"]
    assert quality["sentences"] == 8 and list(quality["runs"]) == ["float32", *int8_runs, "CTranslate2 int8"]
    assert quality["runs"]["float32"]["changed_vs_float32"] == 0
    assert all(0 <= run["changed_vs_float32"] <= 8 and "bleu" in run for run in quality["runs"].values())
    assert quality["alone"] == 8 and all(0 <= run["changed_alone"] <= 8 for run in quality["runs"].values())
    assert quality["runs"]["float32"]["changed_alone"] == 0  # float32 is the same in any batch
    assert "| 1 | no_eos | float32 |" in (tmp_path / "int8.md").read_text()


def test_interleaved_rounds_warm_up_then_rotate_and_time_both_clocks():
    """One untimed call of each task, then `reps` rounds, each starting one task later; every call timed by both
    clocks, and the wall clock sees a sleep the CPU clock does not."""
    import time

    from bench import harness

    calls = []
    tasks = {name: (lambda name=name: calls.append(name) or (name == "b" and time.sleep(0.02))) for name in "abc"}
    seconds = harness.interleaved_clocks(tasks, reps=4)
    assert calls == ["a", "b", "c"] + ["a", "b", "c"] + ["b", "c", "a"] + ["c", "a", "b"] + ["a", "b", "c"]
    assert all(len(by_clock["wall"]) == len(by_clock["cpu"]) == 4 for by_clock in seconds.values())
    assert min(seconds["b"]["wall"]) >= 0.02 > max(seconds["b"]["cpu"])
    assert harness.interleaved(tasks, reps=2, clock="cpu").keys() == tasks.keys()


def test_first_call_then_rounds_compares_each_output_with_the_first():
    from bench import harness

    outputs = {"reference": [1, 2, 3], "same": [1, 2, 3], "other": [1, 2, 4]}
    calls = {name: (lambda output=output: output) for name, output in outputs.items()}
    timed = []
    tasks = {name: (lambda name=name: timed.append(name)) for name in outputs}
    entries = harness.first_call_then_rounds(calls, tasks, 2, "wall", lambda a, b: a == b)
    assert {name: entry["same_ids"] for name, entry in entries.items()} == {
        "reference": True,
        "same": True,
        "other": False,
    }
    assert all(entry["first_call_s"] >= 0 and len(entry["seconds"]) == 2 for entry in entries.values())
    assert len(timed) == 3 + 2 * 3  # a warm-up call of each, then two rounds


def test_the_envelope_names_the_command_that_reruns_the_bench_and_the_writer_puts_it_first(tmp_path):
    from bench import harness

    report = harness.envelope("bench.train_step", ["--preset", "tiny", "--output", "a b"], ("nothing-such",), x=1)
    assert report["bench"] == "train_step" and report["x"] == 1
    assert report["command"] == "python -m bench train_step --preset tiny --output 'a b'"
    assert report["versions"]["torch"] and report["versions"]["nothing-such"] is None
    harness.write_results(tmp_path / "sub" / "r-1.0", report, "| a |\n", quiet=True)
    assert json.loads((tmp_path / "sub" / "r-1.0.json").read_text()) == report
    text = (tmp_path / "sub" / "r-1.0.md").read_text()
    assert text.startswith(f"Command: `{report['command']}`\n\nMachine: {report['machine']}; python ")
    assert text.endswith("\n\n| a |\n")


def test_every_bench_is_a_module_with_main_and_the_entry_point_runs_one(tmp_path):
    """`python -m bench` lists every bench, refuses an unknown name with a hint, and runs a bench with its flags."""
    import inspect

    from bench import BENCHES

    for name, module in BENCHES.items():
        main = importlib.import_module(module).main
        assert list(inspect.signature(main).parameters) == ["argv"], name
    run = [sys.executable, "-m", "bench"]
    listed = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert all(f"  {name} " in listed for name in BENCHES)
    wrong = subprocess.run([*run, "trainstep"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert wrong.returncode == 2 and "did you mean train_step?" in wrong.stderr
    flags = ["--preset", "tiny", "--batch_size", "4", "--reps", "1", "--threads", "1", "--output", str(tmp_path / "r")]
    subprocess.run([*run, "train_step", *flags], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads((tmp_path / "r.json").read_text())["command"].startswith("python -m bench train_step --preset")


def test_the_readme_index_has_a_row_for_every_bench():
    from bench import BENCHES

    text = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    index = text.split("## Index\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in index.splitlines() if line.startswith("| `")]
    assert [line.split("`")[1] for line in rows] == list(BENCHES)
    assert all(f"`python -m bench {name}" in row for name, row in zip(BENCHES, rows, strict=True))


def test_threads_quick_run(tmp_path):
    """bench/threads.py --quick on a saved tiny model: every row (translate at two batch sizes, serve, load_translator
    at batch 1 and 32) measured at each setting in a pinned process, and the default's share of the best computed
    from the medians."""
    pytest.importorskip("fastapi", reason="the serve extra's fastapi is not installed")
    from test_serve import save_model

    module = bench_module("threads")
    model = save_model(tmp_path / "model")
    argv = ["--model", str(model), "--quick", "--cpus", "0", "--settings", "default", "1"]
    report = module.main([*argv, "--output", str(tmp_path / "t")])
    assert len(report["rows"]) == 5
    for row, entries in report["rows"].items():
        assert list(entries) == ["default", "1"] and all(entry["median"] > 0 for entry in entries.values()), row
    assert module.default_ratio("x (sentences/s), CPUs 0", {"default": 90.0, "1": 100.0}) == 0.9
    assert module.default_ratio("x (ms), CPUs 0", {"default": 10.0, "1": 5.0}) == 0.5
    assert "| default / best |" in (tmp_path / "t.md").read_text()


def test_steer_quick_run_counts_the_differences_and_times_each_engine(tmp_path):
    pytest.importorskip("ctranslate2", reason="the steer bench compares torch with ctranslate2")
    from test_engines import save_reverser

    folder = save_reverser(tmp_path / "reverser")
    steer = bench_module("steer")
    report = steer.main(["--model", str(folder), "--sentences", "8", "--reps", "1", "--output", str(tmp_path / "s")])
    assert set(report["agreement"]) == {f"{name}, {search}" for name in steer.SETTINGS for search in steer.SEARCHES}
    assert all(0 <= entry["differ"] <= 8 for entry in report["agreement"].values())
    assert all(rate > 0 for entry in report["speed"].values() for rate in entry.values())
    assert report["constraints"]["cost"] > 0 and all(rate > 0 for rate in report["scoring"].values())
    assert (tmp_path / "s.md").read_text().count("| prefix, greedy |") == 2


def test_documents_quick_run_scores_both_ways_and_times_them(tmp_path):
    from test_engines import SENTENCES, save_reverser

    folder = save_reverser(tmp_path / "reverser")
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.a").write_text("".join(f"{sentence}?\n" for sentence in SENTENCES[:12]))
    (data / "test.b").write_text("".join(f"{' '.join(sentence.split()[::-1])}\n" for sentence in SENTENCES[:12]))
    documents = bench_module("documents")
    argv = ["--model", str(folder), "--data", str(data), "--split", "test", "--source_lang", "a", "--target_lang", "b"]
    report = documents.main([*argv, "--engine", "torch", "--reps", "1", "--output", str(tmp_path / "d")])
    assert report["sentences"] == 12 and report["paragraphs"] == len(documents.paragraphs_of(12, 0))
    assert report["paragraphs_split_as_written"] == report["paragraphs"]  # "?" ends every sentence
    bleu = report["bleu_lc_tok_paragraphs"]
    assert bleu["document"] == bleu["per line"]  # the same sentences, the same translations
    assert all(rate > 0 for rates in report["sentences_per_second"].values() for rate in rates.values())
    assert "| document |" in (tmp_path / "d.md").read_text()


def test_the_documents_paragraphs_cover_every_sentence_in_runs_of_3_to_8():
    runs = bench_module("documents").paragraphs_of(100, seed=1)
    assert [i for run in runs for i in run] == list(range(100))
    assert all(3 <= len(run) <= 8 for run in runs[:-1]) and 1 <= len(runs[-1]) <= 8


@pytest.mark.slow
def test_stream_quick_run_streams_a_document_from_a_real_server(tmp_path):
    pytest.importorskip("fastapi", reason="the stream bench runs attn serve (the serve extra)")
    from test_serve import save_model

    folder = save_model(tmp_path / "model")
    stream = bench_module("stream")
    argv = ["--model", str(folder), "--sentences", "3", "--rounds", "1", "--engine", "torch", "--threads", "1"]
    report = stream.main([*argv, "--output", str(tmp_path / "s")])
    assert report["checks"] == {
        "concatenation_equals_the_answer": True,
        "done_equals_the_answer": True,
        "first_event_is_sentence_0": True,
        "sentence_events": 3,
    }
    assert all(value > 0 for value in report["median_s"].values())
    assert report["median_s"]["first sentence of the stream"] < report["median_s"]["document streamed"]
    assert (tmp_path / "s.md").read_text().startswith("Command: `python -m bench stream --model")


def test_markup_tags_the_fields_of_a_date_and_scores_where_they_land():
    markup = bench_module("markup")
    tagged = markup.tagged("Tuesday, March 3rd, 1987", "1-1 2-2 3-0")
    assert tagged == '<p>Tuesday, <b id="month">March</b> <b id="day">3rd</b>, <b id="year">1987</b></p>'
    assert markup.tagged("3. März 1987", "0-2 1-1 2-0").startswith('<p><b id="day">3</b>. <b id="month">März</b>')
    landed = markup.score('<p><b id="year">1987-</b><b id="month">03</b>-<b id="day"></b>03</p>')
    assert landed == {"year": "right", "month": "wrong", "day": "empty"}  # "03" is not the whole word "03-"
