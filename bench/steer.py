"""Steering a translation on each engine: whether the engines agree, and what a prefix, a limit, a constraint cost.

    python -m bench steer --model outputs/dates                 # the README's dates model, 200 sentences
    python -m bench steer --model DIR --sentences 16 --reps 1   # a quick run (tests/test_bench.py)

Parts (`--parts`): `agreement`, for each steering setting (a target prefix, banned words, each repetition limit) at
greedy and beam 4, how many of the sentences' translations differ between `load_translator(engine="torch")` and
`engine="ctranslate2"` (docs/translate-evaluate.md, "Steering", cites it); `speed`, sentences/s of the same calls on
torch, the ctranslate2 engine and CTranslate2 called directly with the same options (the engine's own options
object, `CTranslate2Engine._options`), unsteered and steered, interleaved rounds, medians (`harness.interleaved`).
`constraints`, torch's beam 4 unconstrained against constrained (one phrase per sentence: the first word of its
unsteered translation, for the dates model its year; the issue's bar: within 2x); `scoring`, pairs/s of
`engine.score` (the sentences with their unsteered translations) on torch and the ctranslate2 engine, and of
CTranslate2's `score_batch` called directly (tokenizing included, as the direct translating calls do).
The sentences are `common.dates_sentences`; the prefix is each reference's first `--prefix_chars` characters as the
model writes them (its own unsteered translation), so that a prefix is one the model could have chosen.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from . import common, harness

SETTINGS: dict[str, dict] = {
    "prefix": {},  # filled per sentence (`prefixes`)
    "bad_words": {"bad_words": ("1",)},
    "no_repeat_ngram_size 3": {"no_repeat_ngram_size": 3},
    "repetition_penalty 1.3": {"repetition_penalty": 1.3},
    "repetition_penalty 3": {"repetition_penalty": 3.0},
    "min_new_tokens 12": {"min_new_tokens": 12},
}
SEARCHES = {"greedy": 1, "beam 4": 4}
PARTS = ["agreement", "speed", "constraints", "scoring"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench steer", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="an attn_transformer folder (the README's: outputs/dates)")
    parser.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--prefix_chars", type=int, default=5, help="characters of the unsteered translation")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5, help="timed rounds after a warm-up round (speed)")
    parser.add_argument(
        "--threads", type=int, help="threads of every engine (default: each engine's own choice, as users get)"
    )
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/steer-MODEL)")
    args = parser.parse_args(argv)
    args.output = args.output or harness.RESULTS / f"steer-{Path(args.model).name}"
    return args


def prefixes(engine, sentences: list[str], chars: int) -> list[str]:
    """Each sentence's prefix: the first `chars` characters of its unsteered greedy translation."""
    return [text[:chars] for text in engine.translate_batch(sentences, num_beams=1)]


def options_of(name: str, beams: int, prefix: list[str]) -> dict:
    return {"num_beams": beams, **SETTINGS[name], **({"target_prefix": prefix} if name == "prefix" else {})}


def batched(engine, sentences: list[str], options: dict, batch_size: int) -> list[str]:
    found = []
    for start in range(0, len(sentences), batch_size):
        part = {k: v[start : start + batch_size] if k == "target_prefix" else v for k, v in options.items()}
        found += engine.translate_batch(sentences[start : start + batch_size], **part)
    return found


def agreement(engines: dict, sentences: list[str], prefix: list[str], args: argparse.Namespace) -> dict:
    result = {}
    for name in SETTINGS:
        for search, beams in SEARCHES.items():
            options = options_of(name, beams, prefix)
            torch_out, ct2_out = (batched(engines[e], sentences, options, args.batch_size) for e in engines)
            differ = sum(a != b for a, b in zip(torch_out, ct2_out, strict=True))
            changed = sum(
                a != b
                for a, b in zip(
                    torch_out, batched(engines["torch"], sentences, {"num_beams": beams}, args.batch_size), strict=True
                )
            )
            result[f"{name}, {search}"] = {"differ": differ, "changed_by_the_setting_on_torch": changed}
    return result


def direct(engine, sentences: list[str], options: dict, batch_size: int) -> None:
    """CTranslate2's translate_batch called directly with the options the engine builds (no per-sentence limits)."""
    translator = engine.translator
    for start in range(0, len(sentences), batch_size):
        part = {k: v[start : start + batch_size] if k == "target_prefix" else v for k, v in options.items()}
        rows = engine.tokenizer(sentences[start : start + batch_size])["input_ids"]
        tokens = [[translator.source_tokens[i] for i in row] for row in rows]
        ct2 = engine._options([len(row) for row in tokens], None, 1, part)
        translator.translator.translate_batch(tokens, **ct2)


def speed(engines: dict, sentences: list[str], prefix: list[str], args: argparse.Namespace) -> dict:
    result = {}
    for search, beams in SEARCHES.items():
        for name in ("none", "prefix", "repetition_penalty 1.3"):
            options = {"num_beams": beams} if name == "none" else options_of(name, beams, prefix)
            tasks = {
                "torch": lambda o=options: batched(engines["torch"], sentences, o, args.batch_size),
                "ctranslate2 engine": lambda o=options: batched(engines["ctranslate2"], sentences, o, args.batch_size),
                "CTranslate2 direct": lambda o=options: direct(engines["ctranslate2"], sentences, o, args.batch_size),
            }
            seconds = harness.interleaved(tasks, args.reps)
            result[f"{name}, {search}"] = {
                task: len(sentences) / statistics.median(times) for task, times in seconds.items()
            }
            harness.log(f"{name}, {search}: {result[f'{name}, {search}']}")
    return result


