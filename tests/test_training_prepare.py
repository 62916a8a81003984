"""Tests of the data preparation at scale (issue 24, item 1): the Arrow path gives exactly the token ids and batches
of the old in-memory path, a second run reuses the cached Arrow files, BPE vocabulary and tokenized splits, and
`--streaming` batches hold the token budget, cover every pair once per pass and resume where the run stopped."""

from __future__ import annotations

import ctypes
import gzip
import logging
import platform
import shlex
import shutil
from pathlib import Path

import datasets
import numpy as np
import pytest
import runs
import torch
from datasets import Dataset
from modeling_attn.training.batching import StreamingTokenBatches, TokenBatchSampler, column_lengths
from modeling_attn.training.data import ParallelData, load_parallel_data
from modeling_attn.training.prepare import release_free_memory
from modeling_attn.training.synthetic import generate_pairs
from modeling_attn.training.tokenizer import train_bpe_tokenizer, truncate
from modeling_attn.training.train import TrainingRun, tokenize_splits
from safetensors.torch import load_file
from test_training_batching import reference_pack_batches
from transformers import AutoTokenizer, DataCollatorForSeq2Seq

from modeling_attn.api.corpus import read_lines
from modeling_attn.cli.train import parse_args
from modeling_attn.cli.train import train as main

TINY = [*runs.TINY, "--generation_max_length", "16", *runs.QUIET]
EN_DE = shlex.split("--source_lang en --target_lang de")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh `datasets` cache for the test: what it finds there, this test wrote."""
    folder = tmp_path / "hf-datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(folder))
    return folder


def write_corpus(folder: Path, pairs: list[tuple[str, str]], splits=("train", "valid", "test")) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits:
        chosen = pairs if split == "train" else pairs[:20]
        for lang, side in (("en", 0), ("de", 1)):
            text = "".join(f"{pair[side]}\n" for pair in chosen).encode()
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(text))
    return folder


@pytest.fixture
def corpus(tmp_path) -> Path:
    # The embedded task's pairs, with a few long sources so that truncation happens, and padding spaces (stripped).
    pairs = [(f" {source} ", target) for source, target in generate_pairs(400, seed=3)]
    pairs += [(" ".join([source] * 12), target) for source, target in generate_pairs(5, seed=4)]
    return write_corpus(tmp_path / "corpus", pairs)


def corpus_args(tmp_path: Path, corpus: Path, *extra: str):
    """The recipe and Trainer arguments of an English-German run on `corpus`."""
    return parse_args(["--data", str(corpus), "--output_dir", str(tmp_path / "out"), *EN_DE, *extra])


def recipe_for(tmp_path: Path, corpus: Path, *extra: str):
    recipe, _ = corpus_args(tmp_path, corpus, "--max_source_length", "48", *extra)
    return recipe


def tokenize(parallel: ParallelData, tokenizer, recipe) -> datasets.DatasetDict:
    """`tokenize_splits` with the recipe's length limits and workers, as `TrainingRun.tokenize` calls it."""
    limits = (recipe.max_source_length, recipe.max_target_length, recipe.preprocessing_num_workers)
    return tokenize_splits(parallel, tokenizer, *limits)


def test_arrow_path_gives_the_token_ids_and_batches_of_the_in_memory_path(tmp_path, corpus, cache, caplog):
    tokenizer = train_bpe_tokenizer([s for _, s in generate_pairs(300, seed=1)], vocab_size=200)
    recipe = recipe_for(tmp_path, corpus, "--preprocessing_num_workers", "2")
    parallel = load_parallel_data(str(corpus), "en", "de")
    with caplog.at_level(logging.WARNING, logger="modeling_attn.training"):
        tokenized = tokenize(parallel, tokenizer, recipe)
    assert "train: truncated 5 pair(s) to 48/256 tokens" in caplog.text
    assert tokenized["train"].cache_files  # on disk, not in memory

    # The old path: every line in a Python list, tokenized in one call, truncated as the recipe does.
    sources = [line.strip() for line in read_lines(corpus / "train.en.gz")]
    targets = [line.strip() for line in read_lines(corpus / "train.de.gz")]
    encoded = tokenizer(sources, text_target=targets)
    expected_sources = [truncate(ids, recipe.max_source_length) for ids in encoded["input_ids"]]
    expected_targets = [truncate(ids, recipe.max_target_length) for ids in encoded["labels"]]
    assert sum(len(a) != len(b) for a, b in zip(expected_sources, encoded["input_ids"], strict=True)) == 5
    train = tokenized["train"]
    assert train["input_ids"] == expected_sources
    assert train["labels"] == expected_targets
    assert train["attention_mask"] == [[1] * len(ids) for ids in expected_sources]
    assert train["target"] == targets

    source_lengths, target_lengths = column_lengths(train, "input_ids"), column_lengths(train, "labels")
    assert isinstance(source_lengths, np.ndarray)
    assert source_lengths.tolist() == [len(ids) for ids in expected_sources]
    sampler = TokenBatchSampler(source_lengths, target_lengths, 300, seed=5, shuffle=False)
    expected_batches = reference_pack_batches(
        [len(i) for i in expected_sources], [len(i) for i in expected_targets], 300, seed=5
    )
    assert list(sampler) == expected_batches
    # A selection (an indices mapping over the Arrow file) reads the lengths of the selected rows.
    assert column_lengths(train.select([4, 0, 2]), "labels").tolist() == [len(expected_targets[i]) for i in (4, 0, 2)]


