"""`attn translate --document` and `--format html|markdown`: the input is a document, translated a sentence at a time.

The input (`--input FILE`, stdin, or the TEXT arguments as lines) is read whole. Running text (`--document`, or
`--format text`) is split into sentences by `modeling_attn.api.documents` (line breaks, blank lines and the
whitespace around sentences kept byte for byte; the sentence rules of `--source_lang`, else of the model's
`config.source_lang`); HTML and Markdown (`--format html|markdown`) are parsed and translated block by block with
their markup carried over by `modeling_attn.api.markup` (alignments over `--align_words`). Either is translated in
batches on the engine and written as each batch is done. Per-line settings (`--prefix_file`, `--constraints`, n-best
lists, alignments, pictures) have no line to apply to in a document and are refused by name.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FORMATS = ("html", "markdown")  # modeling_attn.api.markup's (not imported here: --help runs without torch)
# The flags that speak of input lines, refused with --document.
PER_LINE_FLAGS = (
    "num_return_sequences",
    "align",
    "prefix",
    "prefix_file",
    "constraints",
    "glossary",
    "attention_png",
    "self_attention_png",
    "attention_json",
)


@dataclass
class DocumentArguments:
    _argument_group_name = "documents"

    document: bool = field(
        default=False,
        metadata={
            "help": "The input is running text: split into sentences, translated, re-joined with its line breaks, "
            "blank lines and spacing kept."
        },
    )
    source_lang: str | None = field(
        default=None,
        metadata={
            "help": "Language code of the document's sentence rules (default: the model's config.source_lang).",
            "metavar": "CODE",
        },
    )
    format: str | None = field(
        default=None,
        metadata={
            "help": "The document's format (implies --document): text is --document; html and markdown are parsed, "
            "their text translated block by block, code and markup kept, inline tags carried onto the aligned "
            "words.",
            "choices": ("text", *FORMATS),
        },
    )


def document_mode(args: SimpleNamespace) -> bool:
    """Whether the input is a document: --document, or a --format."""
    return bool(args.document or args.format)


def check_document_flags(args: SimpleNamespace) -> None:
    """TranslateError for a per-line flag given with --document (or --format), or --source_lang without either."""
    from ..api.translation import TranslateError

    if not document_mode(args):
        if args.source_lang is not None:
            raise TranslateError("--source_lang names a document's language; add --document")
        return
    given = [flag for flag in PER_LINE_FLAGS if getattr(args, flag) not in (None, False)]
    if given:
        name = given[0]
        flag = f"--{name.replace('_', '-')}" if name.endswith(("_png", "_json")) else f"--{name}"
        mode = f"--format {args.format}" if args.format else "--document"
        raise TranslateError(f"{flag} applies to one sentence per line, not to a {mode}; drop one of them")


def read_document(args: SimpleNamespace) -> str:
    """The whole input as text: the TEXT arguments as lines, --input FILE or stdin (UTF-8, line ends as they are)."""
    from ..api.corpus import decode_text

    if args.text:
        return "\n".join(args.text)
    if args.input not in (None, "-"):
        return decode_text(Path(args.input).read_bytes(), args.input)
    if (stream := getattr(sys.stdin, "buffer", None)) is None:  # a text stream put in sys.stdin's place
        return sys.stdin.read()
    return decode_text(stream.read(), "stdin")


def _prepared(args: SimpleNamespace, engine: Any, text: str) -> tuple[Any, Any, int, str]:
    """The document split for `engine`, its events generator, how many events it has and what they count."""
    from functools import partial

    if args.format in FORMATS:
        from ..api.markup import markup_events, prepare_markup

        document = prepare_markup(engine, text, args.format, args.source_lang)
        events = partial(markup_events, words=args.align_words)
        return document, events, document.blocks, "block"
    from ..api.documents import document_events, prepare_document

    document = prepare_document(engine, text, args.source_lang)
    return document, document_events, len(document.sentences), "sent"


def translate_document_input(args: SimpleNamespace, engine: Any, overrides: dict[str, Any], inputs: dict) -> int:
    """`attn translate --document` (or `--format`): the document translated on `engine` with `overrides`, written
    to --output or stdout a batch at a time."""
    from ..api.outputs import output_file
    from ..api.translation import SentenceTooLong, TranslateError

    name = args.input if args.input not in (None, "-") else "argument" if args.text else "stdin"
    text = read_document(args)
    try:
        document, events, total, unit = _prepared(args, engine, text)
    except TranslateError as error:  # a sentence too long, markup that cannot be carried: by line
        raise TranslateError(f"{name}: {error.detail if isinstance(error, SentenceTooLong) else error}") from None
    with contextlib.ExitStack() as files:
        out = files.enter_context(output_file(args.output, inputs, args.overwrite)) if args.output else sys.stdout
        progress = None
        if args.progress:
            from tqdm.auto import tqdm

            runs = engine.label_for(overrides, alignments=unit == "block")
            progress = files.enter_context(
                tqdm(total=total, unit=unit, desc=f"translating with {runs}", file=sys.stderr)
            )
        try:
            for event in events(engine, document, batch_size=args.batch_size, **overrides):
                with progress.external_write_mode(file=out) if progress is not None else contextlib.nullcontext():
                    out.write(event.text)
                    if out is sys.stdout:
                        out.flush()
                if progress is not None and event.index >= 0:
                    progress.update(1)
        except TranslateError as error:
            raise TranslateError(f"{name}: {error}") from None
        if out is sys.stdout:
            out.flush()
    return 0


__all__ = [
    "DocumentArguments",
    "check_document_flags",
    "document_mode",
    "read_document",
    "translate_document_input",
]