def constraints(engines: dict, sentences: list[str], prefix: list[str], args: argparse.Namespace) -> dict:
    engine = engines["torch"]
    references = batched(engine, sentences, {"num_beams": 4}, args.batch_size)
    phrases = [[reference.split()[0]] if reference.split() else [] for reference in references]

    def constrained() -> None:
        for start in range(0, len(sentences), args.batch_size):
            part = slice(start, start + args.batch_size)
            engine.translate_batch(sentences[part], num_beams=4, constraints=phrases[part])

    tasks = {
        "unconstrained": lambda: batched(engine, sentences, {"num_beams": 4}, args.batch_size),
        "one phrase": constrained,
    }
    seconds = harness.interleaved(tasks, args.reps)
    rates = {task: len(sentences) / statistics.median(times) for task, times in seconds.items()}
    return {**rates, "cost": rates["unconstrained"] / rates["one phrase"]}


def scoring(engines: dict, sentences: list[str], prefix: list[str], args: argparse.Namespace) -> dict:
    targets = batched(engines["torch"], sentences, {"num_beams": 4}, args.batch_size)
    ct2 = engines["ctranslate2"]
    source_tokens, target_tokens = ct2.translator.source_tokens, ct2.translator.target_tokens

    def direct() -> None:  # tokenizing included, as `direct` translating does
        for start in range(0, len(sentences), args.batch_size):
            part = slice(start, start + args.batch_size)
            sources = ct2.tokenizer(sentences[part])["input_ids"]
            hypotheses = ct2.tokenizer(targets[part], add_special_tokens=False)["input_ids"]
            ct2.translator.translator.score_batch(
                [[source_tokens[i] for i in row] for row in sources],
                [[target_tokens[i] for i in row] for row in hypotheses],
                max_input_length=0,
            )

    tasks = {
        "torch": lambda: engines["torch"].score(sentences, targets, args.batch_size),
        "ctranslate2 engine": lambda: ct2.score(sentences, targets, args.batch_size),
        "CTranslate2 direct": direct,
    }
    seconds = harness.interleaved(tasks, args.reps)
    return {task: len(sentences) / statistics.median(times) for task, times in seconds.items()}


def markdown(report: dict) -> str:
    threads = "the engines' default threads" if report["threads"] is None else f"{report['threads']} thread(s)"
    lines = [f"{report['sentences']} sentences, batches of {report['batch_size']}, {threads}.", ""]
    if "agreement" in report:
        lines += ["### torch against ctranslate2: translations that differ", ""]
        lines += ["| setting | differ | changed by the setting (torch) |", "| --- | ---: | ---: |"]
        lines += [
            f"| {name} | {entry['differ']} | {entry['changed_by_the_setting_on_torch']} |"
            for name, entry in report["agreement"].items()
        ]
        lines.append("")
    if "speed" in report:
        lines += [
            "### sentences/s (median round)",
            "",
            "| setting | torch | ctranslate2 engine | CTranslate2 direct |",
        ]
        lines.append("| --- | ---: | ---: | ---: |")
        for name, entry in report["speed"].items():
            lines.append(f"| {name} | " + " | ".join(f"{value:,.1f}" for value in entry.values()) + " |")
        lines.append("")
    if "constraints" in report:
        found = report["constraints"]
        lines += ["### constrained decoding on torch, beam 4 (sentences/s, median round)", ""]
        lines += [f"unconstrained {found['unconstrained']:,.1f}, one phrase per sentence {found['one phrase']:,.1f}: "]
        lines[-1] += f"**{found['cost']:.2f}x** the time (the bar: 2x).\n"
    if "scoring" in report:
        lines += ["### scoring (pairs/s, median round)", "", "| torch | ctranslate2 engine | CTranslate2 direct |"]
        lines += ["| ---: | ---: | ---: |", "| " + " | ".join(f"{v:,.1f}" for v in report["scoring"].values()) + " |"]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    from modeling_attn.api.engines import load_translator

    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    report = harness.envelope(
        __name__,
        argv,
        ("ctranslate2",),
        model=args.model,
        sentences=args.sentences,
        batch_size=args.batch_size,
        threads=args.threads,
    )
    engines = {
        name: load_translator(args.model, engine=name, device="cpu", threads=args.threads)
        for name in ("torch", "ctranslate2")
    }
    sentences = common.dates_sentences(args.sentences)
    prefix = prefixes(engines["torch"], sentences, args.prefix_chars)
    for part, run in (("agreement", agreement), ("speed", speed), ("constraints", constraints), ("scoring", scoring)):
        if part in args.parts:
            report[part] = run(engines, sentences, prefix, args)
            harness.write_results(args.output, report, markdown(report), quiet=True)
    harness.write_results(args.output, report, markdown(report))
    return report
