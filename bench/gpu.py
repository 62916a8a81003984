"""One command for a lent GPU: attention backends agree in bfloat16, training throughput and MFU, generation speed.

    python -m bench gpu                  # one CUDA GPU, bf16; writes bench/results/gpu-cuda.{json,md}
    python -m bench gpu --dry-run        # every part on the CPU, tiny presets, float32, a few steps (CI)

Parts, in this order (bench/README.md, "gpu", says what each measures): `attention` (eager, sdpa and flash attention
in bfloat16 against float32 eager, both model types), `train` (bf16 autocast training steps: tokens/s and MFU by
FLOP_FORMULA), `attn_train` (`attn train` itself: Trainer's throughput and MFU), `generate` (greedy and beam 4,
forced lengths) and `compile` (eager dynamic-cache against compiled static-cache decoding, through
`harness.first_call_then_rounds`). The report is rewritten after each measurement, so a run cut short keeps what it
measured; a measurement that raises is kept as its error and the others go on. `failed(report)`: the exit status is
1 when an attention implementation that ran disagrees with eager, when none could be compared, or when a measurement
raised.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from modeling_attn.training.train import run as run_recipe

from modeling_attn.api.presets import load_preset
from modeling_attn.cli.train import parse_args as parse_train_args
from modeling_attn.flops import FLOP_FORMULA

from . import common, harness

# what `attn train` reports it trained with (its train_results.json: train_<setting>)
SETTINGS = ("device", "mixed_precision", "optim", "tf32", "torch_compile")

PARTS = ["attention", "train", "attn_train", "generate", "compile"]
BACKENDS = ["sdpa", "flash_attention_2"]
# Added to the allowance of the attention check: transformers' absolute tolerance for its eager-vs-sdpa tests in
# bfloat16, this repo's eager == sdpa tolerance in float32 (there eager's own error is 0 by construction).
FLOORS = {torch.bfloat16: 1e-2, torch.float32: 1e-5}
GPU_RUN = {
    "attention_presets": ["base", "multi30k-rnn"],
    "train_presets": ["base", "big"],
    "generate_presets": ["base", "big"],
    "train_batch_size": 512,
    "train_batches": 4,
    "attn_train_presets": ["base", "big"],
    "attn_train_steps": 200,
    "attn_train_tokens": 25_000,
    "generate_batch_sizes": [32, 256],
    "compile_presets": ["base"],
    "compile_batch_sizes": [1, 32],
    "compile_backend": "inductor",
    "reps": 5,
}
DRY_RUN = {
    "attention_presets": ["tiny", "rnn-tiny"],
    "train_presets": ["tiny"],
    "generate_presets": ["tiny"],
    "train_batch_size": 8,
    "train_batches": 2,
    "attn_train_presets": ["tiny"],
    "attn_train_steps": 4,
    "attn_train_tokens": 300,
    "generate_batch_sizes": [4],
    "compile_presets": ["tiny"],
    "compile_batch_sizes": [4],
    "compile_backend": "eager",
    "reps": 2,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny presets, float32, a few steps (CI)")
    parser.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS)
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/gpu-<device>)")
    parser.add_argument("--attention_presets", nargs="+", help="default: base multi30k-rnn (dry run: the tiny ones)")
    parser.add_argument("--train_presets", nargs="+", help="default: base big (dry run: tiny)")
    parser.add_argument("--generate_presets", nargs="+", help="default: base big (dry run: tiny)")
    parser.add_argument("--train_batch_size", type=int, help="sentences per training batch (default 512; dry run 8)")
    parser.add_argument("--train_batches", type=int, help="training steps per timed round (default 4; dry run 2)")
    parser.add_argument("--attn_train_presets", nargs="+", help="attn train itself: default base big (dry run: tiny)")
    parser.add_argument("--attn_train_steps", type=int, help="attn train's --max_steps (default 200; dry run 4)")
    parser.add_argument("--attn_train_tokens", type=int, help="its --max_tokens_per_batch (default 25000; dry 300)")
    parser.add_argument("--generate_batch_sizes", type=int, nargs="+", help="default: 32 256 (dry run: 4)")
    parser.add_argument("--compile_presets", nargs="+", help="default: base (dry run: tiny)")
    parser.add_argument("--compile_batch_sizes", type=int, nargs="+", help="default: 1 32 (dry run: 4)")
    parser.add_argument("--compile_backend", help="torch.compile backend (default inductor; dry run: eager)")
    parser.add_argument("--reps", type=int, help="timed rounds after one warm-up round, median (default 5; dry 2)")
    parser.add_argument("--peak_tflops", type=float, help="dense bf16 peak for MFU (default: by GPU name)")
    parser.add_argument("--max_seconds", type=float, default=540, help="later measurements are skipped after this")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device, args.dtype = "cpu", torch.float32
        defaults = DRY_RUN
    elif torch.cuda.is_available():
        args.device, args.dtype = "cuda", torch.bfloat16
        defaults = GPU_RUN
    else:
        parser.error("no CUDA device: run on a GPU, or pass --dry-run to exercise every part on the CPU")
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for flag in ("attention_presets", "train_presets", "attn_train_presets", "generate_presets", "compile_presets"):
        for preset in getattr(args, flag):
            try:
                model_type = load_preset(preset).model_type
            except ValueError as error:
                parser.error(f"--{flag}: {error}")
            if flag != "attention_presets" and model_type != "attn_transformer":
                parser.error(
                    f"--{flag} {preset}: model_type {model_type}; training and generation time attn_transformer"
                )
    if args.output is None:
        args.output = harness.RESULTS / f"gpu-{'cpu-dry-run' if args.dry_run else 'cuda'}"
    return args


def build(preset: str, seed: int) -> torch.nn.Module:
    """A freshly initialised model of `preset`, float32 on the CPU, with bench/common.py's special token ids."""
    config = load_preset(preset)
    if config.model_type == "attn_transformer":
        return common.reference_model(preset, max_positions=1024, seed=seed)
    torch.manual_seed(seed)
    special = dict(pad_token_id=common.PAD, bos_token_id=common.BOS, eos_token_id=common.EOS)
    config = load_preset(preset, **special, decoder_start_token_id=common.BOS)
    return transformers.AutoModelForSeq2SeqLM.from_config(config)


