"""BLEU on lowercased, Moses-tokenized text: the way the published Multi30k numbers are computed.

The Multi30k repository (`multi30k/dataset`, `scripts/task1-tokenize.sh`) builds its `*.lc.norm.tok.*` files with
Moses' `lowercase.perl | normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG` (XML escaping on, no `-a`
hyphen splitting), and papers score their output on those files with Moses' `multi-bleu.perl`. Here:

- `lowercase_tokenize` does the same three steps with `sacremoses` (the Python port of the Moses scripts):
  `str.lower()`, `MosesPunctNormalizer(lang).normalize`, `MosesTokenizer(lang).tokenize(escape=True)`. The
  hypotheses (detokenized model output) and the raw references both go through it.
- `multi_bleu` is `multi-bleu.perl` on the tokens: corpus BLEU-4 from n-gram counts summed over all sentences,
  tokens split on whitespace, no smoothing (any zero n-gram precision gives 0), brevity penalty exp(1 - r/c) when
  the hypotheses are shorter than the references. That is sacreBLEU's `BLEU(tokenize="none", smooth_method="none")`,
  which this calls, so the signature records the settings.

Escaping (`'` -> `&apos;`) maps tokens one to one, so it changes no match and no length: BLEU is the same with or
without it; it is kept only to reproduce the reference files byte for byte.

Command line: `python bench/multi30k/bleu.py --lang de HYPOTHESES REFERENCES[.gz]` prints the score as JSON.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from sacrebleu.metrics import BLEU
from sacrebleu.metrics.bleu import BLEUScore
from sacremoses import MosesPunctNormalizer, MosesTokenizer


@cache
def _moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer]:
    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def lowercase_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """`lowercase.perl | normalize-punctuation.perl -l lang | tokenizer.perl -l lang` of each line."""
    normalizer, tokenizer = _moses(lang)
    return [
        tokenizer.tokenize(normalizer.normalize(line.strip().lower()), escape=True, return_str=True) for line in lines
    ]


def multi_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[BLEUScore, str]:
    """`multi-bleu.perl` of already tokenized lines (one reference each): corpus BLEU-4, no smoothing.

    Returns the score and sacreBLEU's signature of the settings."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("no hypotheses to score")
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score(list(hypotheses), [list(references)]), str(metric.get_signature())


def lowercased_tokenized_bleu(
    hypotheses: Sequence[str], references: Sequence[str], lang: str
) -> tuple[BLEUScore, str]:
    """BLEU of raw (detokenized, cased) hypotheses against raw references, on lowercased Moses tokens.

    Returns the score and a signature: the preprocessing in words, then sacreBLEU's (tok:none, smooth:none)."""
    score, settings = multi_bleu(lowercase_tokenize(hypotheses, lang), lowercase_tokenize(references, lang))
    return score, f"lc+moses-norm+moses-tok({lang},escape,no -a) [sacremoses]|{settings}"


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
