"""Constraints as text: phrases per sentence (`--constraints FILE`, `constraints=`), glossaries (`--glossary FILE`).

A constraints file has one line per input sentence: its target phrases, tab-separated (fairseq's format); an empty
line: none. A glossary is a TSV of `source term<TAB>target term`; where a source sentence contains a term
(case-sensitive, whole words), its target term becomes a constraint (`Glossary.targets`). Phrases become token ids
with the model's tokenizer as target text (`phrase_ids`), and the search (`modeling_attn.constraints`) makes every
translation contain them where they fit within its length limit; `missing_phrases` says which ones a translation
lacks, as the commands report them. docs/translate-evaluate.md, "Constraints and glossaries".
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import UserError


class ConstraintError(UserError, ValueError):
    """A constraints file, glossary or `constraints=` argument that is wrong; the message names where."""


class ConstraintWarning(UserWarning):
    """A translation that lacks a constraint: it did not fit within the sentence's length limit."""


# -- phrases as text ----------------------------------------------------------------------------------------------


def phrase_ids(tokenizer: Any, phrase: str) -> list[int]:
    """`phrase`'s token ids as target text, no special tokens: as the phrase tokenizes alone, which for the
    Metaspace (SentencePiece) tokenizers of this project is how it tokenizes after a space inside a sentence. A
    tokenizer where the two differ (byte-level BPE's "Ġ") gets the form inside a sentence."""
    alone = tokenizer(text_target=phrase, add_special_tokens=False)["input_ids"]
    twice = tokenizer(text_target=f"{phrase} {phrase}", add_special_tokens=False)["input_ids"]
    if twice[: len(alone)] == alone and twice[len(alone) :] != alone and twice[len(alone) :]:
        return twice[len(alone) :]
    return alone


def sentence_phrase_ids(tokenizer: Any, constraints: Sequence[Sequence[str]]) -> list[list[list[int]]]:
    """Per sentence, its phrases' token ids (`phrase_ids`); ConstraintError for a phrase that is not a non-empty
    string or has no tokens."""
    found = []
    for row, phrases in enumerate(constraints):
        if isinstance(phrases, str):
            raise ConstraintError(f"constraints[{row}]: give a list of phrases, not one string: {phrases!r:.40}")
        ids = []
        for phrase in phrases:
            if not isinstance(phrase, str) or not phrase.strip():
                raise ConstraintError(f"constraints[{row}]: {phrase!r:.40} is not a phrase (a non-empty string)")
            tokens = phrase_ids(tokenizer, phrase)
            if not tokens:
                raise ConstraintError(f"constraints[{row}]: {phrase!r:.40} has no tokens")
            ids.append(tokens)
        found.append(ids)
    return found


def missing_phrases(tokenizer: Any, translation: str, phrases: Sequence[str]) -> list[str]:
    """The phrases not in `translation`, as text: each phrase as the tokenizer decodes it (its normalization), each
    as many times as it is given."""
    missing = []
    for phrase, count in Counter(phrases).items():
        ids = phrase_ids(tokenizer, phrase)
        text = tokenizer.decode(ids, skip_special_tokens=True).strip() or phrase
        if translation.count(text) < count:
            missing.append(phrase)
    return missing


def warn_unmet(row: int, phrases: Sequence[str]) -> None:
    """A ConstraintWarning for sentence `row` of a call whose translation lacks `phrases`."""
    listed = ", ".join(repr(phrase) for phrase in phrases)
    warnings.warn(
        ConstraintWarning(
            f"sentence {row} of the batch: the translation lacks the constraint {listed} (it did not fit within the "
            "length limit)"
        ),
        stacklevel=3,
    )


# -- files ----------------------------------------------------------------------------------------------------------


def parse_constraint_line(line: str, where: str) -> list[str]:
    """One line of a constraints file: tab-separated target phrases (fairseq's format); empty: none."""
    if not line.strip():
        return []
    phrases = line.split("\t")
    for index, phrase in enumerate(phrases, start=1):
        if not phrase.strip():
            raise ConstraintError(
                f"{where}: constraint {index} is empty (a doubled, leading or trailing tab); separate phrases by "
                "one tab"
            )
    return [phrase.strip() for phrase in phrases]


def read_constraints(path: str, sentences: int | None = None) -> list[list[str]]:
    """The constraints file `path`, one line per input sentence; with `sentences`, ConstraintError unless it has
    exactly that many lines."""
    from .corpus import decode_lines

    with open(path, "rb") as handle:
        lines = [parse_constraint_line(line, f"{path}:{number}") for number, line in decode_lines(handle, path)]
    if sentences is not None and len(lines) != sentences:
        raise ConstraintError(
            f"--constraints {path}: {len(lines)} lines for {sentences} input sentences; give one line per input "
            "sentence (an empty line: no constraint)"
        )
    return lines


@dataclass(frozen=True)
class Glossary:
    """Pairs (source term, target term): where a source sentence contains the term, the target term becomes one of
    its constraints. A term matches case-sensitively and as whole words: not inside a longer word (a letter, digit
    or underscore on either side stops it); spaces inside a term match exactly one space."""

    entries: tuple[tuple[str, str], ...]

    @classmethod
    def read(cls, path: str) -> Glossary:
        """A TSV file `source term<TAB>target term` per line; empty lines and lines starting with # are skipped."""
        from .corpus import decode_lines

        entries = []
        with open(path, "rb") as handle:
            for number, line in decode_lines(handle, path):
                if not line.strip() or line.startswith("#"):
                    continue
                fields = line.split("\t")
                if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
                    what = (
                        "no tab"
                        if len(fields) == 1
                        else f"{len(fields)} fields"
                        if len(fields) > 2
                        else "an empty term"
                    )
                    raise ConstraintError(
                        f"--glossary {path}:{number}: {what}; write `source term<TAB>target term`, one pair per line"
                    )
                entries.append((fields[0].strip(), fields[1].strip()))
        return cls(tuple(entries))

    def targets(self, sentence: str) -> list[str]:
        """The target terms of the source terms `sentence` contains (each once per occurrence), in glossary order."""
        found = []
        for source, target in self.entries:
            pattern = rf"(?<!\w){re.escape(source)}(?!\w)"
            found += [target] * len(re.findall(pattern, sentence))
        return found


__all__ = [
    "ConstraintError",
    "ConstraintWarning",
    "Glossary",
    "missing_phrases",
    "parse_constraint_line",
    "phrase_ids",
    "read_constraints",
    "sentence_phrase_ids",
    "warn_unmet",
]