def test_a_second_run_reuses_the_cache(tmp_path, corpus, cache, caplog):
    """Read, BPE vocabulary and tokenization are computed once; a second run opens the same files, writes none."""
    recipe, args = corpus_args(tmp_path, corpus, "--vocab_size", "200")

    def run():
        training = TrainingRun(recipe, args)
        training.parallel = load_parallel_data(str(corpus), "en", "de")
        training.build_tokenizer()
        training.tokenize()
        return training.parallel, training.tokenizer, training.tokenized

    def files():
        return {path: path.stat().st_mtime_ns for path in cache.rglob("*") if path.is_file()}

    first, first_tokenizer, first_tokenized = run()
    written = files()
    assert any(path.name.startswith("cache-") for path in written)  # the tokenized splits
    assert any("attn_bpe" in path.parts for path in written)  # the vocabulary
    with caplog.at_level(logging.INFO, logger="modeling_attn.training"):
        second, second_tokenizer, second_tokenized = run()
    assert files() == written  # nothing new, nothing rewritten
    assert "reusing the joint BPE vocabulary" in caplog.text
    assert second_tokenizer.get_vocab() == first_tokenizer.get_vocab()
    for split in ("train", "validation", "test"):
        assert second_tokenized[split].cache_files == first_tokenized[split].cache_files
        assert second_tokenized[split]._fingerprint == first_tokenized[split]._fingerprint

    # Another tokenizer: tokenized anew (the key holds the tokenizer), the text is not read again.
    other = train_bpe_tokenizer([s for _, s in generate_pairs(300, seed=2)], vocab_size=150)
    retokenized = tokenize(load_parallel_data(str(corpus), "en", "de"), other, recipe)
    assert retokenized["train"].cache_files != first_tokenized["train"].cache_files
    assert retokenized["train"]["input_ids"] == other(list(first.splits["train"]["source"]))["input_ids"]
    # A changed file is read again.
    write_corpus(corpus, [("a cat", "eine Katze")] * 30, splits=("train",))
    assert load_parallel_data(str(corpus), "en", "de").splits["train"]["source"] == ["a cat"] * 30


def test_streamed_data_equals_the_prepared_data(tmp_path, corpus, cache):
    prepared = load_parallel_data(str(corpus), "en", "de").splits["train"]
    streamed = load_parallel_data(str(corpus), "en", "de", streaming=True).splits["train"]
    assert isinstance(streamed, datasets.IterableDataset)
    assert list(streamed) == list(prepared)
    (corpus / "train.de.gz").write_bytes(gzip.compress(b"eine Katze\n\nzwei\n"))
    (corpus / "train.en.gz").write_bytes(gzip.compress(b"a cat\na dog\ntwo\n"))
    with pytest.raises(Exception, match=r"train\.de\.gz:2: empty target sentence"):
        list(load_parallel_data(str(corpus), "en", "de", streaming=True).splits["train"])
    pairs = load_parallel_data(str(corpus), "en", "de", drop_empty=True, streaming=True).splits["train"]
    assert [pair["source"] for pair in pairs] == ["a cat", "two"]


