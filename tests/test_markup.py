"""HTML and Markdown translated with their markup kept (issue 58, item 2): modeling_attn.api.markup and its parts.

References: hand-made word alignments for the tag transfer (independent of any model), the parse of the source
(the output has the same tags, attributes, nesting and untranslated parts), `translate_document`'s answer for a
document without markup, and the engine's own translations of the blocks' sentences.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import torch
from tasks import one_thread

from modeling_attn.api.alignment import AlignedTranslation, WordAlignment
from modeling_attn.api.documents import translate_document
from modeling_attn.api.engines import load_translator
from modeling_attn.api.markup import markup_events, parse_markup, translate_markup
from modeling_attn.api.markup_transfer import MarkupError, carry_markup
from modeling_attn.cli.main import main as cli


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def aligned(text: str, source: str, pairs: list[tuple[int, int]]) -> AlignedTranslation:
    """A translation with a hand-made hard alignment (source word i - target word j, whitespace words)."""
    source_words, target_words = source.split(), text.split()
    weights = torch.zeros(len(target_words), len(source_words))
    return AlignedTranslation(text, WordAlignment(source_words, target_words, weights, pairs), None)


def carried(html: str, *translations, format: str = "html") -> str:
    """The only block of `html` translated by `translations`, one per sentence, the sentences cut at ". "."""
    (segment,), _ = parse_markup(html, format)
    spans = [match.span() for match in re.finditer(r"[^ .]+(?: +[^ .]+)*\.?", segment.text)]
    assert len(spans) == len(translations)
    return carry_markup(segment, spans, translations, lambda start, end: html[start:end])


def test_a_tag_goes_to_the_target_words_aligned_to_its_source_words():
    assert carried("<b>a</b> b c", aligned("C B A", "a b c", [(2, 0), (1, 1), (0, 2)])) == "C B <b>A</b>"
    two = aligned("X Y Z", "a b c", [(0, 0), (0, 1), (1, 2), (2, 1)])
    assert carried('<a href="u">a</a> b c', two) == '<a href="u">X Y</a> Z'  # the span of its words


def test_nested_tags_nest_and_keep_their_attributes():
    translation = aligned("C B A", "a b c", [(2, 0), (1, 1), (0, 2)])
    html = '<b class="k">a <i title="t">b</i></b> c'
    assert carried(html, translation) == 'C <b class="k"><i title="t">B</i> A</b>'


def test_crossing_spans_are_cut_at_the_sibling_words():
    # a -> X and Z, b -> Y: <b>'s span X..Z would hold <i>'s word; it keeps its first run, X.
    translation = aligned("X Y Z", "a b", [(0, 0), (1, 1), (0, 2)])
    assert carried("<b>a</b> <i>b</i>", translation) == "<b>X</b> <i>Y</i> Z"


def test_a_tag_with_no_aligned_word_takes_the_word_at_its_place_or_stays_empty():
    assert carried("<b>a</b> b", aligned("B", "a b", [(1, 0)])) == "<b>B</b>"
    # the only word belongs to the sibling <i>: <b> stays, empty, where its source stood
    assert carried("<b>a</b> <i>b</i>", aligned("B", "a b", [(1, 0)])) == "<b></b><i>B</i>"


def test_a_unit_is_never_translated_and_goes_after_the_word_before_it():
    translation = aligned("B A", "a b", [(1, 0), (0, 1)])
    assert carried("a <code>x &lt; y</code> b", translation) == "B A <code>x &lt; y</code>"
    assert carried("a<img src=i.png> b", aligned("A B", "a b", [(0, 0), (1, 1)])) == "A<img src=i.png> B"


def test_without_an_alignment_the_tags_go_around_the_whole_sentence():
    assert carried("a <b>b</b> c.", "Z Y X.") == "<b>Z Y X.</b>"
    # between sentences the source's text and tags stay where they were
    assert carried("<b>a b.</b> <i>c d.</i>", "X.", "Y.") == "<b>X.</b> <i>Y.</i>"


def test_markdown_markers_are_carried_like_tags():
    translation = aligned("C B A", "a b c", [(2, 0), (1, 1), (0, 2)])
    assert carried("*a* b [c](http://x.org/a_b)", translation, format="markdown") == "[C](http://x.org/a_b) B *A*"


def test_translated_text_is_escaped_for_its_format():
    assert carried("a <b>b</b>", aligned("x<y & z", "a b", [(0, 0), (0, 1), (1, 2)])) == "x&lt;y &amp; <b>z</b>"
    markdown = carried("a *b*", aligned("x_y z", "a b", [(0, 0), (1, 1)]), format="markdown")
    assert markdown == "x\\_y *z*"


@pytest.mark.parametrize(
    "html, message",
    [
        ("<p>a</p>\n<p>b</b></p>", "line 2: </b> closes no open <b>"),
        ("<p>a <b>b\n</p>", r"line 1: <b> is not closed before </p> \(line 2\)"),
        ("<p><b>a <i>b</b></i></p>", r"line 1: <i> is not closed before </b> \(line 1\)"),
        ("<p>a\n\n<em>b", "line 3: <em> is never closed"),
    ],
)
def test_markup_that_cannot_be_carried_is_refused_by_its_line(html, message):
    with pytest.raises(MarkupError, match=message):
        parse_markup(html, "html")


class Tags(HTMLParser):
    """A parse of HTML for the comparisons: the tree of tags (start tag text, alt/title values blanked), and the
    text of each element."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=False)
        self.root, self.stack = ("", []), []
        self.stack.append(self.root)
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        text = re.sub(r'\b(alt|title)="[^"]*"', r'\1=""', self.get_starttag_text())
        node = (text, [])
        self.stack[-1][1].append(node)
        if tag not in ("br", "img", "meta", "hr"):
            self.stack.append(node)

    def handle_endtag(self, tag):
        self.stack.pop()

    def shape(self, node=None):
        node = node or self.root
        return (node[0], sorted(self.shape(child) for child in node[1]))


