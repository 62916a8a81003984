"""One attn_transformer in four runtimes, side by side, greedy and beam 4, on the CPU.

The runtimes: PyTorch eager, PyTorch compiled with a static cache, onnxruntime (the ONNX export) and CTranslate2
(its export).

    python bench/export_speed.py --preset small base --threads 1 --clock cpu
    python bench/export_speed.py --quick      # the tiny preset, one round, torch.compile's "eager" backend (CI)

Runtimes, each from the same randomly initialised reference model (float32):
- "PyTorch eager": `generate()` with the dynamic cache;
- "PyTorch compiled, static cache": `common.CompiledStatic` (generate's `compile_config` for greedy search,
  `model.forward = torch.compile(...)` for beam search);
- "onnxruntime": `modeling_attn.api.export_onnx` (encoder + decoder-with-past graphs), decoded by
  `modeling_attn.api.onnx_generation.OnnxTranslator` (the model's own search around onnxruntime's forward passes);
- "CTranslate2": `modeling_attn.api.export_ctranslate2` (float32), CTranslate2's own search.

As in speed.py, every runtime is forced to the batch's longest reference length (`min_new_tokens =
max_new_tokens`; CTranslate2: `min/max_decoding_length`) on random ids with Multi30k-like lengths, so that all
produce the same number of tokens; a batch of 32 sentences and single sentences; interleaved rounds, medians.
Sentences per second; "same ids": the share of sentences whose token ids equal PyTorch eager's. Exports and
compilation happen before the timed rounds (their seconds are reported).

Writes bench/results/export-speed-<device>.{json,md} (machine, versions, command).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)

from modeling_attn.api.export_onnx import export_onnx_model  # noqa: E402
from modeling_attn.api.onnx_generation import OnnxTranslator  # noqa: E402

RUNTIMES = ["PyTorch eager", "PyTorch compiled, static cache", "onnxruntime", "CTranslate2"]
SETTINGS = [("greedy", 1, "batch"), ("beam4", 4, "batch"), ("greedy", 1, "single"), ("beam4", 4, "single")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", nargs="+", default=["small"])
    parser.add_argument("--threads", type=int, default=1, help="threads of every runtime")
    parser.add_argument("--clock", default="wall", choices=list(common.CLOCKS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--single_sentences", type=int, default=4, help="sentences translated one at a time")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--runtimes", nargs="+", default=RUNTIMES, choices=RUNTIMES)
    parser.add_argument("--quick", action="store_true", help="tiny preset, one round, the 'eager' compile backend")
    parser.add_argument("--output_dir", type=Path, default=common.REPO / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.reps, args.batch_size, args.single_sentences, args.backend = ["tiny"], 1, 4, 1, "eager"
    return args


def generated_rows(ids: torch.Tensor) -> list[list[int]]:
    """generate() rows without the decoder start token (forced lengths: no end token, no padding)."""
    return ids[:, 1:].tolist()


def build_runtimes(reference: torch.nn.Module, args: argparse.Namespace, folder: Path) -> tuple[dict, dict]:
    """name -> function(batch, beams, new_tokens) -> list of generated ids per sentence; and the set-up seconds."""
    runtimes: dict[str, Callable] = {}
    setup: dict[str, float] = {}
    if "PyTorch eager" in args.runtimes:
        eager = common.ours(reference, "sdpa").eval()
        runtimes["PyTorch eager"] = lambda b, beams, n: generated_rows(common.hf_generate(eager, b, beams, n))
    if "PyTorch compiled, static cache" in args.runtimes:
        compiled = common.CompiledStatic(reference, backend=args.backend)
        runtimes["PyTorch compiled, static cache"] = lambda b, beams, n: generated_rows(compiled.generate(b, beams, n))
    if "onnxruntime" in args.runtimes:
        started = time.perf_counter()
        export_onnx_model(common.ours(reference, "sdpa").eval(), folder / "onnx")
        setup["onnxruntime export s"] = time.perf_counter() - started
        onnx = OnnxTranslator(folder / "onnx", threads=args.threads)

        def onnx_generate(b: common.Batch, beams: int, n: int) -> list[list[int]]:
            settings = dict(num_beams=beams, min_new_tokens=n, max_new_tokens=n)
            return generated_rows(onnx.generate(b.input_ids, b.attention_mask, **settings))

        runtimes["onnxruntime"] = onnx_generate
    if "CTranslate2" in args.runtimes:
        from modeling_attn.api.export_ctranslate2 import CTranslate2Translator, export_ctranslate2

        started = time.perf_counter()
        export_ctranslate2(reference, folder / "ct2", quantization="float32")
        setup["CTranslate2 export s"] = time.perf_counter() - started
        ct2 = CTranslate2Translator(folder / "ct2", inter_threads=1, intra_threads=args.threads)

        def ct2_generate(b: common.Batch, beams: int, n: int) -> list[list[int]]:
            sources = [row[mask.bool()].tolist() for row, mask in zip(b.input_ids, b.attention_mask, strict=True)]
            return ct2.translate_ids(sources, beam_size=beams, min_decoding_length=n, max_decoding_length=n)

        runtimes["CTranslate2"] = ct2_generate
    return runtimes, setup


def bench_setting(runtimes: dict, batches: list[common.Batch], beams: int, args: argparse.Namespace) -> dict:
    """First calls (compiling, for the compiled runtime) with the ids compared, then interleaved timed rounds."""
    entries: dict = {}
    reference_rows = None
    for name, run in runtimes.items():
        started = time.perf_counter()
        with torch.inference_mode():
            rows = [row for b in batches for row in run(b, beams, max(b.target_lengths))]
        entries[name] = {"first_call_s": time.perf_counter() - started}
        reference_rows = rows if reference_rows is None else reference_rows
        entries[name]["same_ids"] = sum(a == b for a, b in zip(rows, reference_rows, strict=True)) / len(rows)

    def task(run: Callable) -> Callable[[], None]:
        def call() -> None:
            with torch.inference_mode():
                for b in batches:
                    run(b, beams, max(b.target_lengths))

        return call

    sentences = sum(b.input_ids.shape[0] for b in batches)
    tasks = {name: task(run) for name, run in runtimes.items()}
    for name, seconds in common.interleaved(tasks, args.reps, common.CLOCKS[args.clock]).items():
        entries[name].update(seconds=seconds, sentences_per_s=sentences / statistics.median(seconds))
    return entries


def bench_preset(preset: str, args: argparse.Namespace, save) -> dict:
    reference = common.reference_model(preset, max_positions=256, seed=0).eval()
    vocab = reference.config.vocab_size
    batches = {
        "batch": common.make_batches(1, args.batch_size, vocab, seed=2),
        "single": common.make_batches(args.single_sentences, 1, vocab, seed=3),
    }
    result: dict = {"preset": preset, "parameters": common.num_parameters(reference), "settings": {}}
    with tempfile.TemporaryDirectory(prefix="bench-export-") as folder:
        runtimes, result["setup"] = build_runtimes(reference, args, Path(folder))
        for search, beams, size in SETTINGS:
            common.log(f"[{preset}] {search}, {size}")
            result["settings"][f"{search}_{size}"] = bench_setting(runtimes, batches[size], beams, args)
            common.log(f"[{preset}] {json.dumps(result['settings'][f'{search}_{size}'], default=str)[:300]}")
            save(result)
    return result


def markdown(report: dict) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in report["versions"].items())
    lines = [
        f"Machine: {report['machine']}; {versions}; {report['threads']} thread(s) per runtime; {report['clock']} "
        f"clock; compile backend {report['backend']}.",
        f"Command: `{report['command']}`",
        "",
    ]
    for result in report["results"]:
        settings = list(result["settings"])
        lines += [f"### preset `{result['preset']}` ({result['parameters']:,} parameters), sentences/s", ""]
        lines += [
            "| runtime | " + " | ".join(settings) + " | same ids |",
            "| --- |" + " ---: |" * len(settings) + " --- |",
        ]
        for name in result["settings"][settings[0]]:
            cells = [f"{result['settings'][s][name]['sentences_per_s']:,.1f}" for s in settings]
            same = min(result["settings"][s][name]["same_ids"] for s in settings)
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {same:.0%} |")
        setup = ", ".join(f"{key} {value:.1f}" for key, value in result["setup"].items())
        lines += ["", f"Set-up: {setup}." if setup else "", ""]
    return "\n".join(lines)


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    report = {
        "machine": common.machine(),
        "threads": args.threads,
        "clock": args.clock,
        "backend": args.backend,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": installed("onnxruntime"),
            "ctranslate2": installed("ctranslate2"),
        },
        "command": shlex.join(["python", "bench/export_speed.py", *(argv if argv is not None else sys.argv[1:])]),
        "results": [],
    }
    stem = args.output_dir / f"export-speed-cpu{'-quick' if args.quick else ''}"
    return common.run_presets(report, stem, args, bench_preset, markdown)


if __name__ == "__main__":
    main()
