"""What an ensemble of N models costs to decode, against one model: it should be about N times, not more.

    python -m bench ensemble --preset multi30k-transformer --members 1 2 4 --threads 1

N members of `--preset` (random weights, one seed each: the cost of a step does not depend on their values), decoding
one batch of `--batch_size` sentences of `--length` source tokens, greedy and beam search (`--beams`), forced to
exactly `--new_tokens` tokens (`common.generation_settings`), as `AttnEnsemble` (modeling_attn/api/ensemble.py) and,
for N = 1, as the model itself. `model on Nx batch` rows decode N times the batch with one model: the bound of what
running the members' decoders batched together (one op per layer for all members, N times the rows) could cost, as
the same FLOPs in as many ops as one model. Timing is `harness.interleaved` with the CPU clock of this process (the
work done, on a machine shared with other jobs); medians. Writes bench/results/ensemble-cpu.{json,md} (or `--output`).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from modeling_attn.api.ensemble import AttnEnsemble

from . import common, harness


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench ensemble", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="multi30k-transformer")
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--new_tokens", type=int, default=16)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", type=Path, default=harness.RESULTS / "ensemble-cpu", help="stem of the report")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    members = [common.reference_model(args.preset, 256, seed).eval() for seed in range(max(args.members))]
    vocabulary = members[0].config.vocab_size
    batches = {
        n: common.fixed_length_batch(args.batch_size * n, args.length, vocabulary, 0) for n in {1, *args.members}
    }
    # name: (decoder, its batch, N)
    models = {"model": (members[0], batches[1], 1)}
    models.update({f"ensemble of {n}": (AttnEnsemble(members[:n]), batches[1], n) for n in args.members})
    models.update({f"model on {n}x batch": (members[0], batches[n], n) for n in args.members if n > 1})
    tasks = {}
    for name, (model, batch, _) in models.items():
        for beams in (1, args.beams):
            settings = common.generation_settings(beams, args.new_tokens)

            def task(model=model, batch=batch, settings=settings) -> None:
                with torch.no_grad():
                    model.generate(batch.input_ids, attention_mask=batch.attention_mask, generation_config=settings)

            tasks[f"{name}, {'greedy' if beams == 1 else f'beam {beams}'}"] = task
    harness.log(f"{len(tasks)} decodings, {args.reps} rounds")
    seconds = {name: statistics.median(times) for name, times in harness.interleaved(tasks, args.reps, "cpu").items()}
    rows = []
    for name, median in seconds.items():
        model_name, search = name.split(", ")
        single = seconds[f"model, {search}"]
        count = models[model_name][2]
        rows.append(
            {
                "decoder": model_name,
                "search": search,
                "seconds": round(median, 3),
                "times_one_model": round(median / single, 2),
                "per_member": round(median / single / count, 2),
            }
        )
    settings = ("preset", "members", "batch_size", "length", "new_tokens", "beams", "reps", "threads")
    report = harness.envelope(__name__, argv, **{key: getattr(args, key) for key in settings}, rows=rows)
    harness.write_results(args.output, report, markdown(report))
    return report


def markdown(report: dict) -> str:
    lines = [
        f"{report['preset']}, {report['batch_size']} sentences x {report['length']} source tokens -> "
        f"{report['new_tokens']} tokens, {report['threads']} thread(s), CPU seconds (median of {report['reps']}).",
        "",
        "| decoder | search | CPU s | x one model | x one model / N |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        cells = (row["decoder"], row["search"], row["seconds"], row["times_one_model"], row["per_member"])
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"