HTML = """<!DOCTYPE html>
<html><head><title>a b c</title>
<style>p > b { color: red }</style>
<script>if (a < b) { c("<p>d e</p>"); }</script></head>
<body>
<!-- a b c -->
<h1 class="t" title="a b">a <em>b c</em> d</h1>
<p>b c <b>d <i class="x">e</i> f</b> g. h <a href="http://x/a_b?c=1&amp;d=2" title="i j">a b</a> c.</p>
<ul>
  <li>a <code>x &lt; y</code> b c</li>
  <li>d<br>e <span data-k='v'>f g</span></li>
</ul>
<pre>a b <b>c</b>
  d</pre>
<p translate="no">a b c</p>
<img alt="c d" src="i.png"><p>e f g h</p>
</body></html>
"""


@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_html_keeps_every_tag_its_attributes_and_what_is_not_translated(reverser_dir, engine):
    translator = load_translator(str(reverser_dir), engine=engine, device="cpu")
    out = translate_markup(translator, HTML, "html", source_lang="en")
    assert Tags(out).shape() == Tags(HTML).shape()  # every tag once, the same nesting, attributes byte for byte
    for kept in [
        "<style>p > b { color: red }</style>",
        '<script>if (a < b) { c("<p>d e</p>"); }</script>',
        "<!-- a b c -->",
        "<code>x &lt; y</code>",
        "<pre>a b <b>c</b>\n  d</pre>",
        '<p translate="no">a b c</p>',
        '<a href="http://x/a_b?c=1&amp;d=2" title="',
        "<!DOCTYPE html>\n<html><head><title>",
    ]:
        assert kept in out
    # outside the tags, each block's text is its sentences' translations, joined as in the source
    title, alt = translator.translate_batch(["a b", "c d"])
    assert f'title="{title}">' in out and f'alt="{alt}"' in out
    (paragraph,) = re.findall(r"<p>(e f g h)?([^<]*)</p>", out)[-1:]
    assert paragraph[1] == translator.translate_batch(["e f g h"])[0]


def test_a_document_without_markup_gives_the_document_translation(torch_engine):
    text = "a b c d.\n\ne f g.\n\nh i j k l.\n"
    expected = translate_document(torch_engine, text, source_lang="en")
    assert translate_markup(torch_engine, text, "html", source_lang="en") == expected
    assert translate_markup(torch_engine, text, "markdown", source_lang="en") == expected


