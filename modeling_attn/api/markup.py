"""Marked-up documents translated with their markup kept: `translate_markup(engine, text, "html" | "markdown")`.

A real parser reads the structure (`markup_html`: the standard library's html.parser; `markup_markdown`:
markdown-it-py, CommonMark with tables and strikethrough) into segments (`markup_transfer`): blocks of text with
their inline tags and units, and alt / title values. Each segment is split into sentences as `api.documents` splits
a paragraph (`split_document`, `fit_sentences`); the sentences of all segments are translated in batches, in
document order: those that hold a tag's boundary or a unit with word alignments (`engine.translate_aligned(...,
words=words)`), the others as plain sentences (`translate_batch`). Everything outside translated text is copied byte
for byte. An engine without word alignments (onnxruntime) puts a sentence's tags around the whole sentence, with a
warning naming it; `auto` aligns on whichever of its engines can.

`markup_events(...)` yields one `MarkupEvent` per block, in order, once the batch holding its last sentence is done
(`text`: the source before the block and the block translated; the last event also carries the rest), so that a
server can stream a document; the texts concatenate to `translate_markup`'s answer. docs/translate-evaluate.md,
"Markup", says what is translated and how the tags are carried.
"""

from __future__ import annotations

import bisect
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .documents import Document, _batch_sizes, fit_sentences, source_language, split_document, token_counter
from .markup_transfer import MarkupError, Range, Segment, carry_markup
from .translation import SentenceTooLong, TranslateError

FORMATS = ("html", "markdown")


@dataclass(frozen=True)
class MarkupEvent:
    """Block `index` of a document translated (-1: a document with no text to translate): `text` is the source
    before it and its translation (the last event: and the rest of the document); `line` is where it starts."""

    index: int
    text: str
    line: int


@dataclass
class _Part:
    """A segment with its sentences (spans of its text), their lines, which need word alignments, and whether it
    is a block (else an attribute value inside markup)."""

    segment: Segment
    sentences: list[Range]
    lines: list[int]
    aligned: list[bool]
    block: bool


@dataclass
class MarkedUpDocument:
    """A document parsed and split for an engine (`prepare_markup`): its source, and its segments with sentences
    in source order."""

    source: str
    parts: list[_Part]

    @property
    def blocks(self) -> int:
        return sum(part.block for part in self.parts)


def parse_markup(text: str, format: str) -> tuple[list[Segment], list[Segment]]:
    """The blocks and attribute values of `text` as segments (`markup_transfer`); MarkupError where it cannot."""
    if not isinstance(text, str):
        raise TypeError(f"the document is a {type(text).__name__}, not a str")
    if format == "html":
        from .markup_html import parse_html

        return parse_html(text)
    if format == "markdown":
        from .markup_markdown import parse_markdown

        return parse_markdown(text)
    raise ValueError(f"format must be one of {list(FORMATS)}, got {format!r}")


def _split(segment: Segment, language: str, line_of: Any, counter: tuple) -> tuple[list[Range], list[int]]:
    """The sentence spans of a segment and their lines (`split_document`, then `fit_sentences`)."""
    document = split_document(segment.text, language)
    spans, position = [], 0
    for gap, sentence in zip(document.gaps, document.sentences, strict=False):
        position += len(gap)
        spans.append((position, position + len(sentence)))
        position += len(sentence)
    lines = [line_of(segment.sources[start][0]) for start, _ in spans]
    fitted = fit_sentences(Document(document.sentences, document.gaps, lines), *counter)
    spans, position = [], 0
    for gap, sentence in zip(fitted.gaps, fitted.sentences, strict=False):
        position += len(gap)
        spans.append((position, position + len(sentence)))
        position += len(sentence)
    return spans, fitted.lines


def prepare_markup(engine: Any, text: str, format: str, source_lang: str | None = None) -> MarkedUpDocument:
    """`text` parsed (`parse_markup`) and each segment split into sentences for `engine`'s model."""
    blocks, attributes = parse_markup(text, format)
    language = source_language(engine.model, source_lang)
    line_starts = [0, *(match.end() for match in re.finditer("\n", text))]

    def line_of(offset: int) -> int:
        return bisect.bisect_right(line_starts, offset)

    counter = token_counter(engine.model, engine.tokenizer)
    parts = []
    for segment, block in sorted(
        [(segment, True) for segment in blocks] + [(segment, False) for segment in attributes],
        key=lambda pair: pair[0].span[0],
    ):
        spans, lines = _split(segment, language, line_of, counter)
        if not spans:
            continue  # nothing to translate: the source stays as it is
        inner = [position for element in segment.elements for position in (element.start, element.end)]
        aligned = [any(start < position < end for position in inner) for start, end in spans]
        parts.append(_Part(segment, spans, lines, aligned, block))
    return MarkedUpDocument(text, parts)


class _Source:
    """The source text with the translated attribute values put in (`raw(start, end)`)."""

    def __init__(self, text: str):
        self.text, self.values, self.starts = text, [], []

    def add(self, span: Range, value: str) -> None:
        self.starts.append(span[0])
        self.values.append((span, value))

    def raw(self, start: int, end: int) -> str:
        pieces, position = [], start
        for (value_start, value_end), value in self.values[bisect.bisect_left(self.starts, start) :]:
            if value_end > end:
                break
            pieces += [self.text[position:value_start], value]
            position = value_end
        return "".join(pieces) + self.text[position:end]


