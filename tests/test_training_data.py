"""Tests of training/data.py: the three data sources and the clear errors on bad data (issue 10, check 6)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict
from modeling_attn.training.data import load_parallel_data, require_splits
from multi30k_data import MULTI30K, needs_multi30k

from modeling_attn.api.corpus import DataError, read_lines


def write(path: Path, lines: list[str] | bytes) -> Path:
    data = lines if isinstance(lines, bytes) else "".join(f"{line}\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def text_folder(tmp_path: Path, gz: bool = False) -> Path:
    suffix = ".gz" if gz else ""
    write(tmp_path / f"train.en{suffix}", ["a cat", "a dog", "two birds"])
    write(tmp_path / f"train.de{suffix}", ["eine Katze", "ein Hund", "zwei Vögel"])
    write(tmp_path / f"valid.en{suffix}", ["a cow"])
    write(tmp_path / f"valid.de{suffix}", ["eine Kuh"])
    write(tmp_path / f"test.en{suffix}", ["a fish"])
    write(tmp_path / f"test.de{suffix}", ["ein Fisch"])
    return tmp_path


@pytest.mark.parametrize("gz", [False, True])
def test_plain_text_folder(tmp_path, gz):
    parallel = load_parallel_data(str(text_folder(tmp_path, gz)))
    assert (parallel.source_lang, parallel.target_lang) == ("de", "en")  # two languages: sorted when not given
    parallel = load_parallel_data(str(tmp_path), "en", "de")
    assert set(parallel.splits) == {"train", "validation", "test"}
    assert parallel.splits["train"][2] == {"source": "two birds", "target": "zwei Vögel"}
    assert parallel.splits["validation"][0] == {"source": "a cow", "target": "eine Kuh"}


def test_tsv_and_jsonl_folders(tmp_path):
    (tmp_path / "tsv").mkdir()
    write(tmp_path / "tsv" / "train.tsv", ["a cat\teine Katze", "a dog\tein Hund"])
    parallel = load_parallel_data(str(tmp_path / "tsv"))
    assert parallel.splits["train"]["target"] == ["eine Katze", "ein Hund"]

    (tmp_path / "jsonl").mkdir()
    rows = [{"translation": {"en": "a cat", "de": "eine Katze"}}, {"en": "a dog", "de": "ein Hund"}]
    write(tmp_path / "jsonl" / "train.jsonl.gz", [json.dumps(row) for row in rows])
    parallel = load_parallel_data(str(tmp_path / "jsonl"), "en", "de")
    assert parallel.splits["train"]["source"] == ["a cat", "a dog"]


def test_dataset_with_translation_column(tmp_path):
    """WMT-style datasets: a save_to_disk folder, and a parquet folder opened by datasets.load_dataset(path)."""
    rows = {"translation": [{"en": "a cat", "de": "eine Katze"}, {"en": "a dog", "de": "ein Hund"}]}
    DatasetDict({"train": Dataset.from_dict(rows), "validation": Dataset.from_dict(rows)}).save_to_disk(
        tmp_path / "saved"
    )
    parallel = load_parallel_data(str(tmp_path / "saved"), "en", "de")
    assert parallel.splits["validation"]["target"] == ["eine Katze", "ein Hund"]

    (tmp_path / "parquet").mkdir()
    Dataset.from_dict(rows).to_parquet(tmp_path / "parquet" / "train.parquet")
    parallel = load_parallel_data(str(tmp_path / "parquet"), "de", "en")
    assert parallel.splits["train"]["source"] == ["eine Katze", "ein Hund"]


def test_embedded_task_without_data():
    parallel = load_parallel_data(None)
    assert set(parallel.splits) == {"train", "validation", "test"}


def test_empty_line_names_file_and_line(tmp_path):
    folder = text_folder(tmp_path)
    write(folder / "train.de", ["eine Katze", "", "zwei Vögel"])
    with pytest.raises(DataError, match=r"train\.de:2: empty target sentence"):
        load_parallel_data(str(folder), "en", "de")
    parallel = load_parallel_data(str(folder), "en", "de", drop_empty=True)
    assert len(parallel.splits["train"]) == 2
    assert parallel.report.dropped == {"train": 1}
    assert "train.en:2" in parallel.report.locations["train"][0]


def test_mismatched_line_counts(tmp_path):
    folder = text_folder(tmp_path)
    write(folder / "train.de", ["eine Katze", "ein Hund"])
    with pytest.raises(
        DataError, match=r"train\.en:3: line has no counterpart: train\.en has 3 lines but train\.de has 2"
    ):
        load_parallel_data(str(folder), "en", "de")


def test_non_utf8_bytes(tmp_path):
    folder = text_folder(tmp_path, gz=True)
    write(folder / "train.de.gz", "eine Katze\nein Hund\nzwei V\xf6gel\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"train\.de\.gz:3: not valid UTF-8 \(byte 0xf6 at column 7\)"):
        load_parallel_data(str(folder), "en", "de")
    assert read_lines(folder / "train.en.gz") == ["a cat", "a dog", "two birds"]


def test_bad_tsv_and_jsonl_lines(tmp_path):
    write(tmp_path / "train.tsv", ["a cat\teine Katze", "a dog ein Hund"])
    with pytest.raises(DataError, match=r"train\.tsv:2: expected 2 tab-separated fields"):
        load_parallel_data(str(tmp_path))
    (tmp_path / "train.tsv").unlink()
    write(tmp_path / "train.jsonl", ['{"en": "a cat", "de": "eine Katze"}', '{"en": "a dog", "de": '])
    with pytest.raises(DataError, match=r"train\.jsonl:2: invalid JSON"):
        load_parallel_data(str(tmp_path), "en", "de")


def test_missing_split_is_reported(tmp_path):
    folder = text_folder(tmp_path)
    for name in ("valid.en", "valid.de"):
        (folder / name).unlink()
    parallel = load_parallel_data(str(folder), "en", "de")
    with pytest.raises(DataError, match=r"no validation split \(looked for files validation/valid/val/dev\.\{en,de\}"):
        require_splits(parallel, ["train", "validation"], str(folder))
    (folder / "test.de").unlink()
    with pytest.raises(DataError, match=r"test\.de\[\.gz\] is missing"):
        load_parallel_data(str(folder), "en", "de")


@needs_multi30k
def test_multi30k_in_place():
    parallel = load_parallel_data(str(MULTI30K), "en", "de")
    assert {split: len(table) for split, table in parallel.splits.items()} == {
        "train": 29000,
        "validation": 1014,
        "test": 1000,
    }


def test_two_files_that_could_be_one_split_are_refused_naming_both(tmp_path):
    """Issue 34: a second candidate file is never ignored without a word."""
    folder = text_folder(tmp_path)
    write(folder / "dev.en", ["another", "validation set"])
    write(folder / "dev.de", ["ein anderes", "Validierungsset"])
    with pytest.raises(DataError, match=rf"{folder}/valid.en and {folder}/dev.en could both be the validation split"):
        load_parallel_data(str(folder), "en", "de")
    (folder / "dev.en").unlink()
    (folder / "dev.de").unlink()
    gzipped = folder / "train.en.gz"
    gzipped.write_bytes(gzip.compress(b"other text\n"))
    with pytest.raises(DataError, match=rf"{folder}/train.en and {gzipped} could both be train.en; keep one"):
        load_parallel_data(str(folder), "en", "de")
