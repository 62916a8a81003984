"""Inline markup carried onto a translation: a block's text, its inline elements, and where they go in the target.

A `Segment` is one block of a marked-up document (a paragraph, heading, list item, table cell, title, an alt or title
value): `text`, the characters its sentences are cut from (whitespace is a space there, but a hard break, `<br>`,
and a blank line are line breaks, which end sentences), each with the source characters it came from (`sources`),
and its inline `elements` in source order: tags (`<b>`, `**`, `[`...`](url)`) around text, and units (inline code,
images, comments) at one position, never translated. Every source character of a block belongs to exactly one
character, tag or unit, so what is not translated is written back byte for byte.

`place_elements` puts the elements onto the translation (hard word alignments): a tag wraps the span from the first
to the last target word aligned to a source word it wrapped (the text between sentences it covered included);
children stay inside their parent; where sibling tags' spans cross, a tag is cut at the words aligned to its
siblings and keeps its longest run; a tag left with no word takes the free target word at its anchor, else stays
empty there; a unit sits at its anchor: after the translation of the nearest source word before it (else before
the next one's), exactly where it was when it lies between sentences. A sentence translated without an alignment (a
string) links each source word to every target word: its tags wrap it whole. docs/translate-evaluate.md, "Markup".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .alignment import split_words
from .translation import TranslateError

Range = tuple[int, int]  # [start, end) character offsets into the source document
WHITESPACE = " \t\n\r\f"
BLANK_LINE = re.compile(r"(?:\r\n|\r|\n)[ \t\f]*(?:\r\n|\r|\n)")  # a paragraph break in running text: ends a sentence


class MarkupError(TranslateError):
    """Markup that cannot be carried (an HTML tag closed with no opening, an inline tag left open); the message
    names its line."""


@dataclass
class Element:
    """An inline tag (`close` is its closing markup) or a unit (`close` None: `open` is all of it, kept whole):
    `open`/`close` are source ranges; `start`/`end` are offsets into the segment's text (a unit: start == end)."""

    open: Range
    close: Range | None
    start: int
    end: int
    parent: int | None
    line: int

    @property
    def unit(self) -> bool:
        return self.close is None


@dataclass
class Segment:
    """One block (module docstring): `span` is the source range it replaces, `escape` makes translated text safe in
    the format (`&` and `<` in HTML, Markdown's punctuation), `quote` wraps the result (an unquoted attribute)."""

    span: Range
    text: str = ""
    sources: list[Range] = field(default_factory=list)
    elements: list[Element] = field(default_factory=list)
    escape: Callable[[str], str] = str
    quote: str = ""


class SegmentBuilder:
    """Builds a `Segment` in source order: `chars`, `open`/`close` of tags, `unit`s; `finish` checks that every tag
    was closed."""

    def __init__(self, start: int, escape: Callable[[str], str] = str, quote: str = ""):
        self.segment = Segment((start, start), escape=escape, quote=quote)
        self.stack: list[int] = []

    def chars(self, text: str, source: Range, literal: bool = True) -> None:
        """`text` from the source range `source`: `literal`, one source character each (whitespace becomes a space,
        but for the line breaks of a blank line), else all of `source` behind the first character (an entity)."""
        segment, (start, end) = self.segment, source
        if literal:
            if len(text) != end - start:
                raise ValueError(f"{len(text)} literal characters for a source range of {end - start}")
            kept = {position for match in BLANK_LINE.finditer(text) for position in range(*match.span())}
            segment.text += "".join(
                " " if char in WHITESPACE and offset not in kept else char for offset, char in enumerate(text)
            )
            segment.sources.extend((start + offset, start + offset + 1) for offset in range(len(text)))
        else:
            segment.text += text
            segment.sources.extend([(start, end)] + [(end, end)] * (len(text) - 1))
        self._reach(end)

    def line_break(self, source: Range) -> None:
        """A hard line break (`<br>`, Markdown's two spaces or backslash before a line end): "\n", a sentence end."""
        self.chars("\n", source, literal=False)

    def open(self, source: Range, line: int) -> None:
        position = len(self.segment.text)
        parent = self.stack[-1] if self.stack else None
        self.segment.elements.append(Element(source, None, position, position, parent, line))
        self.stack.append(len(self.segment.elements) - 1)
        self._reach(source[1])

    def close(self, source: Range) -> None:
        element = self.segment.elements[self.stack.pop()]
        element.close, element.end = source, len(self.segment.text)
        self._reach(source[1])

    def unit(self, source: Range, line: int) -> None:
        position = len(self.segment.text)
        parent = self.stack[-1] if self.stack else None
        self.segment.elements.append(Element(source, None, position, position, parent, line))
        self._reach(source[1])

    def _reach(self, end: int) -> None:
        self.segment.span = (self.segment.span[0], max(self.segment.span[1], end))

    def finish(self) -> Segment:
        if self.stack:
            raise ValueError(f"{len(self.stack)} tags of the segment were not closed")
        return self.segment


