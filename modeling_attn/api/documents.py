"""Documents: running text translated a sentence at a time, its paragraphs, line breaks and whitespace kept.

`split_document(text, language)` cuts a text into the sentences to translate and the text between them (a
`Document`: `gaps[i]` comes before `sentences[i]`, the last gap ends the text; `document.join(document.sentences)
== text` byte for byte). A line break always ends a sentence (a line of an address, a list or a poem stays a line);
within a line, sentencex (Wikimedia's segmenter: rules for ~300 languages with fallbacks between related ones,
maintained; pysbd covers 22 and has not been released since 2021) finds the sentence ends, and the whitespace around
each sentence goes into the gaps. `fit_sentences` splits a sentence longer than the model's position table at its
clause boundaries (`,` `;` `:` and spaced dashes), the middlemost first, or refuses it by its line
(`SentenceTooLong`); never cut silently.

`document_events(engine, text, ...)` translates the sentences in batches through any engine (`engines.Engine`) and
yields one `DocumentEvent` per sentence, in order, as its batch is done (the first batches small when `ramp` is
set, so a stream's first sentence comes early); their `text`s concatenate to `translate_document(...)`'s answer.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .translation import SentenceTooLong, TranslateError

LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Where a long sentence may be split: after a comma, semicolon or colon, or before a spaced dash, at whitespace.
CLAUSE_BOUNDARY = re.compile(r"(?<=[,;:،、，；：])\s+|\s+(?=[–—-]\s)")
FALLBACK_LANGUAGE = "en"


@dataclass(frozen=True)
class Document:
    """A text as its sentences and the text around them: `gaps` has one more item than `sentences`; `lines[i]` is
    the (1-based) line of the text where sentence i starts."""

    sentences: list[str]
    gaps: list[str]
    lines: list[int]

    def join(self, translations: list[str]) -> str:
        """The text with each sentence replaced by its translation."""
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(translations)} translations for a document of {len(self.sentences)} sentences")
        joined = (gap + translation for gap, translation in zip(self.gaps, translations, strict=False))
        return "".join(joined) + self.gaps[-1]


@dataclass(frozen=True)
class DocumentEvent:
    """Sentence `index` of a document translated: `text` is the text before it (whitespace, line breaks) and its
    translation; the last event's `text` also carries the text after the last sentence (a document with no
    sentence: one event, index -1, whose `text` is the document)."""

    index: int
    source: str
    translation: str
    text: str
    line: int


def _sentences_of_line(line: str, language: str) -> list[tuple[int, int]]:
    """The (start, end) spans of the sentences of one line, their surrounding whitespace left out."""
    from sentencex import segment

    spans, start = [], 0
    for piece in segment(language, line):
        stripped = piece.strip()
        if stripped:
            begin = start + (len(piece) - len(piece.lstrip()))
            spans.append((begin, begin + len(stripped)))
        start += len(piece)
    if start != len(line):  # sentencex's segments cover the line; if that ever changes, fail loudly, not silently
        raise RuntimeError(f"sentencex's segments of a line cover {start} of its {len(line)} characters")
    return spans


def split_document(text: str, language: str | None = None) -> Document:
    """The sentences of `text` and the text between them (module docstring); `language` is an ISO 639 code for
    sentencex (None: English rules)."""
    if not isinstance(text, str):
        raise TypeError(f"the document is a {type(text).__name__}, not a str")
    sentences, gaps, lines, position = [], [], [], 0
    line_starts = [0, *(match.end() for match in LINE_BREAK.finditer(text))]
    for number, start in enumerate(line_starts, 1):
        line_break = LINE_BREAK.search(text, start)
        line = text[start : line_break.start() if line_break else len(text)]
        for begin, end in _sentences_of_line(line, language or FALLBACK_LANGUAGE):
            gaps.append(text[position : start + begin])
            sentences.append(line[begin:end])
            lines.append(number)
            position = start + end
    gaps.append(text[position:])
    return Document(sentences, gaps, lines)


def _clause_split(sentence: str) -> tuple[str, str, str] | None:
    """The sentence cut at its clause boundary nearest the middle: (before, whitespace, after), or None."""
    middle = len(sentence) / 2
    boundaries = [match for match in CLAUSE_BOUNDARY.finditer(sentence) if 0 < match.start() < len(sentence)]
    if not boundaries:
        return None
    best = min(boundaries, key=lambda match: abs((match.start() + match.end()) / 2 - middle))
    return sentence[: best.start()], best.group(), sentence[best.end() :]


def fit_sentences(document: Document, count_tokens: Callable[[list[str]], list[int]], limit: int | None) -> Document:
    """`document` with every sentence of more than `limit` tokens (`count_tokens(sentences)`, end token included)
    split at clause boundaries until each piece fits; SentenceTooLong naming its line where a piece cannot be split
    further. The pieces are sentences of the result, the whitespace between them a gap, so nothing is lost."""
    if limit is None:
        return document
    sentences, gaps, lines = [], [document.gaps[0]], []
    counts = count_tokens(document.sentences) if document.sentences else []
    pending = list(zip(document.sentences, document.gaps[1:], document.lines, counts, strict=True))[::-1]
    while pending:
        sentence, gap, line, count = pending.pop()
        if count <= limit:
            sentences.append(sentence), gaps.append(gap), lines.append(line)
            continue
        cut = _clause_split(sentence)
        if cut is None:
            shown = f"{sentence[:40]!r}{'...' if len(sentence) > 40 else ''}"
            raise SentenceTooLong(
                f"line {line}: the sentence {shown} has {count} tokens, more than the model's limit of {limit}, "
                "and no clause boundary (, ; : or a spaced dash) to split it at; split it",
                len(sentences),
            )
        before, space, after = cut
        before_count, after_count = count_tokens([before, after])
        pending.extend([(after, gap, line, after_count), (before, space, line, before_count)])
    return Document(sentences, gaps, lines)


def source_language(model: Any, given: str | None) -> str:
    """The language whose sentence rules split the document: `given`, else the model's `config.source_lang` (saved
    by `attn train`), else English rules with a warning."""
    language = given or getattr(getattr(model, "config", None), "source_lang", None)
    if language:
        return language
    warnings.warn(
        "the model's config names no source language (config.source_lang): sentences are split with English "
        "rules; give the source language (--source_lang)",
        stacklevel=3,
    )
    return FALLBACK_LANGUAGE


def token_counter(model: Any, tokenizer: Any) -> tuple[Callable[[list[str]], list[int]], int | None]:
    """Counting a list of sentences' tokens as the model reads them (end token included), and the model's limit."""
    limit = getattr(model.config, "max_position_embeddings", None)

    def count(sentences: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(sentences)["input_ids"]]

    return count, limit


def prepare_document(engine: Any, text: str, source_lang: str | None = None) -> Document:
    """`text` split for `engine`'s model (`split_document` in the source language, `fit_sentences` to its limit)."""
    document = split_document(text, source_language(engine.model, source_lang))
    return fit_sentences(document, *token_counter(engine.model, engine.tokenizer))


