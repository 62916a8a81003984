"""`attn score`: the log-probability a model gives each given translation of a source, one result per pair.

`attn score --model M --source S --target T` (one sentence a line, line i of T a translation of line i of S), or
`source<TAB>target` lines on stdin when neither file is given, writes for each pair its target's log-probability
(`total`), the per-token mean (`mean`) and its length in tokens (`length`, the end token counted), and with
`--tokens` each token and its log-probability: JSON lines (`--format jsonl`, default) or tab-separated columns
(`--format tsv`: total, mean, length[, tokens, log-probabilities, each space-separated]), on stdout or atomically to
`--output FILE`. Built on `engine.score` (`modeling_attn.api.scoring`; conventions there: the end token counts, an
empty target scores the end token alone, an empty source is refused) on any `--engine`, ensembles on torch.
Bad input ends with one line and exit status 2: files of different line counts (naming both files and counts), a
stdin line without one tab, a source or target longer than the position table (naming the file and line).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from ..api.choices import SCORE_FORMATS
from ..api.corpus import decode_lines
from ..api.outputs import check_output_file, output_file
from ..api.values import COUNT
from .options import (
    EnsembleArguments,
    RuntimeArguments,
    load_engine,
    model_inputs,
    parse_flags,
    shown_defaults,
    terminated_as_exit,
)
from .parser import CommandParser
from .report import run_command

if TYPE_CHECKING:  # the API imports torch: imported where the command runs, after parsing
    from ..api.scoring import Score


@dataclass
class ScoreArguments:
    """`attn score`'s flags besides the device and ensemble ones."""

    _argument_group_name = "pairs and output"

    model: str = field(
        metadata={
            "help": "Model folder or Hub repo (with its tokenizer); repeat it (--model A --model B) for an ensemble.",
            "aliases": ["--model_name_or_path"],
            "action": "append",
        }
    )
    source: str | None = field(
        default=None,
        metadata={"help": "File of sources, one per line (with --target; neither: source<TAB>target lines on stdin)."},
    )
    target: str | None = field(
        default=None, metadata={"help": "File of their translations to score, one per line of --source."}
    )
    format: str = field(
        default="jsonl",
        metadata={
            "help": "jsonl: a JSON object a line (total, mean, length); tsv: those columns, tab-separated.",
            "choices": SCORE_FORMATS,
        },
    )
    tokens: bool = field(
        default=False, metadata={"help": "Also write each target token (the end token last) and its log-probability."}
    )
    output: str | None = field(
        default=None, metadata={"help": "Write the scores to this file (atomically) instead of stdout."}
    )
    overwrite: bool = field(default=False, metadata={"help": "Replace an existing --output that attn did not write."})
    batch_size: int = field(default=32, metadata={"help": "Pairs per forward pass.", "range": COUNT})
    progress: bool = field(default=True, metadata={"help": "A progress bar on stderr (--no_progress: none)."})

    def __post_init__(self) -> None:
        if (self.source is None) != (self.target is None):
            raise ValueError(
                "--source and --target go together (the sentences and their translations); give neither to read "
                "source<TAB>target lines on stdin"
            )


def score_parser() -> CommandParser:
    return shown_defaults(
        CommandParser(
            (ScoreArguments, RuntimeArguments, EnsembleArguments),
            prog="attn score",
            description="The log-probability a model gives each translation (--source and --target files, or "
            "source<TAB>target lines on stdin): JSON lines or TSV, one per pair.",
        )
    )


def main(argv: list[str] | None = None) -> int:
    """`attn score`: see the module docstring and `attn score --help`."""
    return run_command("attn score", lambda: score(argv))


def score(argv: list[str] | None) -> int:
    args = parse_flags(score_parser(), argv)
    with terminated_as_exit() if args.output else contextlib.nullcontext():
        return _score(args)


# -- input -----------------------------------------------------------------------------------------------------


def _line_count(args: SimpleNamespace, flag: str, files: contextlib.ExitStack):
    """The open file of `--source` / `--target` and its number of lines; TranslateError for a path that is not a
    file."""
    from ..api.translation import TranslateError

    path = getattr(args, flag)
    if not Path(path).is_file():
        state = "a folder" if Path(path).is_dir() else "no such file"
        raise TranslateError(f"--{flag} {path}: {state}; give a file of sentences, one per line")
    handle = files.enter_context(open(path, "rb"))  # noqa: SIM115 (the stack closes it)
    count = sum(1 for _ in handle)
    handle.seek(0)
    return handle, count