@dataclass
class _Sentence:
    """A sentence of the segment: its source span, its target span in the target text, its source words (source
    spans) with the target items each is aligned to."""

    source: Range
    target: Range
    words: list[tuple[Range, list[int]]]


@dataclass
class Placement:
    """A segment's translation laid out: `text` (gaps and translations), which characters are gap characters (the
    segment character each copies), the target range of every element, and the sentences."""

    text: str
    gap_chars: dict[int, int]
    ranges: list[Range]
    sentences: list[_Sentence]


def _pairs(translation: Any, source: str, words: str) -> tuple[str, list[Range], list[Range], list[tuple[int, int]]]:
    """The target text, source and target word spans, and (source word, target word) links of one translation: its
    hard alignment where it has one whose words are these, else every source word linked to every target word."""
    text = translation if isinstance(translation, str) else translation.text
    source_words, target_words = split_words(source, words), split_words(text, words)
    alignment = getattr(translation, "alignment", None)
    same_words = alignment is not None and (
        [source[a:b] for a, b in source_words] == list(alignment.source_words)
        and [text[a:b] for a, b in target_words] == list(alignment.target_words)
    )
    if same_words:
        return text, source_words, target_words, list(alignment.pairs)
    every = [(i, j) for i in range(len(source_words)) for j in range(len(target_words))]
    return text, source_words, target_words, every


def lay_out(
    segment: Segment, sentences: Sequence[Range], translations: Sequence[Any], words: str = "whitespace"
) -> tuple[str, dict[int, int], list[Range], list[tuple[Range, list[int]]], list[_Sentence]]:
    """The target text of a segment whose sentences (spans of `segment.text`) have these translations (strings, or
    `AlignedTranslation`s), its gap characters, its items (target words and gap characters, in order), the source
    items (source spans, each with its target items) and the sentences."""
    text, gap_chars, items, source_items, laid = [], {}, [], [], []
    length = position = 0

    def gap(until: int) -> None:
        nonlocal length, position
        for offset in range(position, until):
            gap_chars[length] = offset
            source_items.append(((offset, offset + 1), [len(items)]))
            items.append((length, length + 1))
            text.append(segment.text[offset])
            length += 1
        position = until

    for (start, end), translation in zip(sentences, translations, strict=True):
        gap(start)
        target, source_words, target_words, pairs = _pairs(translation, segment.text[start:end], words)
        first = len(items)
        items.extend((length + a, length + b) for a, b in target_words)
        linked: list[list[int]] = [[] for _ in source_words]
        for source_word, target_word in pairs:
            linked[source_word].append(first + target_word)
        words_of = [
            ((start + a, start + b), sorted(set(targets)))
            for (a, b), targets in zip(source_words, linked, strict=True)
        ]
        source_items.extend(words_of)
        laid.append(_Sentence((start, end), (length, length + len(target)), words_of))
        text.append(target)
        length, position = length + len(target), end
    gap(len(segment.text))
    return "".join(text), gap_chars, items, source_items, laid


