"""Parallel data for training, as a `datasets.DatasetDict` of {"source", "target"} strings.

Three sources, chosen by `--data`:
- a folder of plain-text parallel files `{split}.{lang}` (optionally `.gz`), one sentence per line (the Multi30k /
  fairseq layout); a folder of `{split}.tsv` (source TAB target) or `{split}.jsonl` files
  (`{"translation": {"en": ..., "de": ...}}` or `{"en": ..., "de": ...}` per line), also optionally `.gz`;
- a folder written by `DatasetDict.save_to_disk`, or any dataset `datasets.load_dataset` can open by name or path
  (a Hub dataset with a `translation` column, WMT style, e.g. `--data wmt14 --data_config de-en`);
- nothing: the embedded dates task of `training.synthetic`.

Every file is read and checked before training starts. Non-UTF-8 bytes, a wrong number of fields and mismatched
line counts raise `DataError` naming the file and line. Empty sentences raise too, unless `drop_empty=True`, which
drops them and reports how many and where. A UTF-8 byte-order mark at the start of a file is dropped (Windows
editors write one). A `--data` that is neither a folder nor a dataset `datasets` can open raises `DataError` naming it.
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import datasets
from datasets import Dataset, DatasetDict

from . import synthetic

logger = logging.getLogger(__name__)

# File stems tried for each split, in order; a test stem may also be any one stem starting with "test"
# (Multi30k's `test_2016_flickr`).
SPLIT_STEMS = {"train": ["train"], "validation": ["validation", "valid", "val", "dev"], "test": ["test"]}
_SHOWN_LOCATIONS = 5
# Suffixes of files that `datasets.load_dataset` reads itself (a folder of train.parquet is not a language "parquet").
_DATA_FORMATS = {"parquet", "arrow", "csv", "json", "txt"}


class DataError(ValueError):
    """Bad training data; the message names the file (or dataset split) and the line (or row)."""


@dataclass
class DataReport:
    """What loading dropped, per split: counts and the first few locations (file:line or split:row)."""

    dropped: dict[str, int] = field(default_factory=dict)
    locations: dict[str, list[str]] = field(default_factory=dict)

    def drop(self, split: str, location: str) -> None:
        self.dropped[split] = self.dropped.get(split, 0) + 1
        shown = self.locations.setdefault(split, [])
        if len(shown) < _SHOWN_LOCATIONS:
            shown.append(location)

    def log(self) -> None:
        for split, count in self.dropped.items():
            logger.warning(
                f"dropped {count} pair(s) with an empty side from split {split!r}, e.g. at {', '.join(self.locations[split])}"
            )


@dataclass
class ParallelData:
    """The loaded splits, the language pair, and the report of what was dropped."""

    splits: DatasetDict
    source_lang: str
    target_lang: str
    report: DataReport


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (gzipped if its name ends in .gz), without line ends; DataError on bad bytes."""
    lines = []
    try:
        with _open_binary(path) as handle:
            for number, raw in enumerate(handle, 1):
                try:
                    lines.append(raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n"))
                except UnicodeDecodeError as error:
                    raise DataError(
                        f"{path}:{number}: not valid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1}); "
                        "re-encode the file as UTF-8"
                    ) from None
    except (OSError, EOFError) as error:  # e.g. a truncated or corrupt .gz file
        raise DataError(f"{path}: cannot be read: {error}") from None
    return lines


def _find(folder: Path, stem: str, suffix: str) -> Path | None:
    for name in (f"{stem}.{suffix}", f"{stem}.{suffix}.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _split_stem(folder: Path, split: str, suffix: str) -> str | None:
    """The file stem of `split` among files ending in `.{suffix}` (or `.{suffix}.gz`), or None."""
    for stem in SPLIT_STEMS[split]:
        if _find(folder, stem, suffix):
            return stem
    if split == "test":
        stems = sorted({p.name.split(".")[0] for p in folder.glob(f"test*.{suffix}*")} - {"test"})
        if len(stems) == 1:
            return stems[0]
        if len(stems) > 1:
            raise DataError(f"{folder}: several test sets {stems}; keep one or rename it to test.{suffix}")
    return None


def _pairs_table(split: str, pairs: list[tuple[str, str, str]], drop_empty: bool, report: DataReport) -> Dataset:
    """A Dataset of the (source, target, location) triples; empty sides raise or are dropped with a count."""
    sources, targets = [], []
    for source, target, location in pairs:
        source, target = source.strip(), target.strip()
        if not source or not target:
            if not drop_empty:
                side = "source" if not source else "target"
                raise DataError(
                    f"{location}: empty {side} sentence; remove the pair or pass --drop_empty_pairs to drop such pairs "
                    "(they are counted and reported)"
                )
            report.drop(split, location)
            continue
        sources.append(source)
        targets.append(target)
    if not sources:
        raise DataError(f"split {split!r} holds no sentence pair")
    return Dataset.from_dict({"source": sources, "target": targets})


def _languages_in(folder: Path) -> list[str]:
    stems = {stem for stems in SPLIT_STEMS.values() for stem in stems}
    langs = set()
    for path in folder.iterdir():
        parts = path.name.removesuffix(".gz").split(".")
        if len(parts) == 2 and (parts[0] in stems or parts[0].startswith("test")) and parts[1] not in ("tsv", "jsonl"):
            langs.add(parts[1])
    return sorted(langs)


def _read_text_pair(folder: Path, stem: str, source_lang: str, target_lang: str) -> list[tuple[str, str, str]]:
    source_path, target_path = _find(folder, stem, source_lang), _find(folder, stem, target_lang)
    if source_path is None or target_path is None:
        missing = f"{stem}.{source_lang}" if source_path is None else f"{stem}.{target_lang}"
        raise DataError(f"{folder}: {missing}[.gz] is missing (split {stem!r} needs one file per language)")
    sources, targets = read_lines(source_path), read_lines(target_path)
    if not sources and not targets:
        raise DataError(f"{source_path} and {target_path} are empty (split {stem!r} holds no sentence pair)")
    if len(sources) != len(targets):
        longer, shorter = (source_path, target_path) if len(sources) > len(targets) else (target_path, source_path)
        first_unmatched = min(len(sources), len(targets)) + 1
        raise DataError(
            f"{longer}:{first_unmatched}: line has no counterpart: {source_path.name} has {len(sources)} lines but "
            f"{target_path.name} has {len(targets)}; {shorter} ends after line {first_unmatched - 1}"
        )
    return [
        (s, t, f"{source_path}:{n} / {target_path}:{n}")
        for n, (s, t) in enumerate(zip(sources, targets, strict=True), 1)
    ]


def _read_tsv(path: Path) -> list[tuple[str, str, str]]:
    pairs = []
    lines = read_lines(path)
    if not lines:
        raise DataError(f"{path}: empty file (no sentence pair)")
    for number, line in enumerate(lines, 1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(f"{path}:{number}: expected 2 tab-separated fields (source, target), found {len(fields)}")
        pairs.append((fields[0], fields[1], f"{path}:{number}"))
    return pairs


def _read_jsonl(path: Path, source_lang: str, target_lang: str) -> list[tuple[str, str, str]]:
    pairs = []
    lines = read_lines(path)
    if not lines:
        raise DataError(f"{path}: empty file (no sentence pair)")
    for number, line in enumerate(lines, 1):
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
        pairs.append((record[source_lang], record[target_lang], f"{path}:{number}"))
    return pairs


def _load_folder(folder: Path, source_lang: str | None, target_lang: str | None, drop_empty: bool) -> ParallelData:
    report = DataReport()
    if _split_stem(folder, "train", "tsv") or _split_stem(folder, "train", "jsonl"):
        kind = "tsv" if _split_stem(folder, "train", "tsv") else "jsonl"
        if kind == "jsonl" and not (source_lang and target_lang):
            raise DataError(f"{folder}: JSONL data needs --source_lang and --target_lang (the JSON keys)")
        source_lang, target_lang = source_lang or "src", target_lang or "tgt"
    else:
        kind = "text"
        languages = _languages_in(folder)
        if not (source_lang and target_lang):
            if len(languages) != 2:
                raise DataError(
                    f"{folder}: found languages {languages}; choose the pair with --source_lang and --target_lang"
                )
            source_lang, target_lang = languages
        if _split_stem(folder, "train", source_lang) is None and _split_stem(folder, "train", target_lang) is None:
            raise DataError(
                f"{folder}: no training data: expected train.{source_lang} and train.{target_lang} (optionally .gz), "
                "train.tsv or train.jsonl"
            )
    splits = {}
    for split in SPLIT_STEMS:
        suffix = {"tsv": "tsv", "jsonl": "jsonl", "text": source_lang}[kind]
        stem = _split_stem(folder, split, suffix)
        if kind == "text" and stem is None:
            stem = _split_stem(folder, split, target_lang)
        if stem is None:
            continue
        if kind == "text":
            pairs = _read_text_pair(folder, stem, source_lang, target_lang)
        elif kind == "tsv":
            pairs = _read_tsv(_find(folder, stem, "tsv"))
        else:
            pairs = _read_jsonl(_find(folder, stem, "jsonl"), source_lang, target_lang)
        splits[split] = _pairs_table(split, pairs, drop_empty, report)
    return ParallelData(DatasetDict(splits), source_lang, target_lang, report)


def _load_hub(name: str, config: str | None, source_lang: str | None, target_lang: str | None,
              drop_empty: bool) -> ParallelData:  # fmt: skip
    path = Path(name)
    if path.is_file():
        raise DataError(
            f"{name} is a file; --data takes a folder of {{split}}.{{lang}}, {{split}}.tsv or {{split}}.jsonl files "
            "(or a dataset name)"
        )
    try:
        loaded = (
            datasets.load_from_disk(name)
            if (path / "dataset_dict.json").is_file()
            else datasets.load_dataset(name, config)
        )
    except (FileNotFoundError, ConnectionError, datasets.exceptions.DatasetNotFoundError) as error:
        where = "no such folder" if not path.exists() else "a folder with no train.* files"
        raise DataError(
            f"{name}: {where}, and not a dataset datasets.load_dataset can open ({type(error).__name__}: {error})"
        ) from None
    report, splits = DataReport(), {}
    aliases = {alias: split for split, stems in SPLIT_STEMS.items() for alias in stems}
    for split_name, table in loaded.items():
        split = aliases.get(split_name, "test" if split_name.startswith("test") else None)
        if split is None or split in splits:
            logger.warning(f"dataset {name}: split {split_name!r} is not used (not train/validation/test)")
            continue
        if "translation" not in table.column_names:
            raise DataError(
                f"dataset {name}, split {split_name!r}: no 'translation' column (has {table.column_names})"
            )
        rows = table["translation"]
        languages = sorted(rows[0]) if len(rows) else []
        if not (source_lang and target_lang):
            if len(languages) != 2:
                raise DataError(f"dataset {name}: languages {languages}; choose with --source_lang and --target_lang")
            source_lang, target_lang = languages
        pairs = []
        for number, row in enumerate(rows):
            if source_lang not in row or target_lang not in row:
                raise DataError(
                    f"dataset {name}, split {split_name!r}, row {number}: no {source_lang!r}/{target_lang!r}"
                )
            pairs.append(
                (row[source_lang] or "", row[target_lang] or "", f"dataset {name}, split {split_name!r}, row {number}")
            )
        splits[split] = _pairs_table(split, pairs, drop_empty, report)
    if "train" not in splits:
        raise DataError(f"dataset {name}: no 'train' split (has {list(loaded)})")
    return ParallelData(DatasetDict(splits), source_lang, target_lang, report)


def load_parallel_data(data: str | None, source_lang: str | None = None, target_lang: str | None = None,
                       data_config: str | None = None, drop_empty: bool = False) -> ParallelData:  # fmt: skip
    """Load and check the parallel data named by `data` (see the module docstring); None gives the embedded task."""
    if data is None:
        splits = synthetic.build_dataset()
        return ParallelData(splits, synthetic.SOURCE_LANG, synthetic.TARGET_LANG, DataReport())
    folder = Path(data)
    is_text_folder = folder.is_dir() and any(
        len(parts := p.name.removesuffix(".gz").split(".")) == 2
        and parts[0] == "train"
        and parts[1] not in _DATA_FORMATS
        for p in folder.iterdir()
    )
    parallel = (
        _load_folder(folder, source_lang, target_lang, drop_empty)
        if is_text_folder
        else _load_hub(data, data_config, source_lang, target_lang, drop_empty)
    )
    parallel.report.log()
    return parallel


def require_splits(parallel: ParallelData, splits: list[str], data: str | None) -> None:
    """Raise DataError naming what was looked for if one of `splits` is missing."""
    for split in splits:
        if split not in parallel.splits:
            stems = "/".join(SPLIT_STEMS[split])
            raise DataError(
                f"{data}: no {split} split (looked for files {stems}.{{{parallel.source_lang},{parallel.target_lang}}}"
                f"[.gz], {stems}.tsv, {stems}.jsonl or a dataset split named {stems}); add it, or turn off what needs "
                f"it ({'--eval_strategy no' if split == 'validation' else '--do_predict False'})"
            )
