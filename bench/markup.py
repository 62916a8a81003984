"""Inline tags carried through translation on the dates task: does each tag land on its field in the target?

    python -m bench markup --model outputs/dates-guided outputs/dates   # 1000 held-out dates; the issue's >= 95%
    python -m bench markup --model DIR --pairs 20 --output /tmp/markup  # a quick run (tests/test_bench.py)

The embedded task's held-out test pairs (`build_dataset(alignments=True)["test"]`) know which source word writes the
year, the month and the day, and which target word each becomes ("1987-", "03-", "03": the "alnum" words). Each date
becomes one HTML paragraph with `<b id="year">`, `<b id="month">`, `<b id="day">` around the letters and digits of
its field's source word ("Tuesday, March <b id="day">3rd</b>, 1987"); the whole document is translated by
`api.markup.translate_markup(..., words="alnum")` (German sentence rules: "3. März" is not a sentence end), and a tag
is right when it wraps exactly the target word of its field in the model's own translation. Also reported: the tags
that wrap nothing, the translations equal to the reference, and the sentences per second.
"""

from __future__ import annotations

import argparse
import html
import re
import time
from pathlib import Path

import torch
from modeling_attn.training.synthetic import TARGET_FIELDS, build_dataset

from modeling_attn.api.alignment import parse_pharaoh, split_words
from modeling_attn.api.engines import load_translator
from modeling_attn.api.markup import translate_markup

from . import harness

TAG = re.compile(r'<b id="(\w+)">(.*?)</b>')
TARGET = 0.95  # issue 58: the share of tags on the right target field


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench markup", description=__doc__.split("\n")[0])
    parser.add_argument("--model", nargs="+", required=True, help="dates models (attn train's embedded task)")
    parser.add_argument("--pairs", type=int, default=1000, help="held-out test pairs (at most 1000)")
    parser.add_argument("--engine", default="torch", help="load_translator's engine (one with word alignments)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", type=Path, default=harness.RESULTS / "markup-dates")
    return parser.parse_args(argv)


def tagged(source: str, pharaoh: str) -> str:
    """The date as an HTML paragraph, each field's source word's letters and digits in a `<b id=FIELD>`."""
    words = split_words(source, "alnum")
    out, position = [], 0
    for index, field in sorted((source_word, TARGET_FIELDS[target]) for source_word, target in parse_pharaoh(pharaoh)):
        start, end = words[index]
        core = re.search(r"\w+", source[start:end])
        start, end = start + core.start(), start + core.end()
        out += [html.escape(source[position:start]), f'<b id="{field}">', html.escape(source[start:end]), "</b>"]
        position = end
    return "<p>" + "".join(out) + html.escape(source[position:]) + "</p>"


def score(line: str) -> dict[str, str]:
    """Where each tag of one translated paragraph landed: "right" (exactly its field's target word), "empty", or
    "wrong"."""
    inner = line.removeprefix("<p>").removesuffix("</p>")
    plain = html.unescape(TAG.sub(lambda match: match.group(2), inner))
    words, found = split_words(plain, "alnum"), {}
    for match in TAG.finditer(inner):
        text = html.unescape(match.group(2))
        start = len(html.unescape(TAG.sub(lambda m: m.group(2), inner[: match.start()])))
        field_word = words[TARGET_FIELDS.index(match.group(1))] if len(words) == 3 else None
        found[match.group(1)] = (
            "empty" if not text else "right" if (start, start + len(text)) == field_word else "wrong"
        )
    return found


def run_model(args: argparse.Namespace, model: str, pairs: list[dict]) -> dict:
    """One model's share of tags on their fields, over the pairs as one HTML document."""
    engine = load_translator(model, engine=args.engine, device="cpu", threads=args.threads)
    document = "".join(tagged(pair["source"], pair["alignment"]) + "\n" for pair in pairs)
    start = time.perf_counter()
    translated = translate_markup(engine, document, "html", "de", args.batch_size, words="alnum")
    seconds = time.perf_counter() - start
    lines = translated.split("\n")[: len(pairs)]
    counts = {field: {"right": 0, "wrong": 0, "empty": 0} for field in TARGET_FIELDS}
    exact = right_when_exact = 0
    for line, pair in zip(lines, pairs, strict=True):
        outcomes = score(line)
        for field, outcome in outcomes.items():
            counts[field][outcome] += 1
        if html.unescape(re.sub(r"<[^>]+>", "", line)) == pair["target"]:
            exact += 1
            right_when_exact += sum(outcome == "right" for outcome in outcomes.values())
    right = sum(count["right"] for count in counts.values())
    tags = sum(sum(count.values()) for count in counts.values())
    harness.log(f"{model}: {right}/{tags} tags on their field ({right / tags:.1%}), {seconds:.1f} s")
    return {
        "model": model,
        "engine": engine.name,
        "tags": tags,
        "right": right,
        "share_right": right / tags,
        "by_field": counts,
        "translations_equal_to_reference": exact / len(pairs),
        "share_right_where_translation_is_reference": right_when_exact / (3 * exact) if exact else None,
        "sentences_per_second": len(pairs) / seconds,
        "meets_target": right / tags >= TARGET,
    }


def markdown(report: dict) -> str:
    rows = [
        "| model | tags | on their field | empty | wrong | translations = reference | on their field there "
        "| sentences/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in report["results"]:
        empty = sum(count["empty"] for count in result["by_field"].values())
        wrong = sum(count["wrong"] for count in result["by_field"].values())
        rows.append(
            f"| {result['model']} | {result['tags']} | {result['share_right']:.1%} | {empty} | {wrong} "
            f"| {result['translations_equal_to_reference']:.1%} "
            f"| {result['share_right_where_translation_is_reference']:.1%} | {result['sentences_per_second']:.1f} |"
        )
    return (
        "# Inline tags through translation on the dates task\n\n"
        f"{report['pairs']} held-out test dates, each an HTML paragraph with `<b>` tags around its day, month and "
        f'year; `translate_markup(..., words="alnum")` on the {report["engine"]} engine, {report["threads"]} '
        "thread(s). A tag is on its field when it wraps exactly its field's target word in the model's own "
        f"translation (the target: >= {TARGET:.0%}); on their field there: the same share among the dates translated "
        "exactly as the reference (wrong translations left out).\n\n" + "\n".join(rows) + "\n"
    )


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    pairs = list(build_dataset(alignments=True)["test"].select(range(args.pairs)))
    report = harness.envelope(
        __name__, argv, pairs=args.pairs, engine=args.engine, threads=args.threads, batch_size=args.batch_size
    )
    report["results"] = [run_model(args, model, pairs) for model in args.model]
    harness.write_results(args.output, report, markdown(report))
    return report
