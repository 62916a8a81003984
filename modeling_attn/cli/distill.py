"""`attn distill`: sequence-level knowledge distillation data (Kim & Rush 2016) from a teacher model or ensemble.

`attn distill --model TEACHER [--model T2 ...] --data DIR --source_lang a --target_lang b --output_dir OUT` translates
the training sources of DIR (plain, TSV or JSONL files, `.gz` too: `api.corpus`) with the teacher's own decoding
(its generation config: the recipe's beam 5 and the length penalty picked on validation; the decoding flags of `attn
translate` change it) on the fastest engine (`--engine auto`; several `--model`: an ensemble, on torch) and writes
OUT/train.a and OUT/train.b, the teacher's translations as targets; `--keep_original` appends the original pairs
(each source then twice, once with its reference, once with the teacher's translation). The validation and test
splits are written as they are (plain text, their file stems kept), so that `attn train --data OUT` trains a
student on the distilled data and picks and scores it on the real references. OUT is written as every output folder
(`api.outputs.output_folder`: a folder of other files is refused unless `--force`; nothing is written on failure).
A source longer than the teacher's position table is refused, naming its file and line.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .options import (
    DecodingArguments,
    EnsembleArguments,
    RuntimeArguments,
    load_engine,
    model_inputs,
    parse_flags,
    shown_defaults,
    steering_options,
    terminated_as_exit,
)
from .parser import CommandParser
from .report import run_command


@dataclass
class DistillArguments:
    """`attn distill`'s flags besides the decoding, device and ensemble ones."""

    _argument_group_name = "data and output"

    model: str = field(
        metadata={
            "help": "The teacher: a model folder or Hub repo; repeat it (--model A --model B) for an ensemble.",
            "aliases": ["--model_name_or_path"],
            "action": "append",
        }
    )
    data: str = field(metadata={"help": "Folder of the training data (train.*, and the validation and test splits)."})
    source_lang: str = field(metadata={"help": "Source language code (file suffix / JSON key)."})
    target_lang: str = field(metadata={"help": "Target language code (file suffix / JSON key)."})
    output_dir: str = field(metadata={"help": "Folder to write the distilled data to (attn train --data reads it)."})
    keep_original: bool = field(
        default=False, metadata={"help": "Also keep the original training pairs (each source twice)."}
    )
    force: bool = field(default=False, metadata={"help": "Write into --output_dir even if it holds other files."})


def distill_parser() -> CommandParser:
    return shown_defaults(
        CommandParser(
            (DistillArguments, DecodingArguments, RuntimeArguments, EnsembleArguments),
            prog="attn distill",
            description="Translate the training sources of --data with a teacher (or an ensemble) and write a "
            "training folder with its translations as targets (sequence-level knowledge distillation).",
        )
    )


def main(argv: list[str] | None = None) -> int:
    """`attn distill`: see the module docstring and `attn distill --help`."""
    return run_command("attn distill", lambda: distill(argv))


def distill(argv: list[str] | None) -> int:
    args = parse_flags(distill_parser(), argv)
    with terminated_as_exit():
        return _distill(args)


def _split_rows(folder: Path, split: str, args: SimpleNamespace) -> tuple[str, list[str], list[str]] | None:
    """(file stem, sources, references) of a split of `folder`, or None where it has none."""
    from ..api.corpus import read_folder_split, split_stem

    for suffix in (args.source_lang, "tsv", "jsonl"):
        if stem := split_stem(folder, split, suffix):
            found = read_folder_split(folder, stem, split, args.source_lang, args.target_lang)
            return (stem, found[0], found[1]) if found else None
    return None


def _teacher_translations(args: SimpleNamespace, engine: Any, sources: list[str], where: str) -> list[str]:
    """The teacher's translations of `sources`, `--batch_size` at a time, with a progress bar."""
    from ..api.translation import SentenceTooLong, TranslateError

    overrides = steering_options(args)
    engine.check(overrides)
    translations: list[str] = []
    with contextlib.ExitStack() as stack:
        progress = None
        if args.progress:
            from tqdm.auto import tqdm

            label = engine.label_for(overrides)
            progress = stack.enter_context(
                tqdm(total=len(sources), unit="sent", desc=f"distilling with {label}", file=sys.stderr)
            )
        for start in range(0, len(sources), args.batch_size):
            try:
                translations += engine.translate_batch(sources[start : start + args.batch_size], **overrides)
            except SentenceTooLong as error:
                raise TranslateError(f"{where}:{start + error.row + 1}: the source {error.detail}") from None
            if progress is not None:
                progress.update(min(args.batch_size, len(sources) - start))
    return translations


def _write(path: Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(f"{line}\n" for line in lines)


def _distill(args: SimpleNamespace) -> int:
    from ..api.corpus import DataError
    from ..api.outputs import output_folder

    folder = Path(args.data)
    engine = load_engine(args)  # a model folder mistake is said first, as by every command that reads one
    if not folder.is_dir():
        raise DataError(f"--data {args.data}: {'a file' if folder.exists() else 'no such folder'}; give a folder")
    train = _split_rows(folder, "train", args)
    if train is None:
        raise DataError(f"{folder}: no training split (train.{args.source_lang}, train.tsv or train.jsonl)")
    _, sources, references = train
    others = {split: _split_rows(folder, split, args) for split in ("validation", "test")}  # read before translating
    translations = _teacher_translations(args, engine, sources, f"{folder}/train")
    inputs = {"--data": args.data, **model_inputs(args)}
    with output_folder(args.output_dir, "attn distill", inputs, args.force) as staging:
        source_side, target_side = list(sources), list(translations)
        if args.keep_original:
            source_side, target_side = source_side + sources, target_side + references
        _write(staging / f"train.{args.source_lang}", source_side)
        _write(staging / f"train.{args.target_lang}", target_side)
        for rows in others.values():
            if rows is not None:
                stem, split_sources, split_references = rows
                _write(staging / f"{stem}.{args.source_lang}", split_sources)
                _write(staging / f"{stem}.{args.target_lang}", split_references)
    print(
        f"attn distill: {len(sources)} training sources translated, {len(source_side)} pairs written to "
        f"{args.output_dir}",
        file=sys.stderr,
    )
    return 0


__all__ = ["DistillArguments", "distill_parser", "main"]
