"""Guided alignment training, `attn train --alignment_file FILE` (Garg et al. 2019; Marian's `--guided-alignment`).

Garg et al. 2019: "Jointly Learning to Align and Translate with Transformer Models". The file holds one Pharaoh line
per training pair (`0-0 1-2 ...`: source word i - target word j, 0-based), words as
`modeling_attn.api.alignment.split_words` cuts them (`--alignment_words`). `guided_alignment` is the recipe's step:
- `read_alignment_file` reads and checks it; errors name the file and line.
- `subword_links` maps each word link to every subword pair of the two words (as Marian does); the training set
  gets them as an "alignment" column of flat (target position, source position) pairs.
- `GuidedAlignmentCollator` turns them into the (B, T, S) link matrix that the models' forward takes as `alignment`,
  with `alignment_weight`: the loss itself is the model's (`modeling_attn.loss.guided_alignment_loss`), so the
  trainer is unchanged. Validation batches have no links and get the translation loss alone.
Which attention is supervised, and how the config records it: docs/alignment.md, "Guided alignment training".
`modeling_attn.training.validate` checks the flags, before any work: it refuses what cannot keep one line per pair,
BPE-dropout (the subwords change each epoch), --streaming, --drop_empty_pairs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import datasets
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from modeling_attn.api.alignment import encode_with_spans, parse_pharaoh, split_words, token_words
from modeling_attn.api.corpus import DataError, decode_lines
from modeling_attn.api.errors import FlagError
from modeling_attn.registry import MODEL_TYPES

logger = logging.getLogger(__name__)

Pair = tuple[int, int]


def read_alignment_file(
    path: str | Path, sources: Sequence[str], targets: Sequence[str], words: str, complete: bool = True
) -> list[list[Pair]]:
    """The word links of each training pair, from one Pharaoh line per pair; DataError naming the file and line for a
    malformed pair, a word index outside the pair's sentences, or a line count other than the pairs' (`complete`
    False: the training set is the file's first pairs, --max_train_samples, so the file may have more lines)."""
    links: list[list[Pair]] = []
    with open(path, "rb") as handle:
        for number, line in decode_lines(handle, path):
            if number > len(sources):
                if complete:
                    raise DataError(f"{path}:{number}: more alignment lines than the {len(sources)} training pairs")
                break
            try:
                pairs = parse_pharaoh(line)
            except ValueError as error:
                raise DataError(f"{path}:{number}: {error}") from None
            num_source = len(split_words(sources[number - 1], words))
            num_target = len(split_words(targets[number - 1], words))
            for source, target in pairs:
                if source >= num_source or target >= num_target:
                    raise DataError(
                        f"{path}:{number}: link {source}-{target} is outside training pair {number}, which has "
                        f"{num_source} source and {num_target} target words (--alignment_words {words})"
                    )
            links.append(pairs)
    if len(links) < len(sources):
        raise DataError(f"{path}: {len(links)} alignment lines for {len(sources)} training pairs (one line per pair)")
    return links


def subword_links(
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    target: str,
    pairs: Sequence[Pair],
    words: str,
    lengths: tuple[int, int],
) -> list[int]:
    """Word links as flat (target position, source position) subword pairs [t0, s0, t1, s1, ...]: every subword of
    the source word with every subword of the target word. `lengths`: the (source, target) lengths of the training
    row, shorter than the tokenization when --max_*_length cut it (the cut keeps the end token; links to positions
    cut away are dropped)."""
    positions = []  # per side: word -> its subword positions
    for (text, is_target), length in zip(((source, False), (target, True)), lengths, strict=True):
        ids, spans, decoded = encode_with_spans(tokenizer, text, target=is_target)
        kept = length - 1 if length < len(ids) else length  # a cut row: its last position is the end token
        of_word: dict[int, list[int]] = {}
        for position, word in enumerate(token_words(spans, split_words(decoded, words), len(decoded))[:kept]):
            if word is not None:
                of_word.setdefault(word, []).append(position)
        positions.append(of_word)
    source_positions, target_positions = positions
    flat: list[int] = []
    for source_word, target_word in sorted(set(pairs), key=lambda pair: (pair[1], pair[0])):
        for t in target_positions.get(target_word, []):
            for s in source_positions.get(source_word, []):
                flat += [t, s]
    return flat


class GuidedAlignmentCollator:
    """`collator`'s batch, plus, when the features carry "alignment" links, the (B, T, S) link matrix `alignment`
    (T: the padded label length, S: the padded source length; right padding) and `alignment_weight`."""

    def __init__(self, collator: Callable[[list[dict]], dict], weight: float):
        self.collator, self.weight = collator, weight

    def __call__(self, features: list[dict]) -> dict:
        features = [dict(feature) for feature in features]
        links = [feature.pop("alignment", None) for feature in features]
        batch = self.collator(features)
        if all(flat is None for flat in links):
            return batch
        matrix = torch.zeros(len(features), batch["labels"].shape[1], batch["input_ids"].shape[1])
        for row, flat in enumerate(links):
            if flat:
                positions = torch.as_tensor(flat).view(-1, 2)
                matrix[row, positions[:, 0], positions[:, 1]] = 1.0
        batch["alignment"] = matrix
        batch["alignment_weight"] = self.weight
        return batch


def supervise(model: PreTrainedModel) -> None:
    """Set `model` up for guided alignment: the Transformer supervises one head (unless its config names a number)
    with the eager attention; the RNN needs nothing."""
    if not MODEL_TYPES[model.config.model_type].per_head_attention:
        return
    if model.config.alignment_heads == 0:
        model.config.alignment_heads = 1  # Garg et al. 2019 supervise a single head
    logger.info(
        f"guided alignment supervises decoder layer {model.config.alignment_layer}, the mean of its first "
        f"{model.config.alignment_heads} head(s); the model trains with the eager attention"
    )
    model.set_attn_implementation("eager")


def guided_alignment(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_pairs: datasets.Dataset,
    train_dataset: datasets.Dataset,
    collator: Callable[[list[dict]], dict],
    *,
    alignment_file: str | Path,
    words: str,
    weight: float,
    complete: bool,
) -> tuple[datasets.Dataset, GuidedAlignmentCollator]:
    """The recipe's step: the training set with its subword links, the collator that batches them, the model set up
    (`supervise`). `train_pairs`: the raw {"source", "target"} pairs; `train_dataset`: the same pairs tokenized;
    the flags: --alignment_file, --alignment_words `words`, --guided_alignment_weight `weight`, and `complete`
    (False under --max_train_samples: the file may have more lines than the training set)."""
    if tokenizer.padding_side != "right":
        raise FlagError(
            f"--alignment_file: the tokenizer pads on the {tokenizer.padding_side}; the links need right padding"
        )
    sources, targets = train_pairs["source"], train_pairs["target"]
    word_links = read_alignment_file(alignment_file, sources, targets, words, complete)
    lengths = zip(map(len, train_dataset["input_ids"]), map(len, train_dataset["labels"]), strict=True)
    flat = [
        subword_links(tokenizer, source, target, pairs, words, length)
        for source, target, pairs, length in zip(sources, targets, word_links, lengths, strict=True)
    ]
    linked = sum(bool(pairs) for pairs in word_links)
    logger.info(
        f"guided alignment: {linked} of {len(word_links)} training pairs have word links ({alignment_file}), "
        f"weight {weight}"
    )
    supervise(model)
    dataset = train_dataset.add_column("alignment", flat)
    return dataset, GuidedAlignmentCollator(collator, weight)


__all__ = [
    "GuidedAlignmentCollator",
    "guided_alignment",
    "read_alignment_file",
    "subword_links",
    "supervise",
]
