"""BLEU on lowercased, Moses-tokenized text, on the command line: how the published Multi30k numbers are computed.

That is Moses' `lowercase.perl | normalize-punctuation.perl | tokenizer.perl`, then `multi-bleu.perl`.

The implementation is the package's `evaluate` module `multi30k_bleu`
(`modeling_attn/api/evaluate_modules/multi30k_bleu.py`, where the steps are described; loadable offline with
`evaluate.load(modeling_attn.api.metrics.module_path("multi30k_bleu"))`): `lowercase_tokenize`, `multi_bleu` and
`lowercased_tokenized_bleu` below are its functions.

Command line: `python -m bench multi30k_bleu --lang de HYPOTHESES REFERENCES[.gz]` prints the score as JSON (a scorer:
it writes no results file).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from modeling_attn.api.evaluate_modules.multi30k_bleu import (  # noqa: F401  (this module's API)
    lowercase_tokenize,
    lowercased_tokenized_bleu,
    multi_bleu,
)


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file, gzipped when its name ends in .gz."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        return file.read().splitlines()


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench multi30k_bleu", description=__doc__.split("\n")[0])
    parser.add_argument("hypotheses", help="model output, one detokenized sentence per line")
    parser.add_argument("references", help="raw references, one per line (.gz allowed)")
    parser.add_argument("--lang", required=True, help="target language code for the Moses rules (en, de, fr)")
    args = parser.parse_args(argv)
    hypotheses, references = read_lines(args.hypotheses), read_lines(args.references)
    if len(hypotheses) != len(references):
        parser.error(f"{args.hypotheses}: {len(hypotheses)} lines but {args.references}: {len(references)}")
    score, signature = lowercased_tokenized_bleu(hypotheses, references, args.lang)
    result = {"bleu_lc_tok": round(score.score, 2), "detail": str(score), "signature": signature}
    print(json.dumps(result))
    return result