@pytest.mark.parametrize(("buffer_pairs", "max_tokens"), [(1, 60), (37, 60), (100, 250), (1000, 400)])
def test_streaming_batches_hold_the_budget_and_cover_each_pair_once(buffer_pairs, max_tokens):
    rng = np.random.default_rng(buffer_pairs)
    lengths = rng.integers(1, 60, size=(500, 2))
    rows = {
        "input_ids": [list(range(s)) for s, _ in lengths],
        "labels": [list(range(t)) for _, t in lengths],
        "pair": list(range(len(lengths))),
    }
    stream = Dataset.from_dict(rows).to_iterable_dataset()
    batches = StreamingTokenBatches(stream, max_tokens, buffer_pairs, collate_fn=list, seed=0)
    for epoch in (0, 1):
        batches.set_epoch(epoch)
        seen = []
        for batch in batches:
            assert len(batch) * max(max(len(p["input_ids"]), len(p["labels"])) for p in batch) <= max_tokens
            pairs = [p["pair"] for p in batch]
            assert len({pair // buffer_pairs for pair in pairs}) == 1  # a batch comes from one buffer
            seen += pairs
        assert sorted(seen) == list(range(len(lengths)))
        assert list(batches) == list(batches)  # the same pass twice: the same batches
    with pytest.raises(ValueError, match="cannot hold a streamed training pair of 59 tokens"):
        list(StreamingTokenBatches(stream, 58, buffer_pairs, collate_fn=list))


def test_streaming_resume_skips_the_batches_already_trained(tmp_path, corpus, cache):
    """What the README says: a resumed streamed run reads the stream again and skips the batches it trained, so
    it ends with the weights of the run never stopped (within the first pass over the data)."""
    common = [*TINY, "--data", str(corpus), *EN_DE, "--streaming", "True", "--streaming_buffer_pairs", "64"]
    common += shlex.split("--save_strategy steps --save_steps 4 --seed 7 --logging_steps 1")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main([*common, "--output_dir", str(straight), "--max_steps", "8"]) == 0
    assert main([*common, "--output_dir", str(resumed), "--max_steps", "4"]) == 0
    assert (
        main(
            [
                *common,
                "--output_dir",
                str(resumed),
                "--max_steps",
                "8",
                "--resume_from_checkpoint",
                str(resumed / "checkpoint-4"),
            ]
        )
        == 0
    )
    expected, got = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    # Still in the first pass over the data (the case the README states): one pass holds more than 8 batches.
    tokenizer = AutoTokenizer.from_pretrained(straight)
    streamed = load_parallel_data(str(corpus), "en", "de", streaming=True).splits["train"]
    recipe, _ = parse_args([*common, "--output_dir", str(tmp_path / "unused"), "--max_steps", "8"])
    pairs = tokenize(ParallelData(datasets.DatasetDict(train=streamed), "en", "de", None), tokenizer, recipe)
    assert sum(1 for _ in StreamingTokenBatches(pairs["train"], 200, 64, collate_fn=list, seed=7)) > 8
    # A run that did not skip (--ignore_data_skip) trains other batches and ends elsewhere.
    shutil.rmtree(resumed / "checkpoint-8")
    unskipped = tmp_path / "unskipped"
    shutil.copytree(resumed / "checkpoint-4", unskipped / "checkpoint-4")
    assert (
        main(
            [
                *common,
                "--output_dir",
                str(unskipped),
                "--max_steps",
                "8",
                "--ignore_data_skip",
                "True",
                "--resume_from_checkpoint",
                str(unskipped / "checkpoint-4"),
            ]
        )
        == 0
    )
    other = load_file(unskipped / "model.safetensors")
    assert any(not torch.equal(expected[name], other[name]) for name in expected)


def test_streaming_collates_like_the_trainer(tmp_path):
    """The collated streaming batch is DataCollatorForSeq2Seq's batch of the same pairs."""
    tokenizer = train_bpe_tokenizer([s for _, s in generate_pairs(200, seed=1)], vocab_size=150)
    pairs = [tokenizer(s, text_target=t) for s, t in generate_pairs(40, seed=2)]
    collate = DataCollatorForSeq2Seq(tokenizer)
    stream = Dataset.from_list([dict(p) for p in pairs]).to_iterable_dataset()
    batches = StreamingTokenBatches(stream, 120, 16, collate_fn=collate)
    raw = StreamingTokenBatches(stream, 120, 16, collate_fn=list)
    for collated, batch in zip(batches, raw, strict=True):
        expected = collate(batch)
        assert collated.keys() == expected.keys()
        for key in expected:
            assert torch.equal(collated[key], expected[key])


def resident_kb() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0])


@pytest.mark.skipif(
    not Path("/proc/self/status").is_file() or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim is glibc's and VmRSS Linux's: elsewhere release_free_memory does nothing to measure",
)
def test_release_free_memory_gives_the_c_heaps_free_pages_back():
    """200 MB of small C blocks freed but for one in a hundred (as a trainer's counts leave the heap): glibc keeps the
    freed pages resident until `malloc_trim`, which `release_free_memory` calls."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(2048) for _ in range(100_000)]
    for block in blocks:
        ctypes.memset(block, 1, 2048)  # touched: resident
    for index, block in enumerate(blocks):
        if index % 100:
            libc.free(block)
    freed = resident_kb()
    release_free_memory()
    released = freed - resident_kb()
    for block in blocks[::100]:
        libc.free(block)
    assert released > 150_000, f"{released} kB released of ~200,000 freed"
