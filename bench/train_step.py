"""One CPU training step, timed against its variants in interleaved rounds: what a change of the step is worth.

    python -m bench train_step --compare fast_paths --preset multi30k-transformer --batch_size 256 --threads 2
    python -m bench train_step --compare logits --preset multi30k-rnn --batch_size 128 --threads 1 [--compile]
    python -m bench train_step --compare bf16 --preset base --threads 1 --reps 3

`--compare fast_paths` (attn_transformer): the two CPU fast paths on and off, patched where they are looked up
(`modeling_transformer.dropout`, `loss.fuses_output_loss`). `logits`: full (B, T, V) logits against `skip_logits=True`
(what `attn train` passes), either model type; `--compile` adds `torch.compile(model)`, `--similar_lengths` a batch of
similar lengths. `bf16`: ours and MarianMTModel with the same weights, training in float32 and under bfloat16
autocast, and beam 4 with float32 and bfloat16 weights. Every step is forward, backward and Adam (label smoothing 0.1
but for `bf16`, dropout from the preset), each variant on its own copy of the same weights, on one batch of
Multi30k-like lengths (`common.make_batches`, seed 0); `harness.interleaved` with the CPU clock, medians. Writes
bench/results/train-step-COMPARE-PRESET.{json,md} (or `--output`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from modeling_attn import AttnRNNForConditionalGeneration, loss, modeling_transformer
from modeling_attn.api.presets import load_preset

from . import common, harness

# per comparison: default preset, sentences, rounds, threads (None: torch's default)
DEFAULTS = {"fast_paths": ("multi30k-transformer", 256, 5, None), "logits": ("multi30k-rnn", 128, 5, None)}
DEFAULTS["bf16"] = ("base", 32, 3, 1)


def torch_dropout(hidden_states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return torch.nn.functional.dropout(hidden_states, p=p, training=training)


UNFUSED = (loss, "fuses_output_loss", lambda *_: False)
TORCH_DROPOUT = (modeling_transformer, "dropout", torch_dropout)
# the fast paths' variants: the patches that switch them off
FAST_PATHS: dict[str, tuple] = {
    "neither (PyTorch dropout, unfused loss)": (TORCH_DROPOUT, UNFUSED),
    "fused loss only": (TORCH_DROPOUT,),
    "uniform-draw dropout only": (UNFUSED,),
    "both (the default)": (),
}
# the losses of common.py's peers: `hf_loss` as a plain training loop calls the model, `ours_loss` as `attn train` does
LOSSES = {
    "full logits": partial(common.hf_loss, smoothing=0.1),
    "skip_logits (what attn train uses)": partial(common.ours_loss, smoothing=0.1),
}
BF16_PEERS = ["attn_transformer", "MarianMTModel (sdpa)"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench train_step", description=__doc__.split("\n")[0])
    parser.add_argument("--compare", choices=list(DEFAULTS), default="fast_paths")
    parser.add_argument("--preset", help="default: multi30k-transformer, multi30k-rnn, base (by --compare)")
    parser.add_argument("--batch_size", type=int, help="sentences in the batch (default 256, 128, 32 by --compare)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's; bf16: 1)")
    parser.add_argument("--reps", type=int, help="measured rounds after one warm-up round (default 5; bf16: 3)")
    parser.add_argument("--compile", action="store_true", help="logits: also the skip_logits step compiled")
    parser.add_argument("--similar_lengths", action="store_true", help="logits: a batch of similar lengths")
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/train-step-...)")
    args = parser.parse_args(argv)
    for name, default in zip(("preset", "batch_size", "reps", "threads"), DEFAULTS[args.compare], strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default if default is not None else torch.get_num_threads())
    model_type = load_preset(args.preset).model_type
    if args.compare != "logits" and model_type != "attn_transformer":
        parser.error(f"--compare {args.compare} times attn_transformer; --preset {args.preset} is {model_type}")
    if (args.compile or args.similar_lengths) and args.compare != "logits":
        parser.error("--compile and --similar_lengths belong to --compare logits")
    args.output = args.output or harness.RESULTS / f"train-step-{args.compare.replace('_', '-')}-{args.preset}"
    return args


def fast_paths(args: argparse.Namespace) -> tuple[common.Batch, dict, dict]:
    """The attn_transformer step with each combination of its CPU fast paths (`FAST_PATHS`)."""
    reference = common.reference_model(args.preset, 256, seed=0)
    batches = common.make_batches(1, args.batch_size, reference.config.vocab_size, seed=0, max_length=255)
    peer = dataclasses.replace(common.PEERS["attn_transformer"], loss=LOSSES["skip_logits (what attn train uses)"])
    tasks = {
        name: harness.patched(common.training_task(copy.deepcopy(reference), peer, batches, "cpu"), *patches)
        for name, patches in FAST_PATHS.items()
    }
    return batches[0], tasks, dict.fromkeys(tasks, next(iter(tasks)))


def logits(args: argparse.Namespace) -> tuple[common.Batch, dict, dict]:
    """The step with full logits against `skip_logits`, and compiled where asked."""
    config = load_preset(args.preset)
    if config.model_type == "attn_rnn":
        torch.manual_seed(0)
        reference = AttnRNNForConditionalGeneration(config).train()
    else:
        reference = common.reference_model(args.preset, 256, seed=0)
    vocab_size = reference.config.vocab_size
    batch = common.make_batches(1, args.batch_size, vocab_size, seed=0, max_length=255)[0]
    if args.similar_lengths:  # from the middle of 32 batches' worth sorted by length, as token batches group them
        lengths = sorted(common.sentence_lengths(32 * args.batch_size, seed=0), key=lambda pair: (pair[1], pair[0]))
        middle = lengths[len(lengths) // 2 : len(lengths) // 2 + args.batch_size]
        batch = common.make_batch(middle, vocab_size, torch.Generator().manual_seed(0))
    tasks = {
        name: common.training_task(copy.deepcopy(reference), common.Peer(name, lambda m: m, loss=fn), [batch], "cpu")
        for name, fn in LOSSES.items()
    }
    if args.compile:
        skip = LOSSES["skip_logits (what attn train uses)"]
        compiled = common.Peer("compiled", lambda model: model, loss=skip)
        tasks["skip_logits, torch.compile (inductor)"] = common.training_task(
            torch.compile(copy.deepcopy(reference)), compiled, [batch], "cpu"
        )
    return batch, tasks, dict.fromkeys(tasks, "full logits")


def bf16(args: argparse.Namespace) -> tuple[common.Batch, dict, dict]:
    """Ours and Marian: training float32 / bf16 autocast, beam 4 float32 / bfloat16 weights."""
    reference = common.reference_model(args.preset, 256, seed=0)
    batches = common.make_batches(1, args.batch_size, reference.config.vocab_size, seed=0)
    tasks: dict[str, Callable[[], None]] = {}
    baselines = {}
    for peer in (common.PEERS[name] for name in BF16_PEERS):
        for label, bf16_on in (("train float32", False), ("train bf16 autocast", True)):
            tasks[f"{peer.name} {label}"] = common.training_task(peer.build(reference), peer, batches, "cpu", bf16_on)
            baselines[f"{peer.name} {label}"] = f"{peer.name} train float32"
        for label, dtype in (("beam4 float32", torch.float32), ("beam4 bfloat16 weights", torch.bfloat16)):
            model = peer.build(reference).to(dtype)
            tasks[f"{peer.name} {label}"] = common.generation_task(model, peer, batches, 4, "cpu")
            baselines[f"{peer.name} {label}"] = f"{peer.name} beam4 float32"
    return batches[0], tasks, baselines


COMPARISONS = {"fast_paths": fast_paths, "logits": logits, "bf16": bf16}


def markdown(report: dict) -> str:
    lines = [
        f"`--compare {report['compare']}`, preset {report['preset']}, {report['sentences']} sentences "
        f"({report['source_positions']} source / {report['target_positions']} target positions, "
        f"{report['target_tokens']} target tokens), {report['threads']} thread(s), CPU clock, median of "
        f"{report['reps']} rounds.",
        "",
        "| variant | s (median) | speed-up over | rounds |",
        "| --- | ---: | --- | --- |",
    ]
    for name, entry in report["variants"].items():
        rounds = " ".join(f"{value:.3f}" for value in entry["seconds"])
        against = f"{entry['speedup']:.2f}x {entry['baseline']}" if entry["baseline"] != name else "-"
        lines.append(f"| {name} | {entry['median_s']:.3f} | {against} | {rounds} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict:
    """Measure, write the report, and return it (`variants`: each variant's seconds, median and speed-up)."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    batch, tasks, baselines = COMPARISONS[args.compare](args)
    seconds = harness.interleaved(tasks, args.reps, "cpu")
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    variants = {
        name: {
            "seconds": values,
            "median_s": medians[name],
            "baseline": baselines[name],
            "speedup": medians[baselines[name]] / medians[name],
        }
        for name, values in seconds.items()
    }
    settings = {key: getattr(args, key) for key in ("compare", "preset", "threads", "reps")}
    positions = {"source_positions": batch.input_ids.numel(), "target_positions": batch.labels.numel()}
    report = harness.envelope(
        __name__, argv, **settings, sentences=args.batch_size, **positions, target_tokens=batch.target_tokens
    )
    report["variants"] = variants
    harness.write_results(args.output, report, markdown(report))
    return report
