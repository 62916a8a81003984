"""Preparing the training data at scale: the joint BPE vocabulary, the tokenized splits and streamed token batches.

The joint BPE vocabulary is trained once per data set and settings, and the tokenized splits are cached by `datasets`
under a key of data and tokenizer. Caches (all under the `datasets` cache, `HF_DATASETS_CACHE`, default
~/.cache/huggingface/datasets; delete a folder to clear it):
- `attn_text/`: the Arrow files read from text, TSV and JSONL files (`modeling_attn.training.data`), keyed by the
  files' paths, sizes and modification times;
- beside them, the tokenized splits (`cache-<fingerprint>*.arrow`, written by `Dataset.map`), keyed by the split's
  fingerprint, the tokenizer (its `tokenizer.json`, class and special tokens) and the length limits; Hub datasets
  keep theirs in their own folder of the same cache;
- `attn_bpe/<key>/`: the BPE vocabulary trained on a training split with given settings, keyed by the split's
  fingerprint and the settings (retraining on the same data gives the same vocabulary).
Only data read from files is cached; in-memory data (the embedded dates task) is prepared anew each run.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterator
from pathlib import Path

import datasets
from datasets import Dataset
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

# Part of the tokenized splits' cache key: bump it when `tokenize_splits` changes what it writes.
TOKENIZE_VERSION = 1
_TEXTS_PER_READ = 10_000


def release_free_memory() -> None:
    """Give the memory the C heap holds free back to the system (glibc's `malloc_trim`; nothing where the C library
    is another). Training a BPE vocabulary frees about 200 MB that glibc keeps otherwise for the life of the process,
    under everything that comes after it: at 1.5M pairs the first run's peak (bench/scale/README.md)."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: macOS, Windows, musl
        return
    trim(0)


def iter_texts(
    table: Dataset | datasets.IterableDataset, columns: tuple[str, ...] = ("source", "target")
) -> Iterator[str]:
    """Every text of `columns`, column after column, read in slices (a whole column is never a Python list)."""
    for column in columns:
        for batch in table.select_columns(column).iter(batch_size=_TEXTS_PER_READ):
            yield from batch[column]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of what decides the token ids: the backend's full serialization (vocabulary, merges, normalizer,
    pre-tokenizer, post-processor, added tokens), the class and the special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    described = backend.to_str() if backend is not None else Hasher.hash(tokenizer)
    return Hasher.hash([type(tokenizer).__name__, described, json.dumps(tokenizer.special_tokens_map, sort_keys=True)])


def is_cached_on_disk(table) -> bool:
    """Whether `table` is an Arrow-file-backed Dataset (whose fingerprint names its data), not in-memory data."""
    return isinstance(table, Dataset) and bool(table.cache_files)


def bpe_cache_folder(train: Dataset, settings: dict) -> Path | None:
    """Where the BPE vocabulary trained on `train` with `settings` is kept; None for in-memory data."""
    if not is_cached_on_disk(train):
        return None
    key = Hasher.hash([train._fingerprint, sorted(settings.items())])
    return Path(datasets.config.HF_DATASETS_CACHE) / "attn_bpe" / key


def tokenized_fingerprint(table: Dataset, tokenizer: PreTrainedTokenizerBase, limits: dict) -> str:
    """The `new_fingerprint` of a split's tokenization: `Dataset.map` reuses its cache file when this is unchanged."""
    return Hasher.hash(
        [TOKENIZE_VERSION, table._fingerprint, tokenizer_fingerprint(tokenizer), sorted(limits.items())]
    )