def target_logits(model: torch.nn.Module, batch: common.Batch) -> torch.Tensor:
    """Float32 logits (N, V) of the batch's real target positions (labels not -100), eval mode, no gradients."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).logits
    return logits[batch.labels != -100].float()


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def attention_check(preset: str, args: argparse.Namespace) -> dict:
    """Each attention implementation with weights in `args.dtype` against float32 eager, on one padded batch: it
    passes when its logits are no further from float32 eager's than twice eager's own in that dtype, plus a floor."""
    model = build(preset, args.seed).eval()
    batch = common.make_batches(1, 16, model.config.vocab_size, seed=4)[0].to(args.device)
    model.set_attn_implementation("eager")
    exact = target_logits(model.to(args.device), batch)
    model.to(args.dtype)
    eager = target_logits(model, batch)
    eager_error = max_abs(eager, exact)
    floor = FLOORS[args.dtype]
    result = {
        "preset": preset,
        "model_type": model.config.model_type,
        "dtype": str(args.dtype).removeprefix("torch."),
        "positions": eager.shape[0],
        "max_abs_logit": exact.abs().max().item(),
        "eager_max_abs_error": eager_error,  # eager in this dtype against eager in float32 (0 in float32)
        "tolerance": 2 * eager_error + floor,
        "tolerance_rule": f"max |logits - float32 eager logits| <= 2 x eager_max_abs_error + {floor:g}",
        "declares": {
            "sdpa": bool(getattr(model, "_supports_sdpa", False)),
            "flash_attention_2": bool(getattr(model, "_supports_flash_attn", False)),
        },
        "flash_attn_installed": harness.installed("flash_attn"),
        "kernels_installed": harness.installed("kernels"),
        "backends": {},
    }
    for backend in BACKENDS:
        try:
            model.set_attn_implementation(backend)
        except (ValueError, ImportError) as refusal:  # transformers' own check of the model and the machine
            result["backends"][backend] = {"ran": False, "refused": str(refusal).split("\n")[0]}
            continue
        logits = target_logits(model, batch)
        result["backends"][backend] = {
            "ran": True,
            "max_abs_error": max_abs(logits, exact),
            "max_abs_difference_from_eager": max_abs(logits, eager),
            "mean_abs_difference_from_eager": (logits - eager).abs().mean().item(),
            "passed": max_abs(logits, exact) <= result["tolerance"],
        }
    ran = [entry["passed"] for entry in result["backends"].values() if entry["ran"]]
    result["passed"] = all(ran) if ran else None  # None: no implementation besides eager to compare
    return result


def bucketed_batches(count: int, batch_size: int, vocab_size: int, seed: int) -> list[common.Batch]:
    """Batches of sentences of similar lengths (sorted, then cut), as `attn train`'s token batching makes them."""
    lengths = sorted(common.sentence_lengths(count * batch_size, seed))
    generator = torch.Generator().manual_seed(seed)
    return [
        common.make_batch(lengths[i : i + batch_size], vocab_size, generator)
        for i in range(0, len(lengths), batch_size)
    ]