def _pairs(args: SimpleNamespace, files: contextlib.ExitStack) -> tuple[Iterator[tuple[str, str]], int | None]:
    """The (source, target) pairs and, from files, their count (before any model is loaded: files of different
    line counts are refused naming both)."""
    from ..api.translation import TranslateError

    if args.source is None:
        return _stdin_pairs(), None
    sources, source_count = _line_count(args, "source", files)
    targets, target_count = _line_count(args, "target", files)
    if source_count != target_count:
        raise TranslateError(
            f"--target {args.target} has {_lines(target_count)} and --source {args.source} has "
            f"{_lines(source_count)}; give one translation a line for each source line"
        )
    pairs = zip(decode_lines(sources, args.source), decode_lines(targets, args.target), strict=True)
    return ((source, target) for (_, source), (_, target) in pairs), source_count


def _unended(lines) -> Iterator[str]:
    return (line.rstrip("\r\n") for line in lines)


def _lines(count: int) -> str:
    return f"{count} line{'' if count == 1 else 's'}"


def _stdin_pairs() -> Iterator[tuple[str, str]]:
    from ..api.translation import TranslateError

    stream = getattr(sys.stdin, "buffer", None)
    # a text stream put in sys.stdin's place has no bytes to decode
    lines = decode_lines(stream, "stdin") if stream is not None else enumerate(_unended(sys.stdin), 1)
    for number, line in lines:
        if line.count("\t") != 1:
            raise TranslateError(
                f"stdin:{number}: {line.count(chr(9))} tabs; give one source<TAB>target pair a line (or --source "
                "and --target files)"
            )
        source, target = line.split("\t")
        yield source, target


# -- output ----------------------------------------------------------------------------------------------------


def score_line(found: Score, form: str, tokens: bool) -> str:
    """One output line: a JSON object (`Score.as_dict`), or the tab-separated columns (module docstring)."""
    if form == "jsonl":
        return json.dumps(found.as_dict(tokens), ensure_ascii=False) + "\n"
    columns = [repr(found.total), repr(found.mean), str(len(found.log_probs))]
    if tokens:
        columns += [" ".join(found.tokens), " ".join(map(repr, found.log_probs))]
    return "\t".join(columns) + "\n"


def _where(args: SimpleNamespace, side: str, line: int) -> str:
    return f"stdin:{line}" if args.source is None else f"{getattr(args, side)}:{line}"


def _score(args: SimpleNamespace) -> int:
    from ..api.engines import AutoEngine
    from ..api.scoring import PairError
    from ..api.translation import TranslateError

    inputs = {"--source": args.source, "--target": args.target, **model_inputs(args)}
    if args.output:
        check_output_file(args.output, inputs, args.overwrite)
    interactive = args.source is None and sys.stdin.isatty()
    with contextlib.ExitStack() as files:
        pairs, total = _pairs(args, files)  # files of different line counts: refused before the model loads
        engine = load_engine(args)
        out = files.enter_context(output_file(args.output, inputs, args.overwrite)) if args.output else sys.stdout
        progress = None
        if args.progress and (total is not None or not interactive):
            from tqdm.auto import tqdm

            label = f"{engine.fast.name} (auto)" if isinstance(engine, AutoEngine) else engine.label
            bar = tqdm(total=total, unit="pair", desc=f"scoring with {label}", file=sys.stderr)
            progress = files.enter_context(bar)
        number = 0
        batch_size = 1 if interactive else args.batch_size  # a person typing pairs wants each score at once
        while batch := list(islice(pairs, batch_size)):
            try:
                found = engine.score([source for source, _ in batch], [target for _, target in batch], batch_size)
            except PairError as error:
                raise TranslateError(
                    f"{_where(args, error.side, number + error.row + 1)}: the {error.side} {error.detail}"
                ) from None
            with progress.external_write_mode(file=out) if progress is not None else contextlib.nullcontext():
                out.write("".join(score_line(item, args.format, args.tokens) for item in found))
                if out is sys.stdout:
                    out.flush()
            number += len(batch)
            if progress is not None:
                progress.update(len(batch))
    return 0


__all__ = ["ScoreArguments", "main", "score_line", "score_parser"]
