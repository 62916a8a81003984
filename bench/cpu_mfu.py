"""The CPU training step of `attn_transformer` as a share of torch.mm's float32 peak, and its aten op count.

    python -m bench cpu_mfu --preset base --batch_size 64 --threads 2 --reps 5     # bench/results/cpu-mfu-base

The project's training step (`skip_logits=True`, label smoothing 0.1, backward, Adam) on one batch of Multi30k-like
lengths, and in the same rounds (`harness.interleaved`, CPU clock) a round of `--mm_products` float32 `torch.mm`
products of `--mm_size` squares: the share is the step's model FLOPs (`modeling_attn.flops.FLOP_FORMULA`, real tokens
only) per CPU second over the mm peak, between the best rounds of both and between their medians; the load average is
recorded. A torch.profiler pass counts a step's aten ops and lists the top ones by self CPU time. Variants beside the
first optimizer's step: `--optimizers` (for-loop, foreach, fused Adam), `--compiled` (`torch.compile(model)` with
inductor as `attn train --torch_compile true` runs it, timed on its dynamic graph after a batch of another shape; its
compilation CPU seconds reported), and the ablations `--every_position` and `--small_loss_chunks`
(`harness.patched`). docs/speed.md has the findings.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
from collections import Counter
from pathlib import Path

import torch

from modeling_attn import loss
from modeling_attn.modeling_transformer import AttnTransformerEncoderLayer

from . import common, harness

# The optimizer of the step: torch.optim.Adam as `common.training_task` builds it (its per-tensor loop on the CPU),
# and its two other implementations, one kernel per op over all tensors (foreach) or one per tensor (fused).
OPTIMIZERS = {"for-loop": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}
MM = "torch.mm"  # the peak's task among the rounds


def training_step(model: torch.nn.Module, batch: common.Batch, optimizer_options: dict, compiled: bool = False):
    """One call = forward (`skip_logits=True`, label smoothing 0.1), backward and an Adam step on `batch`; with
    `compiled`, forward and backward run through `torch.compile(model)` with inductor (module docstring)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, **optimizer_options)
    model.train()
    forward = torch.compile(model, backend="inductor") if compiled else model

    def step(on: common.Batch = batch) -> None:
        common.ours_loss(forward, on, smoothing=0.1).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


# The ablations: the attention projections on every position, padding included (their rows before issue 41;
# `AttnTransformerEncoderLayer.attention_rows`), and the output loss's chunk before issue 41 (2M logits: 56 rows of a
# 37k vocabulary; `loss.LOSS_CHUNK_LOGITS`)
EVERY_POSITION = (AttnTransformerEncoderLayer, "attention_rows", lambda self, rows: None)
SMALL_LOSS_CHUNK_LOGITS = 1 << 21
SMALL_LOSS_CHUNKS = (loss, "LOSS_CHUNK_LOGITS", SMALL_LOSS_CHUNK_LOGITS)


def compile_step(step, other: common.Batch, batch: common.Batch, clock) -> float:
    """CPU seconds of `step`'s first call on `other` then on `batch`: torch's static graph, then its dynamic one."""
    start = clock()
    step(other)
    step(batch)
    return clock() - start


def mm_products(size: int, count: int):
    """A task of `count` float32 (size x size) products, timed in the rounds beside the steps (`main`)."""
    left, right, out = torch.randn(size, size), torch.randn(size, size), torch.empty(size, size)

    def products() -> None:
        for _ in range(count):
            torch.mm(left, right, out=out)

    return products


