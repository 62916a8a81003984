"""Reading parallel text: UTF-8 lines, the file names of the splits, and the rows of text, TSV and JSONL files.

The training recipe reads its corpora with these (`modeling_attn.training.data`, which caches them as Arrow files),
and `attn translate` / `attn evaluate` read their inputs and test sets with the same functions, so a file is
checked the same way everywhere: bad bytes, a wrong number of fields and mismatched line counts raise `DataError`
naming the file and the line.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import UserError

# File stems tried for each split, in order; a test stem may also be any one stem starting with "test"
# (Multi30k's `test_2016_flickr`).
SPLIT_STEMS = {"train": ["train"], "validation": ["validation", "valid", "val", "dev"], "test": ["test"]}


class DataError(UserError, ValueError):
    """Bad training data; the message names the file (or dataset split) and the line (or row)."""


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def decode_lines(handle: BinaryIO, name: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, line without its line end) of a binary stream read as UTF-8 text, a leading byte-order mark
    dropped; DataError naming `name` and the line on bad bytes. `attn translate` reads its input with it too."""
    for number, raw in enumerate(handle, 1):
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise DataError(
                f"{name}:{number}: not valid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1}); "
                "re-encode it as UTF-8"
            ) from None
        yield number, text


def decode_text(data: bytes, name: str | Path) -> str:
    """`data` read as UTF-8 text, a leading byte-order mark dropped, line ends kept as they are; DataError naming
    `name`, the line and the column on bad bytes (a document read whole: `attn translate --document`)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise DataError(
            f"{name}:{line}: not valid UTF-8 (byte 0x{data[error.start]:02x} at column {column}); "
            "re-encode it as UTF-8"
        ) from None


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line without its line end) of a UTF-8 text file (gzipped if its name ends in .gz), read as a
    stream; DataError naming the file and line on bad bytes, naming the file if it is truncated or unreadable."""
    try:
        with _open_binary(path) as handle:
            yield from decode_lines(handle, path)
    except PermissionError:
        raise  # named by the commands' reporter as any file the user may not read, with what to do
    except (OSError, EOFError) as error:  # e.g. a truncated or corrupt .gz file
        raise DataError(f"{path}: cannot be read: {error}") from None


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (gzipped if its name ends in .gz), without line ends; DataError on bad bytes."""
    return [line for _, line in iter_lines(path)]


def find_split_file(folder: Path, stem: str, suffix: str) -> Path | None:
    """`{stem}.{suffix}` or `{stem}.{suffix}.gz` in `folder`, or None; DataError naming both when both exist (one of
    them would be ignored without a word)."""
    found = [folder / name for name in (f"{stem}.{suffix}", f"{stem}.{suffix}.gz") if (folder / name).is_file()]
    if len(found) > 1:
        raise DataError(f"{found[0]} and {found[1]} could both be {stem}.{suffix}; keep one of them")
    return found[0] if found else None


def split_stem(folder: Path, split: str, suffix: str) -> str | None:
    """The file stem of `split` among files ending in `.{suffix}` (or `.{suffix}.gz`), or None; DataError naming
    them when several stems could be the split (`valid.de` and `dev.de`, `test_2016.de` and `test_2017.de`)."""
    stems = [stem for stem in SPLIT_STEMS[split] if find_split_file(folder, stem, suffix)]
    if len(stems) > 1:
        names = " and ".join(str(find_split_file(folder, stem, suffix)) for stem in stems)
        raise DataError(f"{names} could both be the {split} split; keep one of them")
    if stems:
        return stems[0]
    if split == "test":
        stems = sorted({p.name.split(".")[0] for p in folder.glob(f"test*.{suffix}*")} - {"test"})
        if len(stems) == 1:
            return stems[0]
        if len(stems) > 1:
            raise DataError(f"{folder}: several test sets {stems}; keep one or rename it to test.{suffix}")
    return None


def languages_in(folder: Path) -> list[str]:
    stems = {stem for stems in SPLIT_STEMS.values() for stem in stems}
    langs = set()
    for path in folder.iterdir():
        parts = path.name.removesuffix(".gz").split(".")
        if len(parts) == 2 and (parts[0] in stems or parts[0].startswith("test")) and parts[1] not in ("tsv", "jsonl"):
            langs.add(parts[1])
    return sorted(langs)


def text_pair_rows(source_path: str, target_path: str) -> Iterator[tuple[str, str, int]]:
    source_file, target_file = Path(source_path), Path(target_path)
    sources, targets = iter_lines(source_file), iter_lines(target_file)
    number = 0
    while True:
        source, target = next(sources, None), next(targets, None)
        if source is None or target is None:
            break
        number += 1
        yield source[1].strip(), target[1].strip(), number
    if source is None and target is None:
        if number == 0:
            raise DataError(f"{source_file} and {target_file} are empty (the split holds no sentence pair)")
        return
    source_count = number + (source is not None) + sum(1 for _ in sources)
    target_count = number + (target is not None) + sum(1 for _ in targets)
    longer, shorter = (source_file, target_file) if source_count > target_count else (target_file, source_file)
    raise DataError(
        f"{longer}:{number + 1}: line has no counterpart: {source_file.name} has {source_count} lines but "
        f"{target_file.name} has {target_count}; {shorter} ends after line {number}"
    )


def tsv_rows(path: str) -> Iterator[tuple[str, str, int]]:
    number = 0
    for number, line in iter_lines(Path(path)):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(f"{path}:{number}: expected 2 tab-separated fields (source, target), found {len(fields)}")
        yield fields[0].strip(), fields[1].strip(), number
    if number == 0:
        raise DataError(f"{path}: empty file (no sentence pair)")


def jsonl_rows(path: str, source_lang: str, target_lang: str) -> Iterator[tuple[str, str, int]]:
    number = 0
    for number, line in iter_lines(Path(path)):
        if not line.strip():
            raise DataError(f"{path}:{number}: empty line (each line must be one JSON object)")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{number}: invalid JSON ({error.msg} at column {error.colno})") from None
        record = record.get("translation", record) if isinstance(record, dict) else None
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in (source_lang, target_lang)):
            raise DataError(
                f"{path}:{number}: expected an object with string fields {source_lang!r} and {target_lang!r} "
                "(optionally inside 'translation')"
            )
        yield record[source_lang].strip(), record[target_lang].strip(), number
    if number == 0:
        raise DataError(f"{path}: empty file (no sentence pair)")


# -- a test split of a folder (`attn evaluate`) ----------------------------------------------------------------------


def _split_file(folder: Path, name: str) -> Path | None:
    stem, _, suffix = name.partition(".")
    return find_split_file(folder, stem, suffix)  # DataError when both NAME and NAME.gz exist


def split_stems(folder: Path, split: str) -> list[str]:
    """The file stems of `split` present in `folder`: its names (`SPLIT_STEMS`), else for test any one `test*`."""

    def present(stem: str) -> bool:
        return any(path.name.startswith(f"{stem}.") for path in folder.iterdir())

    stems = [stem for stem in SPLIT_STEMS[split] if present(stem)]
    if len(stems) > 1:
        raise DataError(
            f"{folder}: files {' and '.join(f'{stem}.*' for stem in stems)} could both be the {split} "
            "split; keep one of them, or choose with --sources_file/--references_file"
        )
    if stems or split != "test":
        return stems
    found = sorted({path.name.split(".")[0] for path in folder.glob("test*.*")})
    if len(found) > 1:
        raise DataError(f"{folder}: several test sets {found}; choose one with --sources_file/--references_file")
    return found


def paired_sentences(
    rows: Iterator[tuple[str, str, int]], where: Callable[[int], str], empty_targets: bool = False
) -> tuple[list[str], list[str]]:
    """Sources and references from the row readers above (stripped, file and line checked).

    An empty source or reference names its place (`where(line)`), unless `empty_targets` allows empty second sides.
    """
    firsts, seconds = [], []
    for first, second, number in rows:
        if not first or (not second and not empty_targets):
            side = "source" if not first else "reference"
            raise DataError(f"{where(number)}: empty {side} sentence (a test pair needs both)")
        firsts.append(first)
        seconds.append(second)
    return firsts, seconds


def read_folder_split(
    folder: Path, stem: str, split: str, source_lang: str | None, target_lang: str | None
) -> tuple[list[str], list[str], str, str] | None:
    """Sources, references and their languages from the files `{stem}.*` of `folder` (TSV, JSONL or one plain file
    per language, `.gz` too), or None if there is none; DataError naming the file and line of a bad pair."""
    if path := _split_file(folder, f"{stem}.tsv"):
        sources, references = paired_sentences(tsv_rows(str(path)), lambda number: f"{path}:{number}")
        return sources, references, source_lang or "src", target_lang or "tgt"
    if path := _split_file(folder, f"{stem}.jsonl"):
        if not (source_lang and target_lang):
            raise DataError(f"{path}: JSONL data needs --source_lang and --target_lang (the JSON keys)")
        rows = jsonl_rows(str(path), source_lang, target_lang)
        sources, references = paired_sentences(rows, lambda number: f"{path}:{number}")
        return sources, references, source_lang, target_lang
    languages = sorted(
        {path.name.removesuffix(".gz").split(".", 1)[1] for path in folder.glob(f"{stem}.*")} - {"tsv", "jsonl"}
    )
    if not languages:
        return None
    if not (source_lang and target_lang):
        if len(languages) != 2:
            raise DataError(
                f"{folder}: files {stem}.{{{','.join(languages)}}}; choose with --source_lang/--target_lang"
            )
        source_lang, target_lang = languages
    source_path = _split_file(folder, f"{stem}.{source_lang}")
    target_path = _split_file(folder, f"{stem}.{target_lang}")
    if source_path is None or target_path is None:
        missing = f"{stem}.{source_lang}" if source_path is None else f"{stem}.{target_lang}"
        raise DataError(f"{folder}: {missing}[.gz] is missing (the {split} split needs one file per language)")
    rows = text_pair_rows(str(source_path), str(target_path))
    sources, references = paired_sentences(rows, lambda number: f"{source_path}:{number} / {target_path}:{number}")
    return sources, references, source_lang, target_lang
