"""The torch engine's lean decoding loop against generate(): sentences/s, one thread, and whether the ids are the same.

    python -m bench fast_generation --model outputs/dates
    python -m bench fast_generation --preset base

`modeling_attn.fast_generation.fast_generate` against `model.generate()` (what `attn translate` ran before it), each
translating the same sentences at `--batch_sizes` (1 and 32) with greedy search and beam 4 (`--beams`), `--threads`
1: `harness.interleaved_clocks` rounds, sentences/s by the process's CPU time (medians of `--reps`), and how many
sentences got the same token ids from both. `--model`: a trained model folder and `--sentences` dates of the test
split's kind (`training.synthetic.generate_pairs`, a seed the training split does not use). `--preset`: random
weights and random source ids of realistic lengths (`common.sentence_lengths`); every translation made
`--max_new_tokens` long (30): the end token's output row is set to the negative mean of the others (with random
weights it is then never the argmax), so both paths run the same number of steps. Writes
bench/results/fast-generation-MODEL.{json,md} (or `--output`).
"""

from __future__ import annotations

import argparse
import statistics
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
    rows = ["| batch | beams | generate() sentences/s | fast_generate sentences/s | speed-up | same ids |"]
    rows.append("| ---: | ---: | ---: | ---: | ---: | ---: |")
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
            }
            seconds = harness.interleaved_clocks(tasks, args.reps)
            rates = {name: len(sentences) / statistics.median(clocks["cpu"]) for name, clocks in seconds.items()}
            entry = {
                "batch_size": batch_size,
                "num_beams": beams,
                "sentences_per_s_cpu": rates,
                "speedup": rates["fast_generate"] / rates["generate"],
                "same_ids": f"{same} of {len(sentences)}",
                "seconds": seconds,
            }
            report["results"].append(entry)
            harness.log(f"batch {batch_size}, beams {beams}: {rates} ({entry['same_ids']} same)")
            rows.append(
                f"| {batch_size} | {beams} | {rates['generate']:.1f} | {rates['fast_generate']:.1f} | "
                f"{entry['speedup']:.2f}x | {entry['same_ids']} |"
            )
    note = (
        f"\n{len(sentences)} sentences, {args.threads} thread(s), process CPU time, medians of {args.reps} "
        "interleaved rounds.\n"
    )
    harness.write_results(args.output, report, "\n".join(rows) + "\n" + note)
    return report
