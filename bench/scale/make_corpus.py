"""A synthetic parallel corpus of WMT14 EN-DE's size and shape, written as gzipped text files for `attn train --data`.

`python -m bench scale_corpus /tmp/wmt-synth --pairs 4500000` writes train.en.gz / train.de.gz (and 3,000-pair
valid and test files). The words are made up; what matches WMT14 EN-DE (news + Europarl + Common Crawl) is what
the data pipeline cares about: the number of pairs, sentence lengths (log-normal, median ~22 words, a long tail
past 100 words, a few one-word lines), a Zipf-distributed vocabulary of 200,000 word types per language (so a joint
BPE has real merges to learn) and targets about 5% longer than their sources with per-pair noise. Same seed, same
files.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import string
from pathlib import Path

import numpy as np

WORD_TYPES = 200_000
CHUNK = 100_000


def make_vocabulary(rng: np.random.Generator, size: int) -> np.ndarray:
    """`size` distinct made-up words, 1 to 14 letters (short ones frequent: the list is sorted by length, and Zipf
    ranks favour the start)."""
    letters = np.array(list(string.ascii_lowercase))
    lengths = np.clip(rng.poisson(5.5, size * 2), 1, 14)
    words = sorted({"".join(rng.choice(letters, n)) for n in lengths}, key=len)
    return np.array(words[:size], dtype=object)


def sentence_lengths(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths in words: log-normal around 22 words (sigma 0.6), clipped to 1..250; the target is
    the source times a log-normal ratio (median 1.05, sigma 0.15)."""
    source = np.clip(np.round(rng.lognormal(np.log(22), 0.6, count)), 1, 250).astype(np.int64)
    target = np.clip(np.round(source * rng.lognormal(np.log(1.05), 0.15, count)), 1, 250).astype(np.int64)
    return source, target


def zipf_words(rng: np.random.Generator, vocabulary: np.ndarray, count: int) -> np.ndarray:
    ranks = rng.zipf(1.1, count * 2)
    ranks = ranks[ranks <= len(vocabulary)][:count]
    while len(ranks) < count:  # the rejected tail is rare; top up
        more = rng.zipf(1.1, count)
        ranks = np.concatenate([ranks, more[more <= len(vocabulary)]])[:count]
    return vocabulary[ranks - 1]


def write_split(folder: Path, stem: str, pairs: int, rng: np.random.Generator, vocabularies: dict) -> None:
    with contextlib.ExitStack() as stack:
        handles = {
            lang: stack.enter_context(gzip.open(folder / f"{stem}.{lang}.gz", "wt", encoding="utf-8", compresslevel=1))
            for lang in vocabularies
        }
        for start in range(0, pairs, CHUNK):
            count = min(CHUNK, pairs - start)
            lengths = dict(zip(vocabularies, sentence_lengths(rng, count), strict=True))
            for lang, vocabulary in vocabularies.items():
                words = zipf_words(rng, vocabulary, int(lengths[lang].sum()))
                cuts = np.cumsum(lengths[lang])[:-1]
                lines = [" ".join(sentence) for sentence in np.split(words, cuts)]
                # Sentences start with a capital and end with a full stop, as news text does.
                handles[lang].write("".join(f"{line[:1].upper()}{line[1:]} .\n" for line in lines))


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench scale_corpus", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    vocabularies = {"en": make_vocabulary(rng, WORD_TYPES), "de": make_vocabulary(rng, WORD_TYPES)}
    for stem, pairs in (("train", args.pairs), ("valid", 3000), ("test", 3000)):
        write_split(args.folder, stem, pairs, rng, vocabularies)
    print(f"{args.folder}: {args.pairs} training pairs")
    return {"folder": str(args.folder), "pairs": args.pairs, "seed": args.seed}
