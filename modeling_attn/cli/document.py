"""`attn translate --document`: the input is running text, translated a sentence at a time, its layout kept.

The input (`--input FILE`, stdin, or the TEXT arguments as lines) is read whole, split into sentences by
`modeling_attn.api.documents` (line breaks, blank lines and the whitespace around sentences kept byte for byte; the
sentence rules of `--source_lang`, else of the model's `config.source_lang`), translated in batches on the engine and
written as each batch is done. Per-line settings (`--prefix_file`, `--constraints`, n-best lists, alignments,
pictures) have no line to apply to in a document and are refused by name.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

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


def check_document_flags(args: SimpleNamespace) -> None:
    """TranslateError for a per-line flag given with --document, or --source_lang without it."""
    from ..api.translation import TranslateError

    if not args.document:
        if args.source_lang is not None:
            raise TranslateError("--source_lang names a document's language; add --document")
        return
    given = [flag for flag in PER_LINE_FLAGS if getattr(args, flag) not in (None, False)]
    if given:
        name = given[0]
        flag = f"--{name.replace('_', '-')}" if name.endswith(("_png", "_json")) else f"--{name}"
        raise TranslateError(f"{flag} applies to one sentence per line, not to a --document; drop one of them")


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


def translate_document_input(args: SimpleNamespace, engine: Any, overrides: dict[str, Any], inputs: dict) -> int:
    """`attn translate --document`: the document translated on `engine` with `overrides`, written to --output or
    stdout a batch at a time."""
    from ..api.documents import document_events, prepare_document
    from ..api.outputs import output_file
    from ..api.translation import SentenceTooLong, TranslateError

    name = args.input if args.input not in (None, "-") else "argument" if args.text else "stdin"
    text = read_document(args)
    try:
        document = prepare_document(engine, text, args.source_lang)
    except SentenceTooLong as error:
        raise TranslateError(f"{name}: {error.detail}") from None
    with contextlib.ExitStack() as files:
        out = files.enter_context(output_file(args.output, inputs, args.overwrite)) if args.output else sys.stdout
        progress = None
        if args.progress:
            from tqdm.auto import tqdm

            runs = engine.label_for(overrides)
            progress = files.enter_context(
                tqdm(total=len(document.sentences), unit="sent", desc=f"translating with {runs}", file=sys.stderr)
            )
        try:
            for event in document_events(engine, document, args.batch_size, **overrides):
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


__all__ = ["DocumentArguments", "check_document_flags", "read_document", "translate_document_input"]