MARKDOWN = """# a *b* c

> d **e f** g.
>
> h [i j](http://x.org/a_b "k") l

- a `x * y` b
- c ~~d~~ e\\
  f

| a | b c |
|---|---|
| *d* | e |

```python
a = b * c
```

    indented code

<div>a b</div>
"""


def test_markdown_keeps_headings_lists_emphasis_links_and_code(torch_engine):
    out = translate_markup(torch_engine, MARKDOWN, "markdown", source_lang="en")
    lines = out.split("\n")
    assert lines[0].startswith("# ") and lines[0].count("*") == 2
    assert lines[2].startswith("> ") and lines[2].count("**") == 2 and lines[3] == ">"
    assert lines[4].startswith("> ") and '](http://x.org/a_b "k")' in lines[4] and lines[4].count("[") == 1
    assert lines[6].startswith("- ") and "`x * y`" in lines[6]
    assert lines[7].startswith("- ") and lines[7].count("~~") == 2 and lines[7].endswith("\\")
    assert lines[8].startswith("  ")
    assert lines[10].startswith("| ") and lines[10].count("|") == 3 and lines[11] == "|---|---|"
    assert lines[12].startswith("| *") and lines[12].count("*") == 2
    assert "\n".join(lines[13:]) == MARKDOWN.split("\n", 13)[13]  # the code blocks and the HTML block, verbatim


def test_events_concatenate_to_the_answer(torch_engine):
    answer = translate_markup(torch_engine, HTML, "html", source_lang="en", num_beams=1)
    events = list(markup_events(torch_engine, HTML, "html", "en", batch_size=3, ramp=True, num_beams=1))
    assert "".join(event.text for event in events) == answer
    assert [event.index for event in events] == list(range(len(events))) and len(events) > 5


class NoAlignments:
    """An engine without word alignments (as onnxruntime), translating with the torch engine."""

    name = "plain"

    def __init__(self, engine):
        self.model, self.tokenizer, self.engine = engine.model, engine.tokenizer, engine

    def refusal(self, options, alignments=False):
        return "has no word alignments (--align)" if alignments else None

    def translate_batch(self, sentences, **options):
        return self.engine.translate_batch(sentences, **options)


def test_an_engine_without_alignments_puts_the_tags_around_the_sentence(torch_engine):
    with pytest.warns(UserWarning, match="the plain engine has no word alignments.*whole sentences"):
        out = translate_markup(NoAlignments(torch_engine), "<p>a <b>b</b> c d</p>", "html", source_lang="en")
    assert out == f"<p><b>{torch_engine.translate_batch(['a b c d'])[0]}</b></p>"


def test_attn_translate_format_html_and_markdown(reverser_dir, torch_engine, tmp_path, capsys):
    source = tmp_path / "page.html"
    source.write_text("<p>a <b>b</b> c</p>\r\n<pre>d e</pre>\r\n", encoding="utf-8")
    common = ["translate", "--model", str(reverser_dir), "--engine", "torch", "--no_progress", "--source_lang", "en"]
    assert cli([*common, "--format", "html", "--input", str(source)]) == 0
    assert capsys.readouterr().out == translate_markup(
        torch_engine, source.read_bytes().decode(), "html", source_lang="en"
    )
    assert cli([*common, "--format", "markdown", "a *b* c", "", "```", "d e", "```"]) == 0
    out = capsys.readouterr().out
    assert out.count("*") == 2 and out.endswith("\n\n```\nd e\n```")
    assert cli([*common, "--format", "text", "a b. c d", "", "e f"]) == 0  # --format text is --document
    expected = translate_document(torch_engine, "a b. c d\n\ne f", source_lang="en")
    assert capsys.readouterr().out == expected
    with pytest.raises(SystemExit) as exit_info:
        cli([*common, "--format", "xml", "a"])
    assert exit_info.value.code == 2
    assert "argument --format: invalid choice: 'xml'" in capsys.readouterr().err
    source.write_text("<p>a\n<b>b</p>", encoding="utf-8")
    assert cli([*common, "--format", "html", "--input", str(source)]) == 2
    assert f"{source}: line 2: <b> is not closed before </p> (line 2)" in capsys.readouterr().err
    assert cli([*common, "--format", "html", "--align", "a"]) == 2
    assert "--align applies to one sentence per line, not to a --format html" in capsys.readouterr().err
