"""bench/speed.py runs on the tiny preset and reports what it promises: the speed numbers are not checked here
(they are the benchmark's job), only that the report is complete and its values are sane."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "speed.py"
TRAINING_PEERS = ["attn_transformer", "MarianMTModel (sdpa)", "MarianMTModel (eager)", "torch.nn.Transformer"]
HEADER = (
    "| model | params | train tok/s | greedy b32 tok/s | beam4 b32 tok/s | greedy b1 ms/sent | beam4 b1 ms/sent "
    "| train peak MB |"
)


def bench_script(name: str):
    """Import bench/NAME.py as a module (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", SCRIPT.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def common():
    """bench/common.py, the helpers the bench scripts share: the module they import (bench/ on sys.path)."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module("common")


@pytest.fixture(scope="module")
def speed():
    spec = importlib.util.spec_from_file_location("bench_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_speed"] = module
    spec.loader.exec_module(module)
    return module


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
    assert rendered.splitlines()[1].endswith("; second`")
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


def test_cpu_bf16_script_runs_on_tiny(capsys):
    """bench/cpu_bf16.py measures the 8 combinations (2 models x training / beam search x float32 / bfloat16)."""
    module = bench_script("cpu_bf16")
    medians = module.main(["--preset", "tiny", "--reps", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("preset tiny, batch 32")
    assert sorted(medians) == sorted(
        f"{model} {task}"
        for model in ("attn_transformer", "MarianMTModel (sdpa)")
        for task in ("train float32", "train bf16 autocast", "beam4 float32", "beam4 bfloat16 weights")
    )
    assert all(seconds > 0 for seconds in medians.values())
    assert [line.split("  ")[0].strip() for line in lines[1:]] == list(medians)  # one printed row per measurement


def test_cpu_train_step_script_runs_on_tiny_and_restores_the_fast_paths(capsys):
    """bench/cpu_train_step.py times the 4 on/off combinations of the CPU fast paths; its switches are undone."""
    import torch

    from modeling_attn import loss, modeling_transformer

    module = bench_script("cpu_train_step")
    shipped = (modeling_transformer.dropout, loss.fuses_output_loss)
    medians = module.main(["--preset", "tiny", "--batch_size", "8", "--reps", "1", "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("preset tiny, 8 sentences")
    assert list(medians) == list(module.VARIANTS) and all(seconds > 0 for seconds in medians.values())
    assert [line.split(" | ")[0].lstrip("| ") for line in lines[3:]] == list(medians)
    assert (modeling_transformer.dropout, loss.fuses_output_loss) == shipped
    with module.patched(module.VARIANTS["neither (PyTorch dropout, unfused loss)"]):
        assert modeling_transformer.dropout is module.torch_dropout
        assert not loss.fuses_output_loss(torch.nn.Linear(2, 2, bias=False), torch.zeros(1, 2))
    assert (modeling_transformer.dropout, loss.fuses_output_loss) == shipped


def test_rnn_train_step_script_runs_on_tiny(capsys):
    """bench/rnn_train_step.py times full logits against skip_logits on an attn_rnn preset, and refuses others."""
    module = bench_script("rnn_train_step")
    medians = module.main(["--preset", "rnn-tiny", "--batch_size", "8", "--reps", "1", "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("preset rnn-tiny, 8 sentences")
    assert list(medians) == list(module.VARIANTS) and all(seconds > 0 for seconds in medians.values())
    assert [line.split(" | ")[0].lstrip("| ") for line in lines[3:]] == list(medians)
    with pytest.raises(ValueError, match="has model_type attn_transformer"):
        module.main(["--preset", "tiny", "--reps", "1"])


@pytest.mark.parametrize("preset", ["tiny", "multi30k-transformer"])  # post-LN and pre-LN
def test_decode_step_script_matches_the_models_decoder(preset, capsys, monkeypatch):
    """bench/decode_step.py's static-buffer step computes what the model's decoder does (its run fails otherwise),
    for both layer-norm placements, and the check does fail on a step that differs."""
    module = bench_script("decode_step")
    flags = ["--preset", preset, "--rows", "6", "--steps", "4", "--max_length", "5", "--reps", "1", "--threads", "1"]
    medians = module.main([*flags, "--no_compile"])
    assert list(medians) == ["dynamic cache (generate's)", "static buffers"]
    assert all(seconds > 0 for seconds in medians.values())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"preset {preset}, 6 rows") and len(lines) == 5

    exact = module.static_step
    monkeypatch.setattr(module, "static_step", lambda model, rows: lambda *a: exact(model, rows)(*a) * 1.001)
    with pytest.raises(RuntimeError, match="static buffers: log-probabilities differ"):
        module.main([*flags, "--no_compile"])


def test_decode_step_script_refuses_what_it_cannot_measure():
    module = bench_script("decode_step")
    with pytest.raises(ValueError, match="--steps 9 exceeds --max_length 8"):
        module.main(["--preset", "tiny", "--steps", "9", "--max_length", "8"])
    with pytest.raises(ValueError, match="has model_type attn_rnn"):
        module.main(["--preset", "rnn-tiny", "--steps", "2", "--max_length", "2", "--reps", "1"])


@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
def test_beam_search_script_runs_on_a_tiny_saved_model(model_type, tmp_path, capsys):
    """bench/beam_search.py times ours against transformers' beam search (and Marian for a post-LN Transformer) on
    a saved model, after checking that ours and transformers' translate alike."""
    from test_translate import SENTENCES, save_tiny_model

    module = bench_script("beam_search")
    folder = save_tiny_model(tmp_path / "model", model_type)
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES * 3) + "\n")
    argv = ["--model", str(folder), "--source", str(source), "--batch_size", "4", "--reps", "1", "--threads", "1"]
    medians = module.main([*argv, "--num_beams", "3"])
    out = capsys.readouterr().out
    expected = ["ours", "transformers' beam search"] + (["MarianMTModel"] if model_type == "attn_transformer" else [])
    assert list(medians) == expected and all(seconds > 0 for seconds in medians.values())
    assert f"{len(SENTENCES) * 3} sentences" in out
    assert "| transformers' beam search |" in out and out.count("| yes |") == len(expected) - 1
    assert "rows of closed sentences in transformers' beam search" in out
    if model_type == "attn_rnn":
        assert "MarianMTModel not measured" in out


