"""Documents against one sentence per line: the same quality and speed when sentences arrive as running text?

    python -m bench documents --model outputs/m30k-en-de        # Multi30k test2016, EN->DE (../shared/data)
    python -m bench documents --model DIR --data DIR --source_lang a --target_lang b --sentences 24 --reps 1

The test split's sentences are joined into paragraphs of 3-8 (a fixed seed; a space between sentences, a blank line
between paragraphs; a sentence with no final mark gets a full stop in both ways, as running text has it, unless
`--keep_unended`: 51 of test2016's captions lack one, and two sentences without an end run into one) and translated
two ways on one engine (`--engine`, default auto, default threads): one sentence per row (`engine.translate_batch`,
`--batch_size` at a time) and as a document (`documents.translate_document`: sentencex finds the sentences again).
Quality: lowercased Moses-tokenized BLEU on paragraphs (each paragraph's translation against its joined references,
both ways), and how many paragraphs sentencex splits back into exactly their sentences. Speed: sentences per second,
interleaved rounds, medians of wall and CPU time. The issue's bars: BLEU within 0.2, speed within 10%.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from . import harness

DEFAULT_DATA = harness.REPO.parent / "shared" / "data" / "multi30k"
ENDS = (".", "!", "?", "…", '"', "'", ")")  # a sentence end, or a closing quote or bracket after one


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench documents", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a model folder (a Multi30k model of the recipe)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of the test split")
    parser.add_argument("--split", default="test_2016_flickr", help="file stem of the test split")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--sentences", type=int, help="the first N sentences only (default: all)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3, help="timed rounds after a warm-up round")
    parser.add_argument("--seed", type=int, default=0, help="the paragraph sizes' random seed")
    parser.add_argument(
        "--keep_unended", action="store_true", help="no full stop for sentences without a final mark (both ways)"
    )
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/documents-MODEL)")
    args = parser.parse_args(argv)
    args.output = args.output or harness.RESULTS / f"documents-{Path(args.model).name}"
    return args


def paragraphs_of(count: int, seed: int) -> list[range]:
    """Consecutive runs of 3-8 sentence indices covering `count` sentences (the last may be shorter)."""
    generator, runs, start = random.Random(seed), [], 0
    while start < count:
        size = generator.randint(3, 8)
        runs.append(range(start, min(start + size, count)))
        start += size
    return runs


def main(argv: list[str]) -> dict:
    from modeling_attn.api.corpus import read_folder_split
    from modeling_attn.api.documents import split_document, translate_document
    from modeling_attn.api.engines import load_translator
    from modeling_attn.api.evaluate_modules.multi30k_bleu import lowercased_tokenized_bleu

    args = parse_args(argv)
    sources, references, _, _ = read_folder_split(args.data, args.split, "test", args.source_lang, args.target_lang)
    sources, references = sources[: args.sentences], references[: args.sentences]
    ended = [source if args.keep_unended or source.rstrip().endswith(ENDS) else f"{source}." for source in sources]
    report_ended = sum(new != old for new, old in zip(ended, sources, strict=True))
    sources = ended
    runs = paragraphs_of(len(sources), args.seed)
    text = "\n\n".join(" ".join(sources[i] for i in run) for run in runs) + "\n"
    engine = load_translator(args.model, engine=args.engine, device="cpu")
    report = harness.envelope(
        __name__, argv, ("ctranslate2", "sentencex"), model=args.model, engine=engine.label_for({}),
        sentences=len(sources), paragraphs=len(runs), batch_size=args.batch_size, full_stops_added=report_ended,
    )  # fmt: skip
    found: dict[str, list[str]] = {}

    def per_line() -> None:
        translations = []
        for start in range(0, len(sources), args.batch_size):
            translations += engine.translate_batch(sources[start : start + args.batch_size])
        found["per line"] = [" ".join(translations[i] for i in run) for run in runs]

    def document() -> None:
        translated = translate_document(engine, text, args.batch_size, args.source_lang)
        found["document"] = translated.rstrip("\n").split("\n\n")

    seconds = harness.interleaved_clocks({"per line": per_line, "document": document}, args.reps)
    joined = [" ".join(references[i] for i in run) for run in runs]
    report["bleu_lc_tok_paragraphs"] = {
        way: round(lowercased_tokenized_bleu(found[way], joined, args.target_lang)[0].score, 2) for way in found
    }
    report["paragraphs_split_as_written"] = sum(
        split_document(" ".join(sources[i] for i in run), args.source_lang).sentences == [sources[i] for i in run]
        for run in runs
    )
    report["sentences_per_second"] = {
        way: {clock: len(sources) / statistics.median(times) for clock, times in clocks.items()}
        for way, clocks in seconds.items()
    }
    harness.write_results(args.output, report, markdown(report))
    return report


def markdown(report: dict) -> str:
    bleu, rates = report["bleu_lc_tok_paragraphs"], report["sentences_per_second"]
    lines = [
        f"{report['sentences']} sentences in {report['paragraphs']} paragraphs of 3-8 ({report['full_stops_added']} "
        f"given a full stop), engine {report['engine']}, batches of {report['batch_size']}; "
        f"{report['paragraphs_split_as_written']} of {report['paragraphs']} paragraphs split by sentencex into "
        "exactly their own sentences.",
        "",
        "| way | BLEU lc+tok (paragraphs) | sentences/s (wall) | sentences/s (CPU time) |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {way} | {bleu[way]:.2f} | {rates[way]['wall']:,.1f} | {rates[way]['cpu']:,.1f} |" for way in bleu]
    delta = bleu["document"] - bleu["per line"]
    ratio = rates["document"]["wall"] / rates["per line"]["wall"]
    lines += ["", f"document - per line: **{delta:+.2f} BLEU** (bar: within 0.2), speed **{ratio:.2f}x** (bar: 0.9x)."]
    return "\n".join(lines) + "\n"
