"""Eager decoding with the dynamic cache against compiled decoding with a static cache (attn_transformer, CPU).

    python bench/compile_static.py --preset small base --threads 1 --clock cpu
    python bench/compile_static.py --quick      # the tiny preset, one round, torch.compile's "eager" backend (CI)

Variants (`common.GENERATION_VARIANTS`), each built from the same randomly initialised reference model:
- "eager, dynamic cache": `generate()` as it is by default;
- "eager, static cache": `generate(cache_implementation="static")`, not compiled;
- "compiled, static cache": transformers' documented routes to compiled decoding: greedy search through generate's
  automatic compilation (`generation_config.compile_config`, fullgraph, inductor), beam search through
  `model.forward = torch.compile(model.forward, fullgraph=True)` (transformers compiles greedy search and sampling
  only; both run transformers' beam search, as ours hands static caches over to it).

As in speed.py, generation is forced to the batch's longest reference length (untrained weights stop at random
places) on batches of random ids with Multi30k-like lengths (common.make_batches), greedy and beam 4, a batch of
32 sentences and single sentences; rounds interleaved (every variant once per round, rotating order), medians.
"compile s" is the first call (compiling and one run), outside the timed rounds. "same ids" compares each
variant's token ids with the dynamic cache's (with random weights, near-ties may in principle round differently).

Writes bench/results/compile-static-<device>.{json,md} (machine, versions, command).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)

SETTINGS = [("greedy", 1, "batch"), ("greedy", 1, "single"), ("beam4", 4, "batch"), ("beam4", 4, "single")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", nargs="+", default=["small", "base"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", default="wall", choices=list(common.CLOCKS))
    parser.add_argument("--reps", type=int, default=3, help="timed rounds after the first (compiling) call")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--single_sentences", type=int, default=2, help="sentences translated one at a time")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="tiny preset, one round, the 'eager' compile backend")
    parser.add_argument("--output_dir", type=Path, default=common.REPO / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.reps, args.batch_size, args.single_sentences, args.backend = ["tiny"], 1, 4, 1, "eager"
    return args


def bench_setting(models: dict, batches: list[common.Batch], beams: int, args: argparse.Namespace) -> dict:
    """One search on `batches`: compile seconds, same ids as the dynamic cache, then interleaved timed rounds."""
    variants = common.GENERATION_VARIANTS
    tasks = {  # (building a task puts its model in eval mode)
        name: common.generation_task(model, variants[name], batches, beams, args.device)
        for name, model in models.items()
    }
    entries: dict = {}
    reference_ids = None
    for name, model in models.items():
        start = time.perf_counter()
        with torch.inference_mode():
            ids = [variants[name].generate(model, b, beams, max(b.target_lengths)) for b in batches]
        entries[name] = {"first_call_s": time.perf_counter() - start}
        reference_ids = ids if reference_ids is None else reference_ids
        entries[name]["same_ids"] = all(torch.equal(a, b) for a, b in zip(ids, reference_ids, strict=True))
    sentences = sum(b.input_ids.shape[0] for b in batches)
    tokens = sum(max(b.target_lengths) * b.input_ids.shape[0] for b in batches)
    for name, seconds in common.interleaved(tasks, args.reps, common.CLOCKS[args.clock]).items():
        entries[name].update(
            seconds=seconds,
            tokens_per_s=common.median_rate(seconds, tokens),
            ms_per_sentence=1000 * statistics.median(seconds) / sentences,
        )
    return entries


def bench_preset(preset: str, args: argparse.Namespace, save) -> dict:
    reference = common.reference_model(preset, max_positions=256, seed=0)
    vocab = reference.config.vocab_size
    batches = {
        "batch": [b.to(args.device) for b in common.make_batches(1, args.batch_size, vocab, seed=2)],
        "single": [b.to(args.device) for b in common.make_batches(args.single_sentences, 1, vocab, seed=3)],
    }
    result: dict = {"preset": preset, "parameters": common.num_parameters(reference), "settings": {}}
    for search, beams, size in SETTINGS:
        models = {}  # fresh models per setting: a compiled one is compiled for this setting's shapes only
        for name, variant in common.GENERATION_VARIANTS.items():
            if name.startswith("compiled"):
                models[name] = variant.build(reference, backend=args.backend).to(args.device)
            else:
                models[name] = variant.build(reference).to(args.device)
        common.log(f"[{preset}] {search}, {size}")
        result["settings"][f"{search}_{size}"] = bench_setting(models, batches[size], beams, args)
        common.log(f"[{preset}] {json.dumps(result['settings'][f'{search}_{size}'], default=str)[:300]}")
        save(result)
    return result


def markdown(report: dict) -> str:
    lines = [
        f"Machine: {report['machine']}; torch {report['torch']}, transformers {report['transformers']}, python "
        f"{report['python']}; {report['threads']} threads; {report['clock']} clock; compile backend "
        f"{report['backend']}.",
        f"Command: `{report['command']}`",
        "",
        "Speed-up: against eager decoding with the dynamic cache (ms/sentence). compile s: wall-clock seconds of the "
        "variant's first call (compiling, then one run; a setting may reuse the graphs compiled for the one before).",
        "",
    ]
    for result in report["results"]:
        lines += [f"### preset `{result['preset']}` ({result['parameters']:,} parameters)", ""]
        lines += ["| search | variant | tok/s | ms/sentence | speed-up | compile s | same ids |"]
        lines += ["| --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for setting, entries in result["settings"].items():
            baseline = entries["eager, dynamic cache"]["ms_per_sentence"]
            for name, entry in entries.items():
                compile_s = f"{entry['first_call_s']:.1f}" if name.startswith("compiled") else ""
                lines.append(
                    f"| {setting} | {name} | {entry['tokens_per_s']:,.0f} | {entry['ms_per_sentence']:.1f} | "
                    f"{baseline / entry['ms_per_sentence']:.2f}x | {compile_s} | {entry['same_ids']} |"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    report = {
        "machine": common.machine(),
        "device": args.device,
        "threads": args.threads,
        "clock": args.clock,
        "backend": args.backend,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": shlex.join(["python", "bench/compile_static.py", *(argv if argv is not None else sys.argv[1:])]),
        "results": [],
    }
    stem = args.output_dir / f"compile-static-{args.device}{'-quick' if args.quick else ''}"
    return common.run_presets(report, stem, args, bench_preset, markdown)


if __name__ == "__main__":
    main()