def _batch_sizes(total: int, batch_size: int, ramp: bool) -> Iterator[int]:
    """Batch sizes covering `total` sentences: `batch_size` each, or 1, 2, 4, ... up to it when `ramp`."""
    size = 1 if ramp else batch_size
    while total > 0:
        yield min(size, total)
        total -= size
        size = min(2 * size, batch_size)


def document_events(
    engine: Any,
    text: str | Document,
    batch_size: int = 32,
    source_lang: str | None = None,
    ramp: bool = False,
    **options: Any,
) -> Iterator[DocumentEvent]:
    """The document's sentences translated in batches on `engine` (`translate_batch(..., **options)`), one event per
    sentence in order (module docstring)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    per_sentence = sorted(set(options) & {"target_prefix", "constraints"})
    if per_sentence:
        raise TranslateError(f"{', '.join(per_sentence)}: per-sentence settings do not apply to a document")
    document = text if isinstance(text, Document) else prepare_document(engine, text, source_lang)
    start, last = 0, len(document.sentences) - 1
    if last < 0:
        yield DocumentEvent(-1, "", "", document.gaps[0], 0)  # nothing to translate: the text as it is
        return
    for size in _batch_sizes(len(document.sentences), batch_size, ramp):
        batch = document.sentences[start : start + size]
        try:
            translations = engine.translate_batch(batch, **options)
        except SentenceTooLong as error:  # over a limit of the engine's own (fit_sentences used the model's)
            raise TranslateError(f"line {document.lines[start + error.row]}: the sentence {error.detail}") from None
        for offset, translation in enumerate(translations):
            index = start + offset
            tail = document.gaps[-1] if index == last else ""
            text_out = document.gaps[index] + translation + tail
            yield DocumentEvent(index, batch[offset], translation, text_out, document.lines[index])
        start += size


def translate_document(
    engine: Any, text: str, batch_size: int = 32, source_lang: str | None = None, **options: Any
) -> str:
    """`text` translated sentence by sentence, its whitespace, line breaks and paragraphs kept (module docstring)."""
    return "".join(event.text for event in document_events(engine, text, batch_size, source_lang, **options))


__all__ = [
    "Document",
    "DocumentEvent",
    "document_events",
    "fit_sentences",
    "prepare_document",
    "source_language",
    "split_document",
    "translate_document",
]
