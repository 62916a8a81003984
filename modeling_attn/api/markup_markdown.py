"""Markdown for `api.markup`: markdown-it-py (CommonMark, plus GFM tables and strikethrough) made into segments.

A segment is the inline content of a paragraph, heading or table cell, found in the source line by line
(markdown-it gives each block's lines and its inline source without the container markers, `> ` and list
indentation, which stay as they are). Carried onto the translation: emphasis, strong, strikethrough, links (`[` and
`](url "title")` as the tag's markup: the URL and title are never translated) and paired inline HTML tags. Units,
kept whole: code spans, autolinks, images (their alt text is kept), unpaired inline HTML. A hard line break ends a
sentence, a soft one is a space. Never translated: code blocks (fenced and indented), HTML blocks (kept verbatim,
not parsed as HTML), link reference definitions. Translated text is escaped where it could make markup
(`MARKDOWN_SPECIAL`). A block whose text markdown-it changed beyond recognition (a tab inside its indentation, a
NUL) is kept untranslated, with a warning naming its line.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from .markup_transfer import Segment, SegmentBuilder

MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")
LINE_END = re.compile(r"\r\n|\r|\n")  # markdown-it's lines (its `normalize` rule makes each of these a "\n")
HTML_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)\b[^>]*?(/?)>\Z", re.S)
CODE_TAGS = frozenset({"code", "kbd", "samp", "var"})
VOID_TAGS = frozenset({"area", "br", "col", "embed", "hr", "img", "input", "source", "track", "wbr"})
BREAKS = ("softbreak", "hardbreak")


def escape_markdown(text: str) -> str:
    """Translated text made safe in Markdown: each character that could start markup escaped with a backslash."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", text)


def _columns(line: str, piece: str, start: int, first: bool, table: bool) -> list[int] | None:
    """The column of `line` of each character of `piece` (the last place it fits from `start`, or the first when
    `first`), where a table cell's `\\|` may stand for `|`; None if it is not there."""
    places = range(start, len(line) + 1) if first else range(len(line), start - 1, -1)
    for place in places:
        columns, column = [], place
        for char in piece:
            if table and char == "|" and line[column : column + 2] == "\\|":
                column += 1
            if column >= len(line) or line[column] != char:
                break
            columns.append(column)
            column += 1
        else:
            return columns
    return None


def content_offsets(
    content: str, first_line: int, lines: list[tuple[int, str]], cursors: dict[int, int], table: bool
) -> list[int] | None:
    """The source offset of each character of a block's inline `content` (its lines from `first_line`; `lines`:
    each source line's offset and text), and one past its end; None where a line is not found. A "\n" of the
    content stands where its source line ends: the source between two content lines (line ends, `> `, indents)
    belongs to the character before it, or to the line break."""
    offsets: list[int] = []
    end = 0
    for number, piece in enumerate(content.split("\n"), first_line):
        if number >= len(lines):
            return None
        line_start, line = lines[number]
        columns = _columns(line, piece, cursors.get(number, 0), table, table)
        if columns is None:
            return None
        if number > first_line:
            offsets.append(lines[number - 1][0] + len(lines[number - 1][1]))
        offsets.extend(line_start + column for column in columns)
        cursors[number] = columns[-1] + 1 if columns else cursors.get(number, 0)
        end = line_start + cursors[number]
    return [*offsets, end]


def _link_end(content: str, position: int) -> int:
    """Where a link's or image's closing markup ends: `position` is its `]`; then `(destination "title")`, a
    reference label `[label]`, or nothing."""
    from markdown_it.helpers import parseLinkDestination, parseLinkTitle

    end = position + 1
    if content.startswith("(", end):
        at = _skip_space(content, end + 1)
        destination = parseLinkDestination(content, at, len(content))
        if destination.ok:
            at = _skip_space(content, destination.pos)
            title = parseLinkTitle(content, at, len(content))
            at = _skip_space(content, title.pos) if title.ok else at
        if at < len(content) and content[at] == ")":
            return at + 1
        return end
    label = re.compile(r"\[(?:\\.|[^\\\]])*\]").match(content, end)
    return label.end() if label else end


def _skip_space(content: str, position: int) -> int:
    while position < len(content) and content[position] in " \t\n":
        position += 1
    return position


def _bracket_end(content: str, position: int) -> int:
    """The `]` that closes the `[` at `position` (backslash escapes skipped, brackets nested)."""
    depth, at = 0, position
    while at < len(content):
        char = content[at]
        if char == "\\":
            at += 2
            continue
        depth += (char == "[") - (char == "]")
        if depth == 0:
            return at
        at += 1
    raise ValueError("no closing bracket")


def _balanced(children: list[Any]) -> bool:
    """Whether Markdown's own opening and closing tokens in `children` pair up (an HTML pair around them nests)."""
    depth = 0
    for child in children:
        depth += child.nesting if child.type != "html_inline" else 0
        if depth < 0:
            return False
    return depth == 0


def html_pairs(children: list[Any]) -> dict[int, int]:
    """The inline HTML tags of a block that pair up (opening token -> closing token), nesting with the rest; the
    others are units."""
    pairs, stack = {}, []
    for index, child in enumerate(children):
        tag = HTML_TAG.match(child.content) if child.type == "html_inline" else None
        if tag is None or tag.group(3) or tag.group(2).lower() in VOID_TAGS:
            continue
        name = tag.group(2).lower()
        if not tag.group(1):
            stack.append((index, name))
        elif stack and stack[-1][1] == name and _balanced(children[stack[-1][0] + 1 : index]):
            pairs[stack.pop()[0]] = index
    return pairs