class _Placer:
    """`place_elements`' state: the target items, each element's target items (`own`), the placed ranges."""

    def __init__(
        self, segment: Segment, items: list[Range], source_items: list, sentences: list[_Sentence], text: str
    ):
        self.elements, self.items, self.sentences = segment.elements, items, sentences
        self.words = [bool(text[start:end].strip()) for start, end in items]  # a word, not a gap's whitespace
        self.children: dict[int | None, list[int]] = {None: []}
        self.own: list[set[int]] = []
        for index, element in enumerate(segment.elements):
            self.children.setdefault(element.parent, []).append(index)
            self.children[index] = []
            covered = [targets for (a, b), targets in source_items if a < element.end and b > element.start]
            self.own.append(set() if element.unit else set().union(*covered))
        self.ranges: list[Range] = [(0, 0)] * len(segment.elements)

    def place(self, parent: int | None, low: int, high: int) -> None:
        """Place the children of `parent` (None: the segment's top-level elements) inside [low, high]."""
        placed: list[Range] = []
        siblings = self.children[parent]
        for child in siblings:
            unit = self.elements[child].unit
            run = [] if unit else self._run(child, siblings, placed, low, high)
            if run:
                self.ranges[child] = (self.items[run[0]][0], self.items[run[-1]][1])
            else:
                position = self._anchor(self.elements[child].start, low, high, placed)
                word = None if unit else self._neighbour(position, child, siblings, placed, low, high)
                self.ranges[child] = (position, position) if word is None else self.items[word]
            placed.append(self.ranges[child])
            self.place(child, *self.ranges[child])

    def _run(self, child: int, siblings: list[int], placed: list[Range], low: int, high: int) -> list[int]:
        """The longest run of `child`'s target items inside [low, high] that no placed sibling holds, cut at items
        aligned to its other siblings and at placed siblings (crossing spans repaired); the first of equals."""
        items = self.items

        def free(item: int) -> bool:
            start, end = items[item]
            return low <= start and end <= high and not any(a <= start and end <= b for a, b in placed if a < b)

        foreign = set().union(*(self.own[sibling] for sibling in siblings if sibling != child)) - self.own[child]
        runs: list[list[int]] = []
        for item in sorted(filter(free, self.own[child])):
            if runs and not self._blocked(runs[-1][-1], item, foreign, placed):
                runs[-1].append(item)
            else:
                runs.append([item])
        return max(runs, key=len, default=[])

    def _neighbour(
        self, position: int, child: int, siblings: list[int], placed: list[Range], low: int, high: int
    ) -> int | None:
        """The target word next to `position` (ending there, else starting there) that a tag with no word of its
        own takes: inside [low, high], held by no placed sibling and aligned to no other sibling; None if neither."""
        foreign = set().union(*(self.own[sibling] for sibling in siblings if sibling != child))
        for item, (start, end) in enumerate(self.items):
            next_to = position in (start, end) and low <= start and end <= high and self.words[item]
            if next_to and item not in foreign and not any(a <= start and end <= b for a, b in placed if a < b):
                return item
        return None

    def _blocked(self, left: int, right: int, foreign: set[int], placed: list[Range]) -> bool:
        end, start = self.items[left][1], self.items[right][0]
        return any(left < item < right for item in foreign) or any(end <= a and b <= start for a, b in placed)

    def _anchor(self, position: int, low: int, high: int, placed: list[Range]) -> int:
        """Where an element with no target items of its own goes (module docstring), kept inside [low, high] and
        out of its placed siblings."""
        anchor = min(max(self.target_position(position), low), high)
        for start, end in placed:
            if start < anchor < end:
                anchor = end
        return anchor

    def target_position(self, position: int) -> int:
        """The target position of segment position `position`: exact between sentences (the gaps are copied), else
        after the translation of the nearest source word before it, or before the next one's."""
        for sentence in self.sentences:
            (start, end), target_start = sentence.source, sentence.target[0]
            if position <= start or position >= end:
                continue
            before = [targets for (a, b), targets in sentence.words if b <= position and targets]
            inside = [targets for (a, b), targets in sentence.words if a < position < b and targets]
            if before or inside:
                return max(self.items[item][1] for item in (inside or before)[-1])
            after = [targets for (a, b), targets in sentence.words if a >= position and targets]
            return min(self.items[item][0] for item in after[0]) if after else target_start
        return self.boundary(position)

    def boundary(self, position: int) -> int:
        """The target position of a segment position that is not inside a sentence."""
        shift = 0
        for sentence in self.sentences:
            (start, end), target_end = sentence.source, sentence.target[1]
            if position <= start:
                break
            shift = (target_end - end) if position >= end else shift
        return position + shift


