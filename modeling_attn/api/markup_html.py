"""HTML for `api.markup`: the standard library's `html.parser`, its events made into segments (`markup_transfer`).

A segment is a run of text and inline elements (`INLINE_TAGS`, `<br>` as a line break) between any other tags,
which are kept as they are; a line break in its text is a space, a blank line ends a sentence. Never translated:
the content of `SKIPPED_TAGS` (`<script>`, `<style>`, `<pre>`...) and of elements marked `translate="no"` (HTML's
own attribute) or `class="notranslate"`, comments, and `CODE_TAGS` and `<img>`, kept whole as units; attributes
but `alt` and `title`, whose values are translated as segments of their own.
An inline tag around a block (`<a><div>...</div></a>`) is kept as it is, its content translated block by block.

html.parser recovers from almost anything; refused (`MarkupError`, naming the line) is what would leave a tag with
no place: a closing tag with no open element of its name, and an inline tag not closed before its block ends (or
before the end of the document). Other elements may be left open, as HTML allows (`<p>`, `<li>`).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from html.parser import HTMLParser

from .markup_transfer import MarkupError, Segment, SegmentBuilder

# Elements whose tags are carried onto the translation (their text translated); CODE_TAGS and UNIT_TAGS are units.
_INLINE = "a abbr acronym b bdi bdo big button cite data del dfn em font i ins label mark q s small span strike strong"
INLINE_TAGS = frozenset([*_INLINE.split(), "sub", "sup", "time", "tt", "u"])
CODE_TAGS = frozenset({"code", "kbd", "samp", "var"})  # inline, never translated
UNIT_TAGS = frozenset({"img", "wbr"})  # void inline elements
SKIPPED_TAGS = frozenset({"script", "style", "pre", "textarea", "svg", "math"})
_VOID = "area base br col embed hr img input keygen link meta param source track wbr"
VOID_TAGS = frozenset(_VOID.split())
TRANSLATED_ATTRIBUTES = ("alt", "title")
ENTITY = re.compile(r"&(?:#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[A-Za-z][A-Za-z0-9]*;?)")
# html.parser's own patterns (Python 3.11, `tagfind_tolerant`, `attrfind_tolerant`): where each attribute is.
TAG_NAME = re.compile(r"<([a-zA-Z][^\t\n\r\f />\x00]*)(?:\s|/(?!>))*")
ATTRIBUTE = re.compile(
    r"""((?<=[\'"\s/])[^\s/>][^\s/=>]*)(\s*=+\s*(\'[^\']*\'|"[^"]*"|(?![\'"])[^>\s]*))?(?:\s|/(?!>))*"""
)


@dataclass
class _Event:
    kind: str  # start, startend, end, data, ref, comment, other
    tag: str | None
    attrs: list
    start: int
    line: int
    end: int = 0


class _Events(HTMLParser):
    """The parser's events with their source offsets (`getpos` at each event is where it starts)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=False)
        self.line_starts = [0, *(match.end() for match in re.finditer("\n", text))]
        self.found: list[_Event] = []

    def _add(self, kind: str, tag: str | None = None, attrs: list | None = None) -> None:
        line, column = self.getpos()
        self.found.append(_Event(kind, tag, attrs or [], self.line_starts[line - 1] + column, line))

    def handle_starttag(self, tag, attrs):
        self._add("start", tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._add("startend", tag, attrs)

    def handle_endtag(self, tag):
        self._add("end", tag)

    def handle_data(self, data):
        self._add("data")

    def handle_entityref(self, name):
        self._add("ref")

    def handle_charref(self, name):
        self._add("ref")

    def handle_comment(self, data):
        self._add("comment")

    def handle_pi(self, data):
        self._add("comment")

    def handle_decl(self, decl):
        self._add("other")

    def unknown_decl(self, data):
        self._add("other")


def html_events(text: str) -> list[_Event]:
    """Every event of `text`, each with its source range: together they cover the text."""
    parser = _Events(text)
    parser.feed(text)
    parser.close()
    events = parser.found
    for event, following in zip(events, events[1:], strict=False):
        event.end = following.start
    if events:
        events[-1].end = len(text)
    if any(event.end < event.start for event in events) or (events and events[0].start != 0):
        raise RuntimeError("html.parser's event positions do not cover the document in order")
    return events


def _no_translate(event: _Event) -> bool:
    attributes = dict(event.attrs)
    return attributes.get("translate") == "no" or "notranslate" in (attributes.get("class") or "").split()


def _inline_kind(event: _Event) -> bool:
    return event.tag in INLINE_TAGS or event.tag in CODE_TAGS or event.tag in UNIT_TAGS or event.tag == "br"


def match_tags(events: list[_Event]) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """Each start event's closing event (itself for a void element), each end event's start event, and the start
    events of inline elements holding nothing but text and inline elements; MarkupError as the module docstring."""
    closing, opening, inline, stack = {}, {}, set(), []  # stack: [start index, holds only inline content]

    def done(index: int, only_inline: bool) -> None:
        if only_inline and _inline_kind(events[index]):
            inline.add(index)
        elif stack:
            stack[-1][1] = False

    for index, event in enumerate(events):
        if event.kind == "other" and stack:
            stack[-1][1] = False
        elif event.kind == "startend" or (event.kind == "start" and event.tag in VOID_TAGS):
            closing[index] = index
            done(index, True)
        elif event.kind == "start":
            stack.append([index, True])
        elif event.kind == "end":
            found = next(
                (depth for depth in reversed(range(len(stack))) if events[stack[depth][0]].tag == event.tag), None
            )
            if found is None:
                raise MarkupError(f"line {event.line}: </{event.tag}> closes no open <{event.tag}>")
            while len(stack) > found:
                start, only_inline = stack.pop()
                if len(stack) > found and _inline_kind(events[start]):
                    raise MarkupError(
                        f"line {events[start].line}: <{events[start].tag}> is not closed before </{event.tag}> "
                        f"(line {event.line})"
                    )
                closing[start], opening[index] = index, start
                done(start, only_inline)
    for start, _ in stack:
        if _inline_kind(events[start]):
            raise MarkupError(f"line {events[start].line}: <{events[start].tag}> is never closed")
    return closing, opening, inline


def _text(builder: SegmentBuilder, raw: str, offset: int) -> None:
    """Text with character references: literal characters one for one, each reference as the text it stands for."""
    position = 0
    for match in ENTITY.finditer(raw):
        if match.start() > position:
            builder.chars(raw[position : match.start()], (offset + position, offset + match.start()))
        builder.chars(html.unescape(match.group()), (offset + match.start(), offset + match.end()), literal=False)
        position = match.end()
    if position < len(raw):
        builder.chars(raw[position:], (offset + position, offset + len(raw)))


def attribute_segments(text: str, event: _Event) -> list[Segment]:
    """The values of a start tag's `alt` and `title` attributes, as segments (escaped for an attribute; an unquoted
    one gets quotes)."""
    raw = text[event.start : event.end]
    name = TAG_NAME.match(raw)
    if name is None or not any(key in TRANSLATED_ATTRIBUTES and value for key, value in event.attrs):
        return []
    segments, position = [], name.end()
    while (match := ATTRIBUTE.match(raw, position)) is not None and match.end() > position:
        position = match.end()
        if match.group(1).lower() not in TRANSLATED_ATTRIBUTES or not match.group(3):
            continue
        start, end = match.span(3)
        quoted = match.group(3)[0] in "'\""
        start, end = (start + 1, end - 1) if quoted else (start, end)
        builder = SegmentBuilder(
            event.start + start, lambda value: html.escape(value, quote=True), "" if quoted else '"'
        )
        _text(builder, raw[start:end], event.start + start)
        segments.append(builder.finish())
    return segments


def _block_escape(value: str) -> str:
    return html.escape(value, quote=False)


def parse_html(text: str) -> tuple[list[Segment], list[Segment]]:
    """The segments of an HTML document: its runs of text (module docstring) and its alt/title values, each list
    in source order."""
    events = html_events(text)
    closing, opening, inline = match_tags(events)
    blocks, attributes, builder = [], [], None

    def finish() -> None:
        nonlocal builder
        if builder is not None:
            blocks.append(builder.finish())
            builder = None

    index = 0
    while index < len(events):
        event = events[index]
        source = (event.start, event.end)
        if event.kind in ("start", "startend"):
            attributes.extend(attribute_segments(text, event))
        skipped = event.kind == "start" and (event.tag in SKIPPED_TAGS or _no_translate(event))
        if skipped and index not in inline:  # verbatim to its closing tag (to the end, if it has none)
            finish()
            index = closing.get(index, len(events) - 1) + 1
            continue
        in_run = event.kind in ("data", "ref", "comment") or index in inline or opening.get(index) in inline
        if not in_run:
            finish()
            index += 1
            continue
        builder = builder or SegmentBuilder(event.start, _block_escape)
        unit = event.tag in CODE_TAGS or event.tag in UNIT_TAGS or event.kind == "comment" or skipped
        if event.kind == "data":
            builder.chars(text[event.start : event.end], source)
        elif event.kind == "ref":
            builder.chars(html.unescape(text[event.start : event.end]), source, literal=False)
        elif event.tag == "br":
            builder.line_break(source)
        elif unit or event.kind == "startend":
            builder.unit((event.start, events[closing.get(index, index)].end), event.line)
            index = closing.get(index, index)
        elif event.kind == "start":
            builder.open(source, event.line)
        else:
            builder.close(source)
        index += 1
    finish()
    return blocks, attributes