def _translate(engine: Any, sentences: list[str], aligned: list[bool], words: str, options: dict) -> list[Any]:
    """Each sentence's translation: an `AlignedTranslation` where `aligned` asks for one and the engine has word
    alignments, else a string."""
    found: list[Any] = [None] * len(sentences)
    for wants_alignment in (False, True):
        rows = [row for row, flag in enumerate(aligned) if flag == wants_alignment]
        if not rows:
            continue
        batch = [sentences[row] for row in rows]
        try:
            if wants_alignment:
                results = engine.translate_aligned(batch, words=words, **options)
            else:
                results = engine.translate_batch(batch, **options)
        except SentenceTooLong as error:
            raise SentenceTooLong(error.detail, rows[error.row]) from None
        for row, result in zip(rows, results, strict=True):
            found[row] = result
    return found


def _can_align(engine: Any, document: MarkedUpDocument, options: dict) -> bool:
    """Whether `engine` aligns words with `options`; a warning naming it where a sentence needs it and it cannot."""
    reason = engine.refusal(options, alignments=True)
    if reason is not None and any(any(part.aligned) for part in document.parts):
        warnings.warn(
            f"the {engine.name} engine {reason}: inline tags go around the whole sentences they are in; "
            "--engine torch (or auto) carries them onto the aligned words",
            stacklevel=3,
        )
    return reason is None


def markup_events(
    engine: Any,
    text: str | MarkedUpDocument,
    format: str = "html",
    source_lang: str | None = None,
    batch_size: int = 32,
    words: str = "whitespace",
    ramp: bool = False,
    translate: Callable[[list[str], list[bool]], list[Any]] | None = None,
    **options: Any,
) -> Iterator[MarkupEvent]:
    """The document translated on `engine` (`translate_batch` / `translate_aligned` with `options`) in batches of
    `batch_size` sentences (growing from 1 when `ramp`), one event per block, in order (module docstring).
    `translate(sentences, aligned)`, if given, translates a batch instead (a server's queue): a string per sentence,
    an `AlignedTranslation` where `aligned` asks for one."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    per_sentence = sorted(set(options) & {"target_prefix", "constraints", "num_return_sequences"})
    if per_sentence:
        raise TranslateError(f"{', '.join(per_sentence)}: per-sentence settings do not apply to a document")
    document = text if isinstance(text, MarkedUpDocument) else prepare_markup(engine, text, format, source_lang)
    can_align = _can_align(engine, document, options)
    parts, source = document.parts, _Source(document.source)
    flat = [(number, index) for number, part in enumerate(parts) for index in range(len(part.sentences))]
    results: list[list[Any]] = [[None] * len(part.sentences) for part in parts]
    blocks = [number for number, part in enumerate(parts) if part.block]
    done = next_block = position = start = 0  # parts translated; the next block to write; source written; sentences
    for size in _batch_sizes(len(flat), batch_size, ramp):
        batch = flat[start : start + size]
        sentences = [parts[n].segment.text[slice(*parts[n].sentences[i])] for n, i in batch]
        aligned = [can_align and parts[n].aligned[i] for n, i in batch]
        try:
            if translate is None:
                translations = _translate(engine, sentences, aligned, words, options)
            else:
                translations = translate(sentences, aligned)
        except SentenceTooLong as error:
            number, index = batch[error.row]
            raise TranslateError(f"line {parts[number].lines[index]}: the sentence {error.detail}") from None
        for (number, index), translation in zip(batch, translations, strict=True):
            results[number][index] = translation
        start += size
        while done < len(parts) and all(result is not None for result in results[done]):
            if not parts[done].block:
                part = parts[done]
                source.add(part.segment.span, carry_markup(part.segment, part.sentences, results[done], source.raw))
            done += 1
        while next_block < len(blocks):
            part, last = parts[blocks[next_block]], next_block == len(blocks) - 1
            if (last and done < len(parts)) or (
                done < len(parts) and parts[done].segment.span[0] < part.segment.span[1]
            ):
                break
            translated = carry_markup(part.segment, part.sentences, results[blocks[next_block]], source.raw, words)
            text_out = source.raw(position, part.segment.span[0]) + translated
            position = part.segment.span[1]
            if last:
                text_out += source.raw(position, len(document.source))
            yield MarkupEvent(next_block, text_out, part.lines[0])
            next_block += 1
    if not blocks:
        yield MarkupEvent(-1, source.raw(0, len(document.source)), 0)


def translate_markup(
    engine: Any,
    text: str,
    format: str = "html",
    source_lang: str | None = None,
    batch_size: int = 32,
    words: str = "whitespace",
    **options: Any,
) -> str:
    """`text`, an HTML or Markdown document (`format`), translated with its markup kept (module docstring); `words`
    is what a word is for the alignments ("whitespace" or "alnum")."""
    events = markup_events(engine, text, format, source_lang, batch_size, words, **options)
    return "".join(event.text for event in events)


__all__ = [
    "FORMATS",
    "MarkedUpDocument",
    "MarkupError",
    "MarkupEvent",
    "markup_events",
    "parse_markup",
    "prepare_markup",
    "translate_markup",
]
