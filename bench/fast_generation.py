"""The torch engine's lean decoding loop against generate(): sentences/s, one thread, and whether the ids are the same.

    python -m bench fast_generation --model outputs/dates
    python -m bench fast_generation --preset base

`modeling_attn.fast_generation.fast_generate` against `model.generate()` (what `attn translate` ran before it) on the
same sentences at `--batch_sizes` (1 32), greedy and beam 4 (`--beams`), `--threads` 1: interleaved rounds,
sentences/s by process CPU time (medians of `--reps`), sentences with the same ids. A third task, the step's matmuls
alone, bounds any loop with these kernels: each decoder step fast_generate ran (its rows, recorded once), only the
step's projections (`DecoderStep.projections`) on inputs of those rows; its speed over generate() is the "ceiling".
`--model`: a trained folder, `--sentences` dates of the test split's kind (`training.synthetic.generate_pairs`, a seed
the training split does not use). `--preset`: random weights, random sources of realistic lengths
(`common.sentence_lengths`), every translation `--max_new_tokens` long (30: the end token's output row is the negative
mean of the others, never the argmax). Writes bench/results/fast-generation-MODEL.{json,md} (or `--output`).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from . import common, harness


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench fast_generation", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a trained attn_transformer folder (the README's outputs/dates)")
    source.add_argument("--preset", help="an attn_transformer preset with random weights (base)")
    parser.add_argument("--sentences", type=int, help="sentences translated per round (64 with --model, 16 preset)")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="1 = greedy search (1 4)")
    parser.add_argument("--max_new_tokens", type=int, default=30, help="--preset: the length of every translation")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/fast-generation-...)")
    args = parser.parse_args(argv)
    args.sentences = args.sentences or (64 if args.model else 16)
    name = args.model.name if args.model else args.preset
    args.output = args.output or harness.RESULTS / f"fast-generation-{name}"
    return args


def trained_inputs(args: argparse.Namespace):
    """The model of `--model` and its sentences, tokenized one batch at a time; no extra generate() settings."""
    from modeling_attn.training.synthetic import generate_pairs
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    sentences = [source for source, _ in generate_pairs(args.sentences, seed=20261127)]
    return model, sentences, lambda rows: tokenizer(rows, padding=True, return_tensors="pt"), {}


def preset_inputs(args: argparse.Namespace):
    """A random-weight model of `--preset` whose translations never end before `--max_new_tokens`, and random
    sources of realistic lengths."""
    model = common.reference_model(args.preset, max_positions=512, seed=0).eval()
    with torch.no_grad():
        others = torch.cat([model.lm_head.weight[: common.EOS], model.lm_head.weight[common.EOS + 1 :]])
        model.lm_head.weight[common.EOS] = -others.mean(dim=0) * 100  # tied: the end token's embedding too
    generator = torch.Generator().manual_seed(0)
    sources = [
        torch.randint(3, model.config.vocab_size, (min(length, 100),), generator=generator)
        for length, _ in common.sentence_lengths(args.sentences, seed=0)
    ]

    def encode(rows):
        width = max(len(row) for row in rows)
        input_ids = torch.full((len(rows), width), common.PAD)
        for index, row in enumerate(rows):
            input_ids[index, : len(row)] = row
        return {"input_ids": input_ids, "attention_mask": (input_ids != common.PAD).long()}

    return model, sources, encode, {"max_new_tokens": args.max_new_tokens}


def translate_all(run, batches: list[dict], settings: dict) -> list[torch.Tensor]:
    return [run(batch["input_ids"], batch["attention_mask"], **settings) for batch in batches]


def step_rows(model, batches: list[dict], settings: dict) -> list[int]:
    """The rows of each decoder step fast_generate runs on `batches` (one untimed run, its steps recorded)."""
    from modeling_attn import fast_generation

    rows: list[int] = []
    step_call = fast_generation.DecoderStep.__call__

    def recorded(step, tokens, *args):
        rows.append(tokens.shape[0])
        return step_call(step, tokens, *args)

    run = harness.patched(
        lambda: translate_all(partial(fast_generation.fast_generate, model), batches, settings),
        (fast_generation.DecoderStep, "__call__", recorded),
    )
    run()
    return rows


def matmuls_alone(model, rows: list[int]) -> Callable[[], None]:
    """A task that runs, for each recorded step, that step's projections (`DecoderStep.projections`) on inputs of
    its rows: the part of a step no loop with these kernels avoids."""
    from modeling_attn.fast_generation import DecoderStep, fusion_is_exact

    step = DecoderStep(model)
    generator = torch.Generator().manual_seed(0)
    inputs: dict[tuple[int, int], torch.Tensor] = {}  # (rows, width) -> one random input, shared by its steps

    def states(count: int, width: int) -> torch.Tensor:
        if (count, width) not in inputs:
            inputs[count, width] = torch.randn(count, width, generator=generator)
        return inputs[count, width]

    plans = []
    for count in rows:
        projections = step.projections(fuse=fusion_is_exact(step.first_attention, count))
        plans.append([(states(count, weight_t.shape[0]), (weight_t, bias)) for weight_t, bias in projections])

    def run() -> None:
        with torch.inference_mode():
            for plan in plans:
                for x, (weight_t, bias) in plan:  # the step's own call (fast_generation._affine)
                    torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)

    return run


def main(argv: list[str]) -> dict:
    from modeling_attn.fast_generation import fast_generate

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, sentences, encode, extra = (trained_inputs if args.model else preset_inputs)(args)

    def generate(input_ids, attention_mask, **settings):
        with torch.no_grad():
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)

    def fast(input_ids, attention_mask, **settings):
        return fast_generate(model, input_ids, attention_mask, **settings)

    report = harness.envelope(
        "bench.fast_generation", argv, model=str(args.model or args.preset), threads=args.threads
    )
    report |= {"sentences": len(sentences), "settings": extra, "results": []}
    rows = [
        "| batch | beams | generate() sentences/s | fast_generate sentences/s | speed-up | same ids "
        "| the step's matmuls alone | ceiling |"
    ]
    rows.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch_size in args.batch_sizes:
        batches = [dict(encode(sentences[i : i + batch_size])) for i in range(0, len(sentences), batch_size)]
        for beams in args.beams:
            settings = {"num_beams": beams, **extra}
            expected = translate_all(generate, batches, settings)
            got = translate_all(fast, batches, settings)
            if any(ids is None for ids in got):
                raise RuntimeError(f"fast_generate refused {settings}: nothing to compare")
            same = sum(
                int(torch.equal(a, b)) if a.shape == b.shape else 0
                for exp, out in zip(expected, got, strict=True)
                for a, b in zip(exp, out, strict=True)
            )
            tasks = {
                "generate": lambda settings=settings, batches=batches: translate_all(generate, batches, settings),
                "fast_generate": lambda settings=settings, batches=batches: translate_all(fast, batches, settings),
                "matmuls alone": matmuls_alone(model, step_rows(model, batches, settings)),
            }
            seconds = harness.interleaved_clocks(tasks, args.reps)
            rates = {name: len(sentences) / statistics.median(clocks["cpu"]) for name, clocks in seconds.items()}
            entry = {
                "batch_size": batch_size,
                "num_beams": beams,
                "sentences_per_s_cpu": rates,
                "speedup": rates["fast_generate"] / rates["generate"],
                "ceiling": rates["matmuls alone"] / rates["generate"],
                "same_ids": f"{same} of {len(sentences)}",
                "seconds": seconds,
            }
            report["results"].append(entry)
            harness.log(f"batch {batch_size}, beams {beams}: {rates} ({entry['same_ids']} same)")
            rows.append(
                f"| {batch_size} | {beams} | {rates['generate']:.1f} | {rates['fast_generate']:.1f} | "
                f"{entry['speedup']:.2f}x | {entry['same_ids']} | {rates['matmuls alone']:.1f} | "
                f"{entry['ceiling']:.2f}x |"
            )
    note = (
        f"\n{len(sentences)} sentences, {args.threads} thread(s), process CPU time, medians of {args.reps} "
        "interleaved rounds. The step's matmuls alone: the projections of every decoder step fast_generate ran, "
        "nothing else (sentences/s as if that were all a loop did); ceiling: that over generate(), the most any "
        "loop computing with these kernels can gain.\n"
    )
    harness.write_results(args.output, report, "\n".join(rows) + "\n" + note)
    return report
