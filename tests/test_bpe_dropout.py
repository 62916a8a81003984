"""Tests of training/bpe_dropout.py (`attn train --bpe_dropout`): the random segmentations are segmentations of the
same text, p = 1 cuts every word into characters, each epoch draws and packs a new one, and bad use is refused."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from pathlib import Path

import pytest
from modeling_attn.training.bpe_dropout import BPEDropoutBatchSampler, BPEDropoutPairs, dropout_segmenter
from modeling_attn.training.synthetic import generate_pairs
from modeling_attn.training.tokenizer import train_bpe_tokenizer
from runs import QUIET, torchrun
from test_training_train import REPO, TINY
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from modeling_attn.api.errors import CommandLineError
from modeling_attn.cli.train import train as main

PAIRS = generate_pairs(400, seed=0)
SOURCES, TARGETS = [source for source, _ in PAIRS], [target for _, target in PAIRS]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return train_bpe_tokenizer(SOURCES + TARGETS, vocab_size=300, split_punctuation=True)


def test_every_dropout_segmentation_spells_the_same_text(tokenizer):
    segmenter = dropout_segmenter(tokenizer, 0.1)
    ordinary = [tokenizer(text)["input_ids"] for text in SOURCES]
    draws = [[encoding.ids for encoding in segmenter.encode_batch(SOURCES)] for _ in range(3)]
    for draw in draws:
        assert tokenizer.batch_decode(draw) == tokenizer.batch_decode(ordinary)
        assert all(ids[-1] == tokenizer.eos_token_id for ids in draw)
    # Merges were skipped: longer on average than the ordinary segmentation, and the draws differ from each other.
    assert all(sum(map(len, draw)) > sum(map(len, ordinary)) for draw in draws)
    assert draws[0] != draws[1] != draws[2]
    # The tokenizer itself is untouched (the segmenter is a copy).
    assert tokenizer.backend_tokenizer.model.dropout is None
    assert [tokenizer(text)["input_ids"] for text in SOURCES] == ordinary


def test_dropout_one_cuts_every_word_into_characters(tokenizer):
    segmenter = dropout_segmenter(tokenizer, 1.0)
    text = SOURCES[0]
    pieces = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)
    characters = [character for piece, _ in pieces for character in piece]
    assert segmenter.encode(text).tokens == [*characters, tokenizer.eos_token]


def test_longest_lengths_are_the_character_segmentation_cut_to_the_limits(tokenizer):
    pairs = BPEDropoutPairs(SOURCES, TARGETS, tokenizer, 0.1, max_source_length=64, max_target_length=8)
    characters = dropout_segmenter(tokenizer, 1.0)
    source_lengths, target_lengths = pairs.longest_lengths()
    assert source_lengths == [min(len(characters.encode(text).ids), 64) for text in SOURCES]
    assert target_lengths == [min(len(characters.encode(text).ids), 8) for text in TARGETS]
    assert max(source_lengths) > 8 and pairs.segmenter.model.dropout == pytest.approx(0.1)  # untouched


def test_bad_dropout_and_non_bpe_tokenizers_are_refused(tokenizer):
    for dropout in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match=rf"--bpe_dropout must be in \(0, 1\], got {dropout}"):
            dropout_segmenter(tokenizer, dropout)
    word_level = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(ValueError, match="needs a BPE tokenizer.*has a WordLevel model"):
        dropout_segmenter(PreTrainedTokenizerFast(tokenizer_object=word_level), 0.1)


def test_each_epoch_draws_a_new_segmentation_and_packs_it_again(tokenizer):
    pairs = BPEDropoutPairs(SOURCES, TARGETS, tokenizer, 0.1, max_source_length=64, max_target_length=12)
    assert all(len(ids) <= 12 and ids[-1] == tokenizer.eos_token_id for ids in pairs.labels)  # cut, end kept
    sampler = BPEDropoutBatchSampler(pairs, max_tokens=300, seed=1)
    count = len(sampler)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        rows = [pairs[i] for batch in batches for i in batch]
        epochs.append([row["input_ids"] for row in sorted(rows, key=lambda row: row["labels"])])
        assert len(batches) == count
        assert sorted(i for batch in batches for i in batch) == list(range(len(PAIRS)))
        source_lengths, target_lengths = pairs.lengths()
        for batch in batches:  # the budget holds for the segmentation the batches are read in
            assert len(batch) * max(source_lengths[i] for i in batch) <= 300 * 1.1
            assert len(batch) * max(target_lengths[i] for i in batch) <= 300 * 1.1
        assert tokenizer.batch_decode([pairs[i]["input_ids"] for i in range(len(PAIRS))]) == [
            tokenizer.decode(tokenizer(text)["input_ids"]) for text in SOURCES
        ]
    assert epochs[0] != epochs[1] != epochs[2]
    # Iterating an epoch again (as a resumed run skipping its first batches does) keeps its segmentation.
    before = [pairs[i]["input_ids"] for i in range(len(PAIRS))]
    list(sampler)
    assert [pairs[i]["input_ids"] for i in range(len(PAIRS))] == before


def test_attn_train_segments_anew_each_epoch_and_saves_the_ordinary_tokenizer(tmp_path, caplog):
    output_dir = tmp_path / "out"
    caplog.set_level(logging.DEBUG, logger="modeling_attn.training.bpe_dropout")
    # 120 pairs in 200-token batches: 9 batches an epoch, so 20 steps reach a third epoch.
    assert (
        main(
            [
                "--output_dir",
                str(output_dir),
                *TINY,
                *QUIET,
                "--max_steps",
                "20",
                "--save_strategy",
                "no",
                "--bpe_dropout",
                "0.1",
            ]
        )
        == 0
    )
    # Trainer reached the sampler's set_epoch: epochs 1 and 2 were segmented anew.
    assert re.findall(r"epoch (\d+): a new BPE-dropout segmentation", caplog.text) == ["1", "2"]
    saved = json.loads((output_dir / "tokenizer.json").read_text())
    assert saved["model"]["type"] == "BPE" and saved["model"]["dropout"] is None
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 20 and state["epoch"] > 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--bpe_dropout", "0.1", "--max_tokens_per_batch", "0"], "--bpe_dropout needs token batches"),
        (
            ["--bpe_dropout", "0.1", "--dataloader_num_workers", "1"],
            "needs one training process and --dataloader_num_workers 0",
        ),
        # a batch must hold any segmentation a pair can get, down to its characters
        (
            ["--bpe_dropout", "0.1", "--max_tokens_per_batch", "20"],
            r"--max_tokens_per_batch 20 cannot hold training "
            r"pair \d+ \(\d+ source / \d+ target tokens, with "
            "every BPE merge skipped\\)",
        ),
    ],
)
def test_bad_bpe_dropout_use_names_the_flag(tmp_path: Path, flags, message):
    with pytest.raises(ValueError, match=message):
        main(["--output_dir", str(tmp_path / "out"), *TINY, *QUIET, "--max_steps", "2", *flags])


def test_a_bpe_dropout_outside_0_1_is_refused_by_the_parser_naming_the_flag(tmp_path: Path, capsys):
    """Its range is declared with the flag (training/arguments.py), checked while parsing: one line, exit status 2."""
    with pytest.raises(
        CommandLineError, match=r"^argument --bpe_dropout: must be a probability in \[0, 1\], got 1\.5$"
    ):
        main(["--output_dir", str(tmp_path / "out"), *TINY, *QUIET, "--max_steps", "2", "--bpe_dropout", "1.5"])


@pytest.mark.slow  # two real processes (torchrun, gloo)
def test_two_training_processes_are_refused_with_the_reason(tmp_path):
    flags = [*TINY, *QUIET, "--max_steps", "2", "--bpe_dropout", "0.1"]
    launch = [*torchrun(), "--output_dir", str(tmp_path / "out"), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "needs one training process and --dataloader_num_workers 0 (got 2 processes" in result.stderr