def op_profile(step, top: int) -> dict:
    """The aten ops of one call of `step`: how many, and the `top` ones by self CPU time (ms)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        step()
    events = [event for event in profiler.events() if event.name.startswith("aten::")]
    counts = Counter(event.name for event in events)
    self_ms = Counter()
    for event in events:
        self_ms[event.name] += event.self_cpu_time_total / 1000
    return {
        "aten_ops": len(events),
        "distinct_aten_ops": len(counts),
        "top_self_cpu_ms": {name: [round(ms, 1), counts[name]] for name, ms in self_ms.most_common(top)},
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench cpu_mfu", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences in the batch")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=5, help="measured rounds after one warm-up round")
    parser.add_argument("--mm_size", type=int, default=1024, help="side of the square matrices of the mm peak")
    parser.add_argument(
        "--mm_products",
        type=int,
        default=256,
        help="products of one timed mm round (256 of 1024^3: about the CPU time of a base step, so that the best "
        "round of either is as likely to have found the machine undisturbed)",
    )
    parser.add_argument("--top", type=int, default=12, help="ops listed by self CPU time")
    parser.add_argument("--optimizers", nargs="+", choices=list(OPTIMIZERS), default=["for-loop"])
    parser.add_argument(
        "--compiled", action="store_true", help="also the first optimizer's step compiled (module docstring)"
    )
    parser.add_argument(
        "--every_position",
        action="store_true",
        help="also the first optimizer's step with the attention projections on every position (padding included)",
    )
    parser.add_argument(
        "--small_loss_chunks",
        action="store_true",
        help="also the first optimizer's step with the output loss in chunks of 2M logits (before issue 41)",
    )
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/cpu-mfu-PRESET)")
    args = parser.parse_args(argv)
    args.output = args.output or harness.RESULTS / f"cpu-mfu-{args.preset}"
    return args


def build_steps(args: argparse.Namespace, reference, batch: common.Batch, other: common.Batch) -> tuple[dict, dict]:
    """The steps to time, by name (the first optimizer's eager step first), and the compiled ones' compile seconds."""
    steps = {name: training_step(copy.deepcopy(reference), batch, OPTIMIZERS[name]) for name in args.optimizers}
    compile_seconds = {}
    first_optimizer = args.optimizers[0]
    if args.compiled:
        torch._dynamo.reset()
        compiled = training_step(copy.deepcopy(reference), batch, OPTIMIZERS[first_optimizer], compiled=True)
        compile_seconds[f"{first_optimizer}, compiled"] = compile_step(compiled, other, batch, harness.CLOCKS["cpu"])
        steps[f"{first_optimizer}, compiled"] = compiled
    ablations = (
        (args.every_position, "attention on every position", EVERY_POSITION),
        (args.small_loss_chunks, "loss in 2M-logit chunks", SMALL_LOSS_CHUNKS),
    )
    for wanted, label, patch in ablations:
        if wanted:
            step = training_step(copy.deepcopy(reference), batch, OPTIMIZERS[first_optimizer])
            steps[f"{first_optimizer}, {label}"] = harness.patched(step, patch)
    return steps, compile_seconds


def markdown(report: dict) -> str:
    best = min(report["step_cpu_seconds"])
    lines = [
        f"step {report['step']}: preset {report['preset']}, {report['sentences']} sentences "
        f"({report['target_tokens']} target tokens), {report['threads']} thread(s), "
        f"load {report['load_average'][0]:.2f}",
        "",
        f"step {best:.3f} CPU-s at best (rounds {' '.join(f'{s:.3f}' for s in report['step_cpu_seconds'])}), "
        f"{report['step_flops_per_cpu_second'] / 1e9:.1f} GFLOP per CPU-s; torch.mm "
        f"{report['mm_peak_flops_per_cpu_second'] / 1e9:.1f}: **{100 * report['share_of_mm_peak']:.1f}% of the mm "
        f"peak** (median step: {100 * report['share_of_mm_peak_median_step']:.1f}%; median step over median mm round: "
        f"{100 * report['share_of_mm_peak_medians']:.1f}%); {report['aten_ops']} aten ops per step",
        "",
    ]
    for name, entry in report["steps"].items():
        lines.append(
            f"- Adam {name}: {min(entry['step_cpu_seconds']):.3f} CPU-s at best, "
            f"{100 * entry['share_of_mm_peak']:.1f}% of the mm peak ({100 * entry['share_of_mm_peak_medians']:.1f}% "
            f"between medians), {entry['aten_ops']} aten ops per step"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    reference = common.reference_model(args.preset, 256, seed=0)
    batch, other = common.make_batches(2, args.batch_size, reference.config.vocab_size, seed=0, max_length=255)
    steps, compile_seconds = build_steps(args, reference, batch, other)
    rounds = harness.interleaved({**steps, MM: mm_products(args.mm_size, args.mm_products)}, args.reps, "cpu")
    mm_seconds = rounds.pop(MM)
    peak = 2 * args.mm_size**3 * args.mm_products / min(mm_seconds)
    median_peak = 2 * args.mm_size**3 * args.mm_products / statistics.median(mm_seconds)
    flops = common.training_flops(reference.config, batch)
    first = next(iter(rounds))  # the headline: --optimizers' first, eager
    seconds, best = rounds[first], min(rounds[first])
    measured = {
        "load_average": os.getloadavg(),
        "preset": args.preset,
        "threads": args.threads,
        "sentences": args.batch_size,
        "step": first,
        "target_tokens": batch.target_tokens,
        "model_flops_per_step": flops,
        "step_cpu_seconds": seconds,
        "mm_peak_flops_per_cpu_second": peak,
        "mm_round_cpu_seconds": mm_seconds,
        "step_flops_per_cpu_second": flops / best,
        "share_of_mm_peak": flops / best / peak,
        "share_of_mm_peak_median_step": flops / statistics.median(seconds) / peak,
        "share_of_mm_peak_medians": flops / statistics.median(seconds) / median_peak,
    }
    report = harness.envelope(
        __name__,
        argv,
        **measured,
        steps={
            name: {
                "step_cpu_seconds": values,
                "share_of_mm_peak": flops / min(values) / peak,
                "share_of_mm_peak_medians": flops / statistics.median(values) / median_peak,
            }
            | ({"compile_cpu_seconds": compile_seconds[name]} if name in compile_seconds else {})
            | op_profile(steps[name], 0)
            for name, values in rounds.items()
        },
        **op_profile(steps[first], args.top),
    )
    harness.write_results(args.output, report, markdown(report))
    return report
