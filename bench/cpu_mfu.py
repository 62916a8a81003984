"""The CPU training step of `attn_transformer` as a share of torch.mm's float32 peak, and its aten op count.

    python bench/cpu_mfu.py --preset base --batch_size 64 --threads 2 --reps 5 --output bench/results/cpu-mfu

The project's own training step (forward with `skip_logits=True` and label smoothing 0.1 as `attn train` runs it,
backward, Adam; `common.training_task`) on one batch of Multi30k-like lengths (`common.make_batches`, seed 0), and
in the same process the float32 peak of `torch.mm` on square matrices (`--mm_size`; a round of `--mm_products` products
timed in every round beside the steps, so that a machine whose speed drifts drifts for both; the best of `--reps`
rounds):
the share is the step's model FLOPs (`modeling_attn.flops.FLOP_FORMULA`, real tokens only) per second over the mm
peak. Both are timed with the CPU clock of this process (all its threads), which a machine shared with other jobs
disturbs least, and the share is taken between the best rounds of both (the least disturbed), and between the
median rounds of both (`share_of_mm_peak_medians`: one lucky round of either moves it least); `uptime`'s load is
recorded. The profile (torch.profiler, one step after the timing) counts the aten ops a step calls (every `aten::`
event, nested ones included: the launch overhead a GPU would pay) and lists the ops taking the most self CPU time.

`--compiled` also measures the first optimizer's step with the model compiled as `attn train --torch_compile true`
compiles it on the CPU: Trainer's default backend there is inductor, and accelerate wraps the model in
`torch.compile(model, backend="inductor")` (dynamic=None), so forward, loss and backward run as inductor's C++
kernels and the optimizer step stays eager. Trainer's token batches change shape, so the compiled model first runs
a batch of another shape: torch then recompiles with dynamic sizes, and the timed batch runs that dynamic graph, as
every batch of an `attn train` run but the first does. The compilation's CPU seconds (both graphs, before the
timing) are reported. Compiled, the model computes every padded position (`padding_free.kept_rows` picks no rows
while compiling: data-dependent shapes) and the loss takes the labelled rows' logits whole (`loss.fuses_output_loss`).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)

from modeling_attn import loss  # noqa: E402
from modeling_attn.modeling_transformer import AttnTransformerEncoderLayer  # noqa: E402

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


def patched(step, owner, name: str, value):
    """`step` with `owner.name` set to `value` while it runs (`unittest.mock.patch.object`): a change's ablation,
    timed in the same rounds as the step itself."""

    def run(*args) -> None:
        with mock.patch.object(owner, name, value):
            step(*args)

    return run


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


def main(argv: list[str] | None = None) -> dict:
    parser = common.step_parser(__doc__.split("\n")[0], "base", 64)
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
    parser.add_argument("--output", type=Path, help="stem of a JSON report")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = common.CLOCKS["cpu"]
    reference = common.reference_model(args.preset, 256, seed=0)
    batch, other = common.make_batches(2, args.batch_size, reference.config.vocab_size, seed=0, max_length=255)
    steps = {name: training_step(copy.deepcopy(reference), batch, OPTIMIZERS[name]) for name in args.optimizers}
    compile_seconds = {}
    if args.compiled:
        torch._dynamo.reset()
        name = args.optimizers[0]
        compiled = training_step(copy.deepcopy(reference), batch, OPTIMIZERS[name], compiled=True)
        compile_seconds[f"{name}, compiled"] = compile_step(compiled, other, batch, clock)
        steps[f"{name}, compiled"] = compiled
    ablations = (
        (args.every_position, "attention on every position", EVERY_POSITION),
        (args.small_loss_chunks, "loss in 2M-logit chunks", SMALL_LOSS_CHUNKS),
    )
    first_optimizer = args.optimizers[0]
    for wanted, label, patch in ablations:
        if wanted:
            step = training_step(copy.deepcopy(reference), batch, OPTIMIZERS[first_optimizer])
            steps[f"{first_optimizer}, {label}"] = patched(step, *patch)
    rounds = common.interleaved({**steps, MM: mm_products(args.mm_size, args.mm_products)}, args.reps, clock)
    mm_seconds = rounds.pop(MM)
    peak = 2 * args.mm_size**3 * args.mm_products / min(mm_seconds)
    median_peak = 2 * args.mm_size**3 * args.mm_products / statistics.median(mm_seconds)
    flops = common.training_flops(reference.config, batch)
    first = next(iter(rounds))  # the headline: --optimizers' first, eager
    seconds, best = rounds[first], min(rounds[first])
    report = {
        "command": " ".join(["python", "bench/cpu_mfu.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": common.machine(),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
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
        "steps": {
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
    }
    print(
        f"step {first}: preset {args.preset}, {args.batch_size} sentences ({batch.target_tokens} target tokens), "
        f"{args.threads} thread(s), {report['machine']}, torch {torch.__version__}, "
        f"load {report['load_average'][0]:.2f}\n"
        f"step {best:.3f} CPU-s at best (rounds {' '.join(f'{s:.3f}' for s in seconds)}), "
        f"{flops / best / 1e9:.1f} GFLOP per CPU-s; torch.mm {args.mm_size}^3 {peak / 1e9:.1f}: "
        f"**{100 * report['share_of_mm_peak']:.1f}% of the mm peak** (median step: "
        f"{100 * report['share_of_mm_peak_median_step']:.1f}%; median step over median mm round: "
        f"{100 * report['share_of_mm_peak_medians']:.1f}%); {report['aten_ops']} aten ops per step"
    )
    for name, entry in report["steps"].items():
        print(
            f"Adam {name}: {min(entry['step_cpu_seconds']):.3f} CPU-s at best, "
            f"{100 * entry['share_of_mm_peak']:.1f}% of the mm peak ({100 * entry['share_of_mm_peak_medians']:.1f}% "
            f"between medians), {entry['aten_ops']} aten ops per step"
        )
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