def place_elements(
    segment: Segment, sentences: Sequence[Range], translations: Sequence[Any], words: str = "whitespace"
) -> Placement:
    """Where each element of `segment` goes in the translation of its `sentences` (spans of `segment.text`) by
    `translations` (strings or `AlignedTranslation`s over `words`): the module docstring's rules."""
    text, gap_chars, items, source_items, laid = lay_out(segment, sentences, translations, words)
    placer = _Placer(segment, items, source_items, laid, text)
    placer.place(None, 0, len(text))
    return Placement(text, gap_chars, placer.ranges, laid)


def _unit_spacing(segment: Segment, placement: Placement, element: Element, at: int) -> tuple[str, str]:
    """Spaces around a unit placed inside a translation where the source had them and the translation has none."""
    position, source, target = element.start, segment.text, placement.text
    if not any(start < position < end for start, end in (sentence.source for sentence in placement.sentences)):
        return "", ""
    before = " " if position and source[position - 1] == " " and at and target[at - 1] not in WHITESPACE else ""
    after_needed = position < len(source) and source[position] == " "
    after = " " if after_needed and at < len(target) and target[at] not in WHITESPACE else ""
    return before, after


def render(segment: Segment, placement: Placement, raw: Callable[[int, int], str]) -> str:
    """The translated segment: gap characters as their source (`raw(start, end)`), translated text escaped, the
    elements' markup (`raw`) at their ranges, children inside their parents."""
    text, gaps, ranges, elements = placement.text, placement.gap_chars, placement.ranges, segment.elements
    children: dict[int | None, list[int]] = {None: []}
    for index, element in enumerate(elements):
        children.setdefault(element.parent, []).append(index)
    out: list[str] = []

    def emit(start: int, end: int) -> None:
        pending = []
        for position in range(start, end):
            if position in gaps:
                out.append(segment.escape("".join(pending)))
                pending = []
                out.append(raw(*segment.sources[gaps[position]]))
            else:
                pending.append(text[position])
        out.append(segment.escape("".join(pending)))

    def write(parent: int | None, start: int, end: int) -> None:
        position = start
        for child in sorted(children.get(parent, []), key=lambda index: (*ranges[index], index)):
            (child_start, child_end), element = ranges[child], elements[child]
            emit(position, child_start)
            if element.unit:
                before, after = _unit_spacing(segment, placement, element, child_start)
                out.append(before + raw(*element.open) + after)
            else:
                out.append(raw(*element.open))
                write(child, child_start, child_end)
                out.append(raw(*element.close))
            position = child_end
        emit(position, end)

    write(None, 0, len(text))
    return segment.quote + "".join(out) + segment.quote


def carry_markup(
    segment: Segment,
    sentences: Sequence[Range],
    translations: Sequence[Any],
    raw: Callable[[int, int], str],
    words: str = "whitespace",
) -> str:
    """`segment` translated: its sentences replaced by `translations`, its elements carried (module docstring)."""
    return render(segment, place_elements(segment, sentences, translations, words), raw)
