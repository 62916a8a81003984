"""How often a compiled training step of `attn_transformer` recompiles over an epoch of variable-length token batches.

    python -m bench compile_train_step --preset multi30k-transformer --max_tokens 4096 --threads 2

One epoch of Multi30k as `attn train` batches it (each pair's length in words x `common.SUBWORD_FACTOR` plus the end
token, packed by the recipe's `TokenBatchSampler` into batches of at most `--max_tokens` padded tokens per side,
random ids). For each way of compiling (`--ways`: torch's default, which recompiles with dynamic sizes at a second
shape; `dynamic=True`; static shapes, `dynamic=False`, only when named: one compilation per shape; each as is and
padded to multiples of 8), `torch.compile(model)` runs the training step (`skip_logits=True`, label smoothing 0.1,
backward) on every batch; the table counts the graphs compiled and the graph breaks. The backend is `aot_eager` by
default (Dynamo's and AOTAutograd's graphs, which decide the recompilations, without inductor's code generation);
torch's recompile limit is raised so that every shape counts. Writes bench/results/compile-train-step-cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

import numpy as np
import torch
from modeling_attn.training.batching import TokenBatchSampler

from . import common, harness

WAYS = {
    "static shapes": {"dynamic": False, "multiple": 1},
    "static shapes, padded to x8": {"dynamic": False, "multiple": 8},
    "default (dynamic after a recompilation)": {"dynamic": None, "multiple": 1},
    "default, padded to x8": {"dynamic": None, "multiple": 8},
    "dynamic=True": {"dynamic": True, "multiple": 1},
    "dynamic=True, padded to x8": {"dynamic": True, "multiple": 8},
}


def epoch_lengths(limit: int | None = None) -> list[tuple[int, int]]:
    """(source, target) tokens of every Multi30k en-de training pair (the end token included), else of a lognormal
    sample of 29,000 pairs (`common.sentence_lengths`)."""
    if (common.MULTI30K / "train.en.gz").is_file():
        with (
            gzip.open(common.MULTI30K / "train.en.gz", "rt") as en,
            gzip.open(common.MULTI30K / "train.de.gz", "rt") as de,
        ):
            pairs = [
                (round(len(s.split()) * common.SUBWORD_FACTOR) + 1, round(len(t.split()) * common.SUBWORD_FACTOR) + 1)
                for s, t in zip(en, de, strict=True)
            ]
    else:
        pairs = [(s + 1, t + 1) for s, t in common.sentence_lengths(29_000, seed=0)]
    return pairs[:limit]


def padded(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def token_batches(
    lengths: list[tuple[int, int]], max_tokens: int, multiple: int, vocab_size: int, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    """The epoch's batches as the recipe packs them (`TokenBatchSampler`, first epoch), padded to `multiple`."""
    sources, targets = np.array([s for s, _ in lengths]), np.array([t for _, t in lengths])
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for rows in TokenBatchSampler(sources, targets, max_tokens, seed=seed):
        source_width, target_width = padded(sources[rows].max(), multiple), padded(targets[rows].max(), multiple)
        input_ids = torch.zeros(len(rows), source_width, dtype=torch.long)
        labels = torch.full((len(rows), target_width), -100)
        for row, (source, target) in enumerate(zip(sources[rows], targets[rows], strict=True)):
            input_ids[row, :source] = torch.randint(3, vocab_size, (source,), generator=generator)
            labels[row, :target] = torch.randint(3, vocab_size, (target,), generator=generator)
        batches.append({"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels})
    return batches


def training_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Forward and backward as `TranslationTrainer` runs them; returns the loss."""
    loss = model(**batch, skip_logits=True, smoothing=0.1).loss
    loss.backward()
    return loss.detach()


class CountingBackend:
    """A torch.compile backend that counts the graphs it is given (each compilation and recompilation)."""

    def __init__(self, backend: str):
        self.backend, self.graphs = torch._dynamo.lookup_backend(backend), 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return self.backend(graph_module, example_inputs)


def count_compilations(
    model: torch.nn.Module, batches: list[dict], dynamic: bool | None, backend: str = "aot_eager"
) -> dict:
    """Run the compiled training step on every batch; the graphs compiled, the graph breaks, and the time."""
    torch._dynamo.reset()
    counter = CountingBackend(backend)
    compiled = torch.compile(model, backend=counter, dynamic=dynamic)
    breaks_before = torch._dynamo.utils.counters["graph_break"].total()
    started = time.perf_counter()
    for batch in batches:
        training_step(compiled, batch)
        model.zero_grad(set_to_none=True)
    return {
        "graphs_compiled": counter.graphs,
        "graph_breaks": torch._dynamo.utils.counters["graph_break"].total() - breaks_before,
        "seconds": round(time.perf_counter() - started, 1),
    }


COLUMNS = ["way", "batches", "distinct_shapes", "graphs_compiled", "graph_breaks", "seconds"]


def markdown(report: dict) -> str:
    lines = [
        f"preset {report['preset']}, {report['pairs']} pairs, backend {report['backend']}.",
        "",
        f"| {' | '.join(COLUMNS)} |",
        f"| --- |{' ---: |' * (len(COLUMNS) - 1)}",
    ]
    for name, result in report["results"].items():
        lines.append(f"| {name} | {' | '.join(str(result[column]) for column in COLUMNS[1:])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench compile_train_step", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="multi30k-transformer")
    parser.add_argument("--max_tokens", type=int, default=4096, help="padded tokens per side and batch")
    parser.add_argument("--pairs", type=int, help="only the first N pairs (default: the whole epoch)")
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument(
        "--ways", nargs="+", choices=list(WAYS), default=[way for way in WAYS if not way.startswith("static")]
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--output", type=Path, default=harness.RESULTS / "compile-train-step-cpu", help="report stem")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 10_000  # count every shape; the default (8) would fall back to eager
    lengths = epoch_lengths(args.pairs)
    model = common.reference_model(args.preset, 512, seed=0).train()
    report = harness.envelope(
        __name__, argv, preset=args.preset, pairs=len(lengths), backend=args.backend, threads=args.threads, results={}
    )
    for name in args.ways:
        way = WAYS[name]
        batches = token_batches(lengths, args.max_tokens, way["multiple"], model.config.vocab_size)
        shapes = len({(*b["input_ids"].shape, b["labels"].shape[1]) for b in batches})
        result = {
            "batches": len(batches),
            "distinct_shapes": shapes,
            **count_compilations(model, batches, way["dynamic"], args.backend),
        }
        report["results"][name] = result
        harness.log(f"| {name} | {' | '.join(str(result[column]) for column in COLUMNS[1:])} |")
        harness.write_results(args.output, report, markdown(report), quiet=True)
    harness.write_results(args.output, report, markdown(report))
    return report