def test_translated_tokens_stop_at_the_first_end_token():
    import torch

    module = bench_script("beam_search")
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

    module = bench_script("gpu")
    output = tmp_path / "gpu.json"
    report = module.main(["--dry-run", "--output", str(output), "--peak_tflops", "2"])
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
    flags = ["--dry-run", "--parts", "attention", "--attention_presets", "tiny", "--output", str(output)]
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


@pytest.mark.slow
def test_compile_static_quick_run(common, tmp_path):
    """bench/compile_static.py --quick (tiny preset, torch.compile's graph capture without code generation): every
    variant and search measured, and the static-cache variants, compiled or not, give the dynamic cache's ids."""
    report = bench_script("compile_static").main(["--quick", "--output_dir", str(tmp_path)])
    assert json.loads((tmp_path / "compile-static-cpu-quick.json").read_text()) == report
    (result,) = report["results"]
    assert set(result["settings"]) == {"greedy_batch", "greedy_single", "beam4_batch", "beam4_single"}
    for entries in result["settings"].values():
        assert list(entries) == list(common.GENERATION_VARIANTS)
        for entry in entries.values():
            assert entry["same_ids"] is True and entry["tokens_per_s"] > 0 and entry["first_call_s"] > 0
    table = (tmp_path / "compile-static-cpu-quick.md").read_text()
    assert "Command: `python bench/compile_static.py --quick" in table
    assert "| beam4_single | compiled, static cache |" in table


@pytest.mark.slow
def test_export_speed_quick_run(tmp_path):
    """bench/export_speed.py --quick: the four runtimes on the tiny preset; onnxruntime and the compiled model give
    PyTorch's ids for every sentence (CTranslate2 runs its own search: its share is reported, not required)."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("onnxruntime")
    module = bench_script("export_speed")
    report = module.main(["--quick", "--output_dir", str(tmp_path)])
    (result,) = report["results"]
    assert set(result["settings"]) == {"greedy_batch", "beam4_batch", "greedy_single", "beam4_single"}
    for entries in result["settings"].values():
        assert list(entries) == module.RUNTIMES
        assert all(entries[name]["same_ids"] == 1.0 for name in module.RUNTIMES[:3])
        assert all(entry["sentences_per_s"] > 0 and 0 <= entry["same_ids"] <= 1 for entry in entries.values())
    assert result["setup"]["onnxruntime export s"] > 0 and result["setup"]["CTranslate2 export s"] > 0
    assert (
        report["versions"]["onnxruntime"] and "| onnxruntime |" in (tmp_path / "export-speed-cpu-quick.md").read_text()
    )


@pytest.mark.slow
def test_int8_quick_run(tmp_path):
    """bench/int8.py --quick: float32, each engine's int8 copy and CTranslate2 timed with lengths forced both ways
    (each run checks that every output has the forced length), and the quality part on a saved model: every run
    scored, the int8 runs' changes counted against float32."""
    pytest.importorskip("ctranslate2")
    from test_serve import save_model

    module = bench_script("int8")
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