def train(preset: str, args: argparse.Namespace, peak: float | None) -> dict:
    """Training throughput and MFU of one preset."""
    reference = build(preset, args.seed)
    config = reference.config
    peer = common.PEERS["attn_transformer"]  # sdpa, loss on labelled positions (as `attn train`)
    model = peer.build(reference).to(args.device)
    del reference
    batches = bucketed_batches(args.train_batches, args.train_batch_size, config.vocab_size, seed=1)
    on_device = [b.to(args.device) for b in batches]
    bf16 = args.device == "cuda"
    step = common.training_task(model, peer, on_device, args.device, bf16)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = harness.interleaved({preset: step}, args.reps)[preset]
    median = statistics.median(seconds)
    target_tokens = sum(b.target_tokens for b in batches)
    flops = sum(common.training_flops(config, b) for b in batches)
    model.eval()
    with torch.no_grad(), common.autocast(args.device, bf16):
        loss = peer.loss(model, on_device[0]).item()
    result = {
        "preset": preset,
        "parameters": common.num_parameters(model),
        "precision": "bf16 autocast, float32 weights" if bf16 else "float32",
        "steps_per_round": len(batches),
        "sentences_per_step": args.train_batch_size,
        "target_tokens_per_round": target_tokens,
        "source_tokens_per_round": sum(int(b.attention_mask.sum()) for b in batches),
        "padding_fraction": 1 - target_tokens / sum(b.labels.numel() for b in batches),
        "seconds_per_round": seconds,
        "target_tokens_per_s": target_tokens / median,
        "model_tflops_per_s": flops / median / 1e12,
        "mfu": flops / median / peak if peak else None,
        "loss_after": loss,
    }
    if args.device == "cuda":
        result["peak_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20  # weights, Adam, activations
    del model, step
    release(args.device)
    return result


def attn_train(preset: str, args: argparse.Namespace, peak: float | None) -> dict:
    """`attn train` itself, in this process: Trainer, the recipe's token batches and its CUDA defaults, on Multi30k
    EN->DE (the dry run: the embedded dates task). Target tokens/s are Trainer's count of the steps' real target
    tokens over its train_runtime (the first steps, their allocations and a fresh BPE vocabulary's caching
    included); MFU is Trainer's `total_flos` (the project's formula) over the same time and the peak."""
    output_dir = harness.scratch_folder("gpu-attn-train-")
    flags = ["--preset", preset, "--max_steps", str(args.attn_train_steps)]
    flags += ["--max_tokens_per_batch", str(args.attn_train_tokens), "--eval_strategy", "no", "--save_strategy", "no"]
    flags += ["--do_eval", "false", "--do_predict", "false", "--report_to", "none", "--disable_tqdm", "true"]
    if args.dry_run:
        flags += ["--vocab_size", "200", "--max_train_samples", "64", "--warmup_steps", "2"]
    else:
        flags += [
            "--data",
            str(common.MULTI30K),
            "--source_lang",
            "en",
            "--target_lang",
            "de",
            "--vocab_size",
            "10000",
        ]
    started = time.perf_counter()
    recipe, training_args = parse_train_args([*flags, "--output_dir", str(output_dir)])
    run_recipe(recipe, training_args)
    results = json.loads((output_dir / "all_results.json").read_text())
    total_flos = json.loads((output_dir / "trainer_state.json").read_text())["total_flos"]
    runtime = results["train_runtime"]
    return {
        "preset": preset,
        "command": shlex.join(["attn", "train", *flags, "--output_dir", "OUT"]),
        "settings": {
            key[6:]: value for key, value in results.items() if key.startswith("train_") and key[6:] in SETTINGS
        },
        "steps": args.attn_train_steps,
        "train_runtime_s": runtime,
        "wall_s": time.perf_counter() - started,
        "target_tokens_per_s": results["train_target_tokens_per_second"],
        "model_tflops_per_s": total_flos / runtime / 1e12,
        "mfu": total_flos / runtime / peak if peak else None,
        "train_loss": results["train_loss"],
    }


def generate(preset: str, args: argparse.Namespace) -> dict:
    """Greedy and beam-4 generation speed of one preset, at each batch size."""
    reference = build(preset, args.seed)
    peer = common.PEERS["attn_transformer"]
    model = peer.build(reference).to(args.device)
    del reference
    result: dict = {"preset": preset, "precision": "bf16 autocast" if args.device == "cuda" else "float32"}
    for batch_size in args.generate_batch_sizes:
        batch = common.make_batches(1, batch_size, model.config.vocab_size, seed=2)[0]
        tokens = max(batch.target_lengths) * batch_size  # every sentence forced to the longest length
        on_device = [batch.to(args.device)]
        for beams, name in ((1, "greedy"), (4, "beam4")):
            task = common.generation_task(model, peer, on_device, beams, args.device)
            seconds = harness.interleaved({name: task}, args.reps)[name]
            result[f"{name}_batch{batch_size}"] = {
                "new_tokens_per_sentence": max(batch.target_lengths),
                "seconds": seconds,
                "target_tokens_per_s": common.median_rate(seconds, tokens),
                "ms_per_sentence": 1000 * statistics.median(seconds) / batch_size,
            }
    del model
    release(args.device)
    return result


def compile_generate(preset: str, args: argparse.Namespace) -> dict:
    """Eager decoding with the dynamic cache against compiled decoding with a static cache, greedy and beam 4, at
    each batch size (bf16 autocast on the GPU, as `generate`)."""
    reference = build(preset, args.seed)
    result: dict = {"preset": preset, "backend": args.compile_backend}
    for batch_size in args.compile_batch_sizes:
        batch = common.make_batches(1, batch_size, reference.config.vocab_size, seed=2)[0].to(args.device)
        for beams, search in ((1, "greedy"), (4, "beam4")):
            result[f"{search}_batch{batch_size}"] = compile_setting(reference, batch, beams, args)
            release(args.device)
    return result


def compile_setting(reference: torch.nn.Module, batch: common.Batch, beams: int, args: argparse.Namespace) -> dict:
    """One search of `compile_generate`: each variant's first (compiling) call and its ids, then interleaved rounds."""
    new_tokens, batch_size = max(batch.target_lengths), batch.input_ids.shape[0]
    variants = {name: common.GENERATION_VARIANTS[name] for name in ("eager, dynamic cache", "compiled, static cache")}
    models = {
        name: variant.build(reference, **({"backend": args.compile_backend} if name.startswith("compiled") else {}))
        for name, variant in variants.items()
    }
    models = {name: model.to(args.device) for name, model in models.items()}
    tasks = {  # (building a task puts its model in eval mode)
        name: common.generation_task(models[name], variant, [batch], beams, args.device)
        for name, variant in variants.items()
    }

    def call(name: str) -> Callable[[], torch.Tensor]:
        def generate() -> torch.Tensor:
            with common.autocast(args.device):
                return variants[name].generate(models[name], batch, beams, new_tokens)

        return generate

    timed = harness.first_call_then_rounds(
        {name: call(name) for name in variants}, tasks, args.reps, "wall", torch.equal
    )
    entry: dict = {"new_tokens_per_sentence": new_tokens}
    for name, measured in timed.items():
        entry[name] = {
            "first_call_s": measured["first_call_s"],
            "seconds": measured["seconds"],
            "target_tokens_per_s": common.median_rate(measured["seconds"], new_tokens * batch_size),
            "ms_per_sentence": 1000 * statistics.median(measured["seconds"]) / batch_size,
        }
    entry["same_ids"] = all(measured["same_ids"] for measured in timed.values())
    return entry


def release(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def markdown(report: dict) -> str:
    """Each part's entries, one line each (the JSON beside it holds every number)."""
    lines = [f"Device {report['device']}, dry run: {report['dry_run']}; {report['elapsed_s']:.0f} s.", ""]
    for part, entries in report["parts"].items():
        lines += [f"### {part}", ""] + [f"- `{json.dumps(entry, default=str)[:400]}`" for entry in entries["results"]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    """Run the parts, rewriting the report after each measurement; return the report."""
    args = parse_args(argv)
    started = time.monotonic()
    peak = args.peak_tflops * 1e12 if args.peak_tflops else common.peak_flops(args.device)
    report: dict = harness.envelope(
        __name__,
        argv,
        dry_run=args.dry_run,
        device=args.device,
        cuda=torch.version.cuda,
        gpu_memory_gib=torch.cuda.get_device_properties(0).total_memory / 2**30 if args.device == "cuda" else None,
        peak_bf16_flops=peak,
        flop_formula=FLOP_FORMULA,
        parts={},
    )

    def save() -> None:
        report["elapsed_s"] = time.monotonic() - started
        harness.write_results(args.output, report, markdown(report), quiet=True)

    def measure(part: str, presets: list[str], run: Callable[[str], dict]) -> None:
        entries = report["parts"].setdefault(part, {"results": []})["results"]
        for preset in presets:
            if time.monotonic() - started > args.max_seconds:
                entries.append({"preset": preset, "skipped": f"--max_seconds {args.max_seconds:g} spent"})
            else:
                harness.log(f"[gpu] {part}: {preset}")
                try:
                    entries.append(run(preset))
                except Exception as error:  # noqa: BLE001  (kept in the report; the other measurements go on)
                    entries.append({"preset": preset, "error": "".join(traceback.format_exception(error)[-3:])})
                    release(args.device)
                harness.log(f"[gpu] {json.dumps(entries[-1], default=str)[:400]}")
            save()

    if "attention" in args.parts:
        measure("attention", args.attention_presets, lambda preset: attention_check(preset, args))
        compared = [r for r in report["parts"]["attention"]["results"] if r.get("passed") is not None]
        report["parts"]["attention"]["passed"] = bool(compared) and all(r["passed"] for r in compared)
        save()
    if "train" in args.parts:
        measure("train", args.train_presets, lambda preset: train(preset, args, peak))
    if "attn_train" in args.parts:
        measure("attn_train", args.attn_train_presets, lambda preset: attn_train(preset, args, peak))
    if "generate" in args.parts:
        measure("generate", args.generate_presets, lambda preset: generate(preset, args))
    if "compile" in args.parts:
        measure("compile", args.compile_presets, lambda preset: compile_generate(preset, args))
    harness.log(f"[gpu] wrote {args.output}")
    return report


def failed(report: dict) -> bool:
    """Whether the run should exit with status 1: the attention check failed, or a measurement raised an error."""
    errors = [r for part in report["parts"].values() for r in part["results"] if "error" in r]
    return bool(errors) or not report["parts"].get("attention", {}).get("passed", True)
