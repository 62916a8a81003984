"""BLEU on lowercased, Moses-tokenized text, on the command line: how the published Multi30k numbers are computed.

That is Moses' `lowercase.perl | normalize-punctuation.perl | tokenizer.perl`, then `multi-bleu.perl`.

The implementation is the package's `evaluate` module `multi30k_bleu`
(`modeling_attn/api/evaluate_modules/multi30k_bleu.py`, where the steps are described; loadable offline with
`evaluate.load(modeling_attn.api.metrics.module_path("multi30k_bleu"))`): `lowercase_tokenize`, `multi_bleu` and
`lowercased_tokenized_bleu` below are its functions.

Command line: `python bench/multi30k/bleu.py --lang de HYPOTHESES REFERENCES[.gz]` prints the score as JSON.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="BLEU on lowercased, Moses-tokenized text (multi-bleu.perl style)")
    parser.add_argument("hypotheses", help="model output, one detokenized sentence per line")
    parser.add_argument("references", help="raw references, one per line (.gz allowed)")
    parser.add_argument("--lang", required=True, help="target language code for the Moses rules (en, de, fr)")
    args = parser.parse_args(argv)
    hypotheses, references = read_lines(args.hypotheses), read_lines(args.references)
    if len(hypotheses) != len(references):
        print(f"{args.hypotheses}: {len(hypotheses)} lines but {args.references}: {len(references)}", file=sys.stderr)
        return 2
    score, signature = lowercased_tokenized_bleu(hypotheses, references, args.lang)
    print(json.dumps({"bleu_lc_tok": round(score.score, 2), "detail": str(score), "signature": signature}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
