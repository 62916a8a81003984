"""Decoding engines: attn_transformer in PyTorch (eager, static cache, compiled), onnxruntime, CTranslate2.

    python -m bench engines --preset small --threads 1 --clock cpu      # all five runtimes
    python -m bench engines --quick       # the tiny preset, one round, torch.compile's "eager" backend (CI)

Runtimes (`--runtimes`), each from the same randomly initialised reference model (float32): "PyTorch eager"
(`generate()` with the dynamic cache); "PyTorch eager, static cache"; "PyTorch compiled, static cache"
(`common.CompiledStatic`: generate's `compile_config` for greedy search, `model.forward = torch.compile(...)` for
beam search); "onnxruntime" (`export_onnx_model`, decoded by `OnnxTranslator`, the model's own search); "CTranslate2"
(`export_ctranslate2`, float32, its own search). Every runtime is forced to the batch's longest reference length on
random ids with Multi30k-like lengths; greedy and beam 4, a batch of `--batch_size` and single sentences.
`harness.first_call_then_rounds`: the first call (compiling) timed alone, "same ids" = the share of sentences whose
ids equal the first runtime's, then interleaved rounds, medians. Exports happen before (their seconds are reported).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from . import common, harness

RUNTIMES = [
    "PyTorch eager",
    "PyTorch eager, static cache",
    "PyTorch compiled, static cache",
    "onnxruntime",
    "CTranslate2",
]
SETTINGS = [("greedy", 1, "batch"), ("beam4", 4, "batch"), ("greedy", 1, "single"), ("beam4", 4, "single")]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench engines", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", nargs="+", default=["small"])
    parser.add_argument("--threads", type=int, default=1, help="threads of every runtime")
    parser.add_argument("--clock", default="wall", choices=list(harness.CLOCKS))
    parser.add_argument("--reps", type=int, default=3, help="timed rounds after the first (compiling) call")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--single_sentences", type=int, default=4, help="sentences translated one at a time")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--runtimes", nargs="+", default=RUNTIMES, choices=RUNTIMES)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="of the PyTorch runtimes")
    parser.add_argument("--quick", action="store_true", help="tiny preset, one round, the 'eager' compile backend")
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/engines-DEVICE)")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.reps, args.batch_size, args.single_sentences, args.backend = ["tiny"], 1, 4, 1, "eager"
    if args.device != "cpu" and {"onnxruntime", "CTranslate2"} & set(args.runtimes):
        parser.error("onnxruntime and CTranslate2 run on the CPU here: leave them out of --runtimes with --device")
    quick = "-quick" if args.quick else ""
    args.output = args.output or harness.RESULTS / f"engines-{args.device}{quick}"
    return args


def generated_rows(ids: torch.Tensor) -> list[list[int]]:
    """generate() rows without the decoder start token (forced lengths: no end token, no padding)."""
    return ids[:, 1:].tolist()


def pytorch_runtimes(reference: torch.nn.Module, args: argparse.Namespace) -> dict[str, Callable]:
    """The PyTorch runtimes of `args.runtimes`: name -> function(batch, beams, new_tokens) -> ids per sentence."""
    runtimes: dict[str, Callable] = {}
    if "PyTorch eager" in args.runtimes:
        eager = common.ours(reference, "sdpa").eval().to(args.device)
        runtimes["PyTorch eager"] = lambda b, beams, n: generated_rows(common.hf_generate(eager, b, beams, n))
    if "PyTorch eager, static cache" in args.runtimes:
        static = common.ours(reference, "sdpa").eval().to(args.device)
        runtimes["PyTorch eager, static cache"] = lambda b, beams, n: generated_rows(
            common.static_generate(static, b, beams, n)
        )
    if "PyTorch compiled, static cache" in args.runtimes:
        compiled = common.CompiledStatic(reference, backend=args.backend).to(args.device)
        runtimes["PyTorch compiled, static cache"] = lambda b, beams, n: generated_rows(compiled.generate(b, beams, n))
    return runtimes


def exported_runtimes(reference: torch.nn.Module, args: argparse.Namespace, setup: dict) -> dict[str, Callable]:
    """onnxruntime and CTranslate2 where `args.runtimes` names them, exported into a scratch folder (seconds in
    `setup`)."""
    runtimes: dict[str, Callable] = {}
    folder = harness.scratch_folder("bench-engines-")
    if "onnxruntime" in args.runtimes:
        from modeling_attn.api.export_onnx import export_onnx_model
        from modeling_attn.api.onnx_generation import OnnxTranslator

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
    return runtimes


def bench_setting(runtimes: dict, batches: list[common.Batch], beams: int, args: argparse.Namespace) -> dict:
    """First calls (compiling, for the compiled runtime) with the ids compared, then interleaved timed rounds."""

    def rows(run: Callable) -> Callable[[], list[list[int]]]:
        return lambda: [row for b in batches for row in run(b, beams, max(b.target_lengths))]

    def task(run: Callable) -> Callable[[], None]:
        def call() -> None:
            with torch.inference_mode():
                rows(run)()

        return call

    def share(output: list, reference: list) -> float:
        return sum(a == b for a, b in zip(output, reference, strict=True)) / len(reference)

    calls = {name: rows(run) for name, run in runtimes.items()}
    tasks = {name: task(run) for name, run in runtimes.items()}
    entries = harness.first_call_then_rounds(calls, tasks, args.reps, args.clock, share)
    sentences = sum(b.input_ids.shape[0] for b in batches)
    tokens = sum(max(b.target_lengths) * b.input_ids.shape[0] for b in batches)
    for entry in entries.values():
        median = statistics.median(entry["seconds"])
        entry.update(
            sentences_per_s=sentences / median, tokens_per_s=tokens / median, ms_per_sentence=1000 * median / sentences
        )
    return entries


def bench_preset(preset: str, args: argparse.Namespace, save: Callable) -> dict:
    reference = common.reference_model(preset, max_positions=256, seed=0).eval()
    vocab = reference.config.vocab_size
    batches = {
        "batch": [b.to(args.device) for b in common.make_batches(1, args.batch_size, vocab, seed=2)],
        "single": [b.to(args.device) for b in common.make_batches(args.single_sentences, 1, vocab, seed=3)],
    }
    result: dict = {"preset": preset, "parameters": common.num_parameters(reference), "setup": {}, "settings": {}}
    runtimes = pytorch_runtimes(reference, args) | exported_runtimes(reference, args, result["setup"])
    runtimes = {name: runtimes[name] for name in args.runtimes}  # in the order asked: the first is the reference
    for search, beams, size in SETTINGS:
        harness.log(f"[{preset}] {search}, {size}")
        result["settings"][f"{search}_{size}"] = bench_setting(runtimes, batches[size], beams, args)
        save(result)
    return result


def markdown(report: dict) -> str:
    lines = [
        f"{report['threads']} thread(s) per runtime; {report['clock']} clock; compile backend {report['backend']}. "
        "Sentences/s (median round); same ids: the share of sentences whose ids equal the first runtime's "
        "(the lowest over the settings); compile s: the first call of the compiled runtime (compiling, one run), "
        "summed over the settings.",
        "",
    ]
    for result in report["results"]:
        settings = list(result["settings"])
        lines += [f"### preset `{result['preset']}` ({result['parameters']:,} parameters), sentences/s", ""]
        lines += [
            "| runtime | " + " | ".join(settings) + " | same ids | compile s |",
            "| --- |" + " ---: |" * len(settings) + " --- | ---: |",
        ]
        for name in result["settings"][settings[0]]:
            entries = [result["settings"][s][name] for s in settings]
            cells = [f"{entry['sentences_per_s']:,.1f}" for entry in entries]
            same = min(entry["same_ids"] for entry in entries)
            compile_s = f"{sum(e['first_call_s'] for e in entries):.1f}" if "compiled" in name else ""
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {same:.0%} | {compile_s} |")
        setup = ", ".join(f"{key} {value:.1f}" for key, value in result["setup"].items())
        lines += ["", f"Set-up: {setup}." if setup else "", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = {"device": args.device, "threads": args.threads, "clock": args.clock, "backend": args.backend}
    report = harness.envelope(__name__, argv, ("onnxruntime", "ctranslate2"), **settings, results=[])
    return harness.run_presets(
        report, args.output, args.preset, lambda preset, save: bench_preset(preset, args, save), markdown
    )