def _piece(child: Any, content: str, at: int, pairs: dict[int, int], index: int) -> tuple[str, int]:
    """What a child token is (text, char, soft, hard, open, close, unit) and where it ends; it starts at `at`."""
    kind = child.type
    if kind == "text":
        return "text", at + len(child.content)
    if kind == "text_special":
        return "char", at + len(child.markup)
    if kind in BREAKS:
        return ("soft" if kind == "softbreak" else "hard"), at + 1
    if kind in ("em_open", "strong_open", "s_open", "em_close", "strong_close", "s_close"):
        return kind.rsplit("_", 1)[1], at + len(child.markup)
    if kind == "code_inline":
        closing = re.compile(rf"(?<!`){re.escape(child.markup)}(?!`)").search(content, at + len(child.markup))
        return "unit", closing.end()
    if kind == "link_open" and child.markup == "autolink":
        return "unit", content.index(">", at) + 1
    if kind == "link_open":
        return "open", at + 1
    if kind == "link_close":
        return "close", _link_end(content, at)
    if kind == "image":
        return "unit", _link_end(content, _bracket_end(content, at + 1))
    if kind == "html_inline":
        return ("open" if index in pairs else "close" if index in pairs.values() else "unit"), at + len(child.content)
    raise ValueError(f"an inline token of type {kind}")


def _expected(child: Any) -> str:
    """The source text a child token starts with."""
    if child.type == "text" or child.type == "html_inline":
        return child.content
    if child.type in BREAKS:
        return "\n"
    if child.type == "link_open":
        return "<" if child.markup == "autolink" else "["
    return {"link_close": "]", "image": "!["}.get(child.type, child.markup)


def inline_pieces(children: list[Any], content: str) -> list[list]:
    """[kind, start, end, text] of each piece of a block's inline content, covering it: what markdown-it left out
    (spaces at line ends, indentation) goes to the line break after or before it, else to the piece before it."""
    pairs, pieces, cursor, until = html_pairs(children), [], 0, None
    for index, child in enumerate(children):
        if until is not None:  # inside a unit of several tokens (an autolink, an HTML code element): to its end
            if index == until and child.type == "html_inline":
                pieces[-1][2] = cursor = content.index(child.content, cursor) + len(child.content)
            until = None if index == until else until
            continue
        expected = _expected(child)
        at = content.find(expected, cursor)
        if at < 0 or content[cursor:at].strip(" \t\n\\" if child.type == "hardbreak" else " \t\n"):
            raise ValueError(f"{child.type} {expected!r} not found")
        kind, end = _piece(child, content, at, pairs, index)
        cursor = end
        if kind == "unit" and child.type == "link_open":
            until = next(later for later in range(index + 1, len(children)) if children[later].type == "link_close")
        if (
            kind == "open"
            and child.type == "html_inline"
            and HTML_TAG.match(child.content).group(2).lower() in CODE_TAGS
        ):
            kind, until = "unit", pairs[index]
        pieces.append([kind, at, end, child.content])
    for before, after in zip(pieces, pieces[1:], strict=False):
        if after[0] in ("soft", "hard"):
            after[1] = before[2]
        else:
            before[2] = after[1]
    if pieces:
        pieces[0][1], pieces[-1][2] = 0, len(content)
    return pieces


def _segment(pieces: list[list], content: str, offsets: list[int], line: int) -> Segment:
    """A block's segment from its pieces (`inline_pieces`) and the source offset of each content character."""
    builder = SegmentBuilder(offsets[0], escape_markdown)
    for kind, start, end, text in pieces:
        source = (offsets[start], offsets[end])
        if kind == "text" and source[1] - source[0] == end - start:
            builder.chars(content[start:end], source)
        elif kind == "text":  # a table cell's `\|`, or a line end inside: character by character
            for position in range(start, end):
                char = " " if content[position] in " \t\n\r\f" else content[position]
                builder.chars(char, (offsets[position], offsets[position + 1]), literal=False)
        elif kind == "char":
            builder.chars(text, source, literal=False)
        elif kind == "soft":
            builder.chars(" ", source, literal=False)
        elif kind == "hard":
            builder.line_break(source)
        elif kind == "open":
            builder.open(source, line)
        elif kind == "close":
            builder.close(source)
        else:
            builder.unit(source, line)
    return builder.finish()


def parse_markdown(text: str) -> tuple[list[Segment], list[Segment]]:
    """The segments of a Markdown document: the inline content of its paragraphs, headings and table cells, in
    source order (module docstring); no attribute values (those are HTML's)."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    parser.disable("text_join")  # escapes and entities stay tokens of their own (`text_special`), with their source
    starts = [0, *(match.end() for match in LINE_END.finditer(text))]
    lines = [
        (start, LINE_END.sub("", text[start:end])) for start, end in zip(starts, [*starts[1:], len(text)], strict=True)
    ]
    segments, cursors, previous = [], {}, None
    for token in parser.parse(text):
        table = previous is not None and previous.type in ("th_open", "td_open")
        previous = token
        if token.type != "inline" or not token.content.strip() or token.map is None:
            continue
        offsets = content_offsets(token.content, token.map[0], lines, cursors, table)
        try:
            pieces = None if offsets is None else inline_pieces(token.children or [], token.content)
        except (ValueError, AttributeError):
            pieces = None
        if pieces is None:
            warnings.warn(
                f"line {token.map[0] + 1}: a Markdown block kept untranslated (its text is not found in the source)",
                stacklevel=4,
            )
            continue
        segments.append(_segment(pieces, token.content, offsets, token.map[0] + 1))
    return segments, []
