"""One command for a lent GPU: attention backends agree in bfloat16, training throughput and MFU, generation speed.

    python bench/gpu.py                  # one CUDA GPU, bf16; writes bench/results/gpu-cuda.json
    python bench/gpu.py --dry-run        # every part on the CPU, tiny presets, float32, a few steps (CI)

Parts, in this order; the JSON report is rewritten after each measurement, so a run cut short keeps what it
measured:

1. `attention`: for both model types (`base` and `multi30k-rnn`), the logits of one padded batch (eval mode) with
   bfloat16 weights under each attention implementation the model accepts (`sdpa`, `flash_attention_2`) and under
   eager, against eager with float32 weights. An implementation passes when its largest difference from float32
   eager is at most twice eager's own in bfloat16 plus 1e-2 (float32 in the dry run: eager's own is 0, the allowance
   1e-5): as close to the exact result as eager is. An implementation the model or the machine refuses is reported
   with transformers' own refusal, not run.
2. `train`: `base` and `big` train under bfloat16 autocast (float32 weights and Adam state, what Trainer's `--bf16`
   does), sdpa, the loss on labelled positions only as `attn train` computes it, on length-bucketed batches of
   random ids with realistic lengths (common.sentence_lengths). Target tokens/s, and model FLOPs utilisation:
   FLOPs of the real tokens (FLOP_FORMULA) / median step time / the GPU's dense bf16 peak.
3. `attn_train`: `attn train` itself for `base` and `big` (Trainer, Multi30k EN->DE read from ../shared/data, token
   batches of 25,000 tokens, 200 steps, no evaluation, the recipe's CUDA defaults: bf16, fused AdamW, TF32): target
   tokens/s by Trainer's count, MFU by its `total_flos`, and the settings the run reports.
4. `generate`: greedy and beam 4, forced to the batch's longest reference length (as speed.py does), under bf16
   autocast: target tokens/s and ms per sentence.
5. `compile`: the same generation eager with the dynamic cache against compiled with a static cache
   (`common.GENERATION_VARIANTS`, as bench/compile_static.py on the CPU): greedy search through generate's
   automatic compilation (`compile_config`: CUDA graphs, "reduce-overhead"), beam search through
   `model.forward = torch.compile(...)`; tokens/s, ms per sentence, the first (compiling) call's seconds and
   whether the token ids equal the eager ones. The dry run compiles with torch.compile's "eager" backend (graph
   capture without code generation), which takes seconds instead of minutes on a CPU.

A measurement that raises (say, out of memory) is kept in the report as its error and the others go on. The
command exits with status 1 when an attention implementation that ran disagrees with eager, when none could be
compared, or when a measurement raised.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)
from modeling_attn.training.train import run as run_recipe  # noqa: E402

from modeling_attn.api.presets import load_preset  # noqa: E402
from modeling_attn.cli.train import parse_args as parse_train_args  # noqa: E402
from modeling_attn.flops import FLOP_FORMULA  # noqa: E402

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny presets, float32, a few steps (CI)")
    parser.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS)
    parser.add_argument("--output", type=Path, help="the JSON report (default bench/results/gpu-<device>.json)")
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
        args.output = common.REPO / "bench" / "results" / f"gpu-{'cpu-dry-run' if args.dry_run else 'cuda'}.json"
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
        "flash_attn_installed": installed("flash_attn"),
        "kernels_installed": installed("kernels"),
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


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


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
    seconds = common.interleaved({preset: step}, args.reps)[preset]
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
    output_dir = common.scratch_folder("gpu-attn-train-")
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
            seconds = common.interleaved({name: task}, args.reps)[name]
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
        new_tokens = max(batch.target_lengths)
        for beams, search in ((1, "greedy"), (4, "beam4")):
            entry = result[f"{search}_batch{batch_size}"] = {"new_tokens_per_sentence": new_tokens}
            ids = {}
            for name, variant in common.GENERATION_VARIANTS.items():
                if name == "eager, static cache":
                    continue
                options = {"backend": args.compile_backend} if name.startswith("compiled") else {}
                model = variant.build(reference, **options).to(args.device)
                task = common.generation_task(model, variant, [batch], beams, args.device)  # (eval mode)
                started = time.perf_counter()
                with torch.inference_mode(), common.autocast(args.device):
                    ids[name] = variant.generate(model, batch, beams, new_tokens)
                common.synchronize()
                first_call = time.perf_counter() - started
                seconds = common.interleaved({name: task}, args.reps)[name]
                entry[name] = {
                    "first_call_s": first_call,
                    "seconds": seconds,
                    "target_tokens_per_s": common.median_rate(seconds, new_tokens * batch_size),
                    "ms_per_sentence": 1000 * statistics.median(seconds) / batch_size,
                }
                del model, task
                release(args.device)
            entry["same_ids"] = torch.equal(*ids.values())
    return result


def release(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> dict:
    """Run the parts, rewriting the JSON report after each measurement; return the report."""
    args = parse_args(argv)
    started = time.monotonic()
    peak = args.peak_tflops * 1e12 if args.peak_tflops else common.peak_flops(args.device)
    report: dict = {
        "command": shlex.join(["python", "bench/gpu.py", *(argv if argv is not None else sys.argv[1:])]),
        "dry_run": args.dry_run,
        "machine": common.machine(),
        "device": args.device,
        "cuda": torch.version.cuda,
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if args.device == "cuda" else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "peak_bf16_flops": peak,
        "flop_formula": FLOP_FORMULA,
        "parts": {},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        report["elapsed_s"] = time.monotonic() - started
        args.output.write_text(json.dumps(report, indent=1, default=str))

    def measure(part: str, presets: list[str], run: Callable[[str], dict]) -> None:
        entries = report["parts"].setdefault(part, {"results": []})["results"]
        for preset in presets:
            if time.monotonic() - started > args.max_seconds:
                entries.append({"preset": preset, "skipped": f"--max_seconds {args.max_seconds:g} spent"})
            else:
                common.log(f"[gpu] {part}: {preset}")
                try:
                    entries.append(run(preset))
                except Exception as error:  # noqa: BLE001  (kept in the report; the other measurements go on)
                    entries.append({"preset": preset, "error": "".join(traceback.format_exception(error)[-3:])})
                    release(args.device)
                common.log(f"[gpu] {json.dumps(entries[-1], default=str)[:400]}")
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
    common.log(f"[gpu] wrote {args.output}")
    return report


def failed(report: dict) -> bool:
    """Whether the run should exit with status 1: the attention check failed, or a measurement raised an error."""
    errors = [r for part in report["parts"].values() for r in part["results"] if "error" in r]
    return bool(errors) or not report["parts"].get("attention", {}).get("passed", True)


if __name__ == "__main__":
    sys.exit(1 if failed(main()) else 0)
