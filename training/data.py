"""Parallel data for training, as a `datasets.DatasetDict` of {"source", "target"} strings.

Three sources, chosen by `--data`:
- a folder of plain-text parallel files `{split}.{lang}`, of `{split}.tsv` (source TAB target) or of `{split}.jsonl`
  files (`{"translation": {"en": ..., "de": ...}}` or `{"en": ..., "de": ...}` per line), each optionally `.gz`;
- a folder written by `DatasetDict.save_to_disk`, or any dataset `datasets.load_dataset` can open by name or path
  (a Hub dataset with a `translation` column, WMT style, e.g. `--data wmt14 --data_config de-en`);
- nothing: the embedded dates task of `modeling_attn.training.synthetic`.
Every file is read and checked before training starts, as a stream, into an Arrow file in the `datasets` cache
(`cache_folder()`); no split is ever held as Python lists. Non-UTF-8 bytes, a wrong number of fields, mismatched line
counts and empty sentences (unless `drop_empty=True`) raise `DataError` naming the file and line; a UTF-8 byte-order
mark is dropped. `streaming=True` (`--streaming`) makes the training split a `datasets.IterableDataset`, checked as it
is read. docs/training.md, "Your own data", and "The recipe's modules in detail" say more.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict, Features, IterableDataset, Value
from datasets.arrow_writer import ArrowWriter
from datasets.fingerprint import Hasher

from modeling_attn.api.corpus import (
    SPLIT_STEMS,
    DataError,
    find_split_file,
    jsonl_rows,
    languages_in,
    split_stem,
    text_pair_rows,
    tsv_rows,
)

from . import synthetic

logger = logging.getLogger(__name__)

_SHOWN_LOCATIONS = 5
# Suffixes of files that `datasets.load_dataset` reads itself (a folder of train.parquet is not a language "parquet").
_DATA_FORMATS = {"parquet", "arrow", "csv", "json", "txt"}
# Part of the cache key of the Arrow files read from text files: bump it when the readers' output changes.
READER_VERSION = 1
_ROWS_PER_WRITE = 20_000


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
                f"dropped {count} pair(s) with an empty side from split {split!r}, "
                f"e.g. at {', '.join(self.locations[split])}"
            )


@dataclass
class ParallelData:
    """The loaded splits, the language pair, and the report of what was dropped."""

    splits: DatasetDict
    source_lang: str
    target_lang: str
    report: DataReport


# The generators below yield the rows of one split: the pair (stripped) and the line it came from. `_generate` writes
# them to an Arrow file in slices of `_ROWS_PER_WRITE` rows, so only one slice is in memory at a time.
ROW_FEATURES = Features({"source": Value("string"), "target": Value("string"), "line": Value("int64")})


def _file_signature(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _row_dicts(rows, **gen_kwargs) -> Iterator[dict]:
    for source, target, line in rows(**gen_kwargs):
        yield {"source": source, "target": target, "line": line}


def cache_folder() -> Path:
    """Where the Arrow files read from text files are kept: `<datasets cache>/attn_text` (`HF_DATASETS_CACHE`,
    default ~/.cache/huggingface/datasets); the tokenized splits are written beside them by `Dataset.map`."""
    return Path(datasets.config.HF_DATASETS_CACHE) / "attn_text"


def _generate(rows, gen_kwargs: dict, files: list[Path], streaming: bool) -> Dataset | IterableDataset:
    """The rows of `rows(**gen_kwargs)` as a memory-mapped Arrow Dataset, cached under a fingerprint of the files'
    paths, sizes and modification times (a changed file is read again); or, streaming, as an IterableDataset."""
    if streaming:
        return IterableDataset.from_generator(
            _row_dicts, features=ROW_FEATURES, gen_kwargs={"rows": rows, **gen_kwargs}
        )
    fingerprint = Hasher.hash(
        [READER_VERSION, rows.__name__, sorted(gen_kwargs.items()), [_file_signature(f) for f in files]]
    )
    path = cache_folder() / f"{rows.__name__.strip('_')}-{fingerprint}.arrow"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial_path = path.with_name(f"{path.name}.{os.getpid()}.incomplete")
        try:
            with ArrowWriter(features=ROW_FEATURES, path=str(partial_path)) as writer:
                iterator = rows(**gen_kwargs)
                while chunk := list(itertools.islice(iterator, _ROWS_PER_WRITE)):
                    sources, targets, lines = zip(*chunk, strict=True)
                    writer.write_batch({"source": list(sources), "target": list(targets), "line": list(lines)})
                writer.finalize()
            os.replace(partial_path, path)  # a killed read leaves no file that looks complete
        finally:
            partial_path.unlink(missing_ok=True)
    return Dataset.from_file(str(path))


def _check_empty(split: str, table: Dataset, where, drop_empty: bool, report: DataReport) -> Dataset:
    """`table` without its `line` column; a pair with an empty side raises DataError at its location, or with
    `drop_empty` is dropped and counted in `report`. The check runs on Arrow columns, not Python lists."""
    if len(table) == 0:
        raise DataError(f"split {split!r} holds no sentence pair")
    empty = {side: _empty_rows(table, side) for side in ("source", "target")}
    rows = np.flatnonzero(empty["source"] | empty["target"])
    if len(rows):
        lines = table.data.column("line").take(pa.array(rows[:_SHOWN_LOCATIONS])).to_pylist()
        if not drop_empty:
            side = "source" if empty["source"][rows[0]] else "target"
            raise DataError(
                f"{where(lines[0])}: empty {side} sentence; remove the pair or pass --drop_empty_pairs to drop such "
                "pairs (they are counted and reported)"
            )
        report.dropped[split] = report.dropped.get(split, 0) + len(rows)
        report.locations.setdefault(split, []).extend(where(line) for line in lines)
        if len(rows) == len(table):
            raise DataError(f"split {split!r} holds no sentence pair")
        table = table.select(np.flatnonzero(~(empty["source"] | empty["target"])))
    return table.remove_columns("line")


def _empty_rows(table: Dataset, column: str) -> np.ndarray:
    return pc.equal(pc.utf8_length(table.data.column(column)), 0).to_numpy(zero_copy_only=False)


def _load_folder(
    folder: Path, source_lang: str | None, target_lang: str | None, drop_empty: bool, streaming: bool = False
) -> ParallelData:
    report = DataReport()
    table_formats = [suffix for suffix in ("tsv", "jsonl") if split_stem(folder, "train", suffix)]
    text_languages = sorted(
        {
            name.split(".")[1]
            for path in folder.glob("train.*")
            if len((name := path.name.removesuffix(".gz")).split(".")) == 2
        }
        - {"tsv", "jsonl"}
    )
    if table_formats and text_languages:
        raise DataError(
            f"{folder}: train.{table_formats[0]} and train.{{{','.join(text_languages)}}} are both training data; "
            "keep one format (one file per language, or one TSV / JSONL file per split)"
        )
    if split_stem(folder, "train", "tsv") or split_stem(folder, "train", "jsonl"):
        kind = "tsv" if split_stem(folder, "train", "tsv") else "jsonl"
        if kind == "jsonl" and not (source_lang and target_lang):
            raise DataError(f"{folder}: JSONL data needs --source_lang and --target_lang (the JSON keys)")
        source_lang, target_lang = source_lang or "src", target_lang or "tgt"
    else:
        kind = "text"
        languages = languages_in(folder)
        if not (source_lang and target_lang):
            if len(languages) != 2:
                raise DataError(
                    f"{folder}: found languages {languages}; choose the pair with --source_lang and --target_lang"
                )
            source_lang, target_lang = languages
        if split_stem(folder, "train", source_lang) is None and split_stem(folder, "train", target_lang) is None:
            raise DataError(
                f"{folder}: no training data: expected train.{source_lang} and train.{target_lang} (optionally .gz), "
                "train.tsv or train.jsonl"
            )
    splits = {}
    for split in SPLIT_STEMS:
        suffix = {"tsv": "tsv", "jsonl": "jsonl", "text": source_lang}[kind]
        stem = split_stem(folder, split, suffix)
        if kind == "text" and stem is None:
            stem = split_stem(folder, split, target_lang)
        if stem is None:
            continue
        if kind == "text":
            source_path, target_path = (
                find_split_file(folder, stem, source_lang),
                find_split_file(folder, stem, target_lang),
            )
            if source_path is None or target_path is None:
                missing = f"{stem}.{source_lang}" if source_path is None else f"{stem}.{target_lang}"
                raise DataError(f"{folder}: {missing}[.gz] is missing (split {stem!r} needs one file per language)")
            files = [source_path, target_path]
            generator, gen_kwargs = text_pair_rows, {"source_path": str(source_path), "target_path": str(target_path)}
            where = partial("{0}:{2} / {1}:{2}".format, source_path, target_path)
        else:
            path = find_split_file(folder, stem, kind)
            files, where = [path], partial("{0}:{1}".format, path)
            generator = tsv_rows if kind == "tsv" else jsonl_rows
            gen_kwargs = {"path": str(path)} | (
                {} if kind == "tsv" else {"source_lang": source_lang, "target_lang": target_lang}
            )
        streamed = streaming and split == "train"
        table = _generate(generator, gen_kwargs, files, streamed)
        splits[split] = (
            _stream_checked(split, table, where, drop_empty)
            if streamed
            else _check_empty(split, table, where, drop_empty, report)
        )
    return ParallelData(DatasetDict(splits), source_lang, target_lang, report)


def _stream_checked(split: str, table: IterableDataset, where, drop_empty: bool) -> IterableDataset:
    """A streamed split checked as it is read: an empty side raises at its location (dropped with `drop_empty`; a
    stream cannot count them up front)."""

    def check(batch: dict) -> bool | list[bool]:
        keep = []
        for source, target, line in zip(batch["source"], batch["target"], batch["line"], strict=True):
            if not source or not target:
                if not drop_empty:
                    side = "source" if not source else "target"
                    raise DataError(
                        f"{where(line)}: empty {side} sentence; remove the pair or pass --drop_empty_pairs to drop "
                        "such pairs"
                    )
                logger.warning(f"split {split!r}: dropped the pair at {where(line)} (an empty side)")
            keep.append(bool(source and target))
        return keep

    return table.filter(check, batched=True).remove_columns("line")


def _hub_rows(batch: dict, indices: list[int], name: str, split_name: str, source_lang: str, target_lang: str) -> dict:
    sources, targets = [], []
    for index, row in zip(indices, batch["translation"], strict=True):
        if not isinstance(row, dict) or source_lang not in row or target_lang not in row:
            raise DataError(f"dataset {name}, split {split_name!r}, row {index}: no {source_lang!r}/{target_lang!r}")
        sources.append((row[source_lang] or "").strip())
        targets.append((row[target_lang] or "").strip())
    return {"source": sources, "target": targets, "line": indices}


def _load_hub(
    name: str,
    config: str | None,
    source_lang: str | None,
    target_lang: str | None,
    drop_empty: bool,
    streaming: bool = False,
) -> ParallelData:
    path = Path(name)
    if path.is_file():
        raise DataError(
            f"{name} is a file; --data takes a folder of {{split}}.{{lang}}, {{split}}.tsv or {{split}}.jsonl files "
            "(or a dataset name)"
        )
    try:
        if (path / "dataset_dict.json").is_file():
            loaded = datasets.load_from_disk(name)
            if streaming:
                loaded = {split: table.to_iterable_dataset() for split, table in loaded.items()}
        else:
            loaded = datasets.load_dataset(name, config, streaming=streaming)
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
        if table.column_names is not None and "translation" not in table.column_names:
            raise DataError(
                f"dataset {name}, split {split_name!r}: no 'translation' column (has {table.column_names})"
            )
        if not (source_lang and target_lang):
            first = next(iter(table.take(1) if streaming else table.select(range(min(1, len(table))))), None)
            languages = sorted(first["translation"]) if first else []
            if len(languages) != 2:
                raise DataError(f"dataset {name}: languages {languages}; choose with --source_lang and --target_lang")
            source_lang, target_lang = languages
        rows = partial(_hub_rows, name=name, split_name=split_name, source_lang=source_lang, target_lang=target_lang)
        where = partial("dataset {0}, split {1!r}, row {2}".format, name, split_name)
        remove = table.column_names or ["translation"]
        if streaming and split == "train":
            table = table.map(rows, batched=True, with_indices=True, remove_columns=remove, features=ROW_FEATURES)
            splits[split] = _stream_checked(split, table, where, drop_empty)
        else:
            if isinstance(table, IterableDataset):  # a small split of a streamed dataset: prepared in memory
                table = Dataset.from_list(list(table), features=table.features)
            table = table.map(
                rows,
                batched=True,
                with_indices=True,
                remove_columns=remove,
                features=ROW_FEATURES,
                desc=f"reading {split_name}",
            )
            splits[split] = _check_empty(split, table, where, drop_empty, report)
    if "train" not in splits:
        raise DataError(f"dataset {name}: no 'train' split (has {list(loaded)})")
    return ParallelData(DatasetDict(splits), source_lang, target_lang, report)


def load_parallel_data(
    data: str | None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    data_config: str | None = None,
    drop_empty: bool = False,
    streaming: bool = False,
) -> ParallelData:
    """Load and check the parallel data named by `data` (see the module docstring); None gives the embedded task.

    `streaming`: the training split is an `IterableDataset`, read (and checked) as it is iterated instead of being
    written to an Arrow file up front; the validation and test splits, small, are prepared as usual.
    """
    if data is None:
        splits = synthetic.build_dataset()
        if streaming:
            splits["train"] = splits["train"].to_iterable_dataset()
        return ParallelData(splits, synthetic.SOURCE_LANG, synthetic.TARGET_LANG, DataReport())
    folder = Path(data)
    is_text_folder = folder.is_dir() and any(
        len(parts := p.name.removesuffix(".gz").split(".")) == 2
        and parts[0] == "train"
        and parts[1] not in _DATA_FORMATS
        for p in folder.iterdir()
    )
    parallel = (
        _load_folder(folder, source_lang, target_lang, drop_empty, streaming)
        if is_text_folder
        else _load_hub(data, data_config, source_lang, target_lang, drop_empty, streaming)
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
