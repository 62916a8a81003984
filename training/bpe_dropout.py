"""BPE-dropout (Provilkov et al., 2020, "BPE-Dropout: Simple and Effective Subword Regularization").

A BPE vocabulary cuts a word the same way every time. BPE-dropout skips each merge with probability `p` while a
training sentence is segmented, so the model reads and writes the same words cut into varied, smaller pieces ("near"
as "▁near", "▁n ear" or "▁ne ar"), on source and target alike: a regulariser. Only training sees it: validation,
test and translation use the tokenizer's ordinary segmentation, and the saved tokenizer is that ordinary one.

`BPEDropoutPairs` is the training set in one random segmentation; `BPEDropoutBatchSampler` draws a new one at each
epoch and packs it into token batches again, so batches stay within `--max_tokens_per_batch` (a dropped-out
segmentation is ~13% longer at p = 0.1 on Multi30k: a batch holds fewer sentences). The random segmentation is the
`tokenizers` library's own (its BPE model's `dropout`), whose random generator cannot be seeded: a run with
BPE-dropout is not repeatable bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from tokenizers import Tokenizer, models
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from modeling_attn.api.errors import FlagError

from .batching import TokenBatchSampler, pack_into, padding_fraction
from .tokenizer import truncate

logger = logging.getLogger(__name__)


def dropout_segmenter(tokenizer: PreTrainedTokenizerBase, dropout: float) -> Tokenizer:
    """A copy of the tokenizer's `tokenizers` backend whose BPE model skips each merge with probability `dropout`."""
    if not 0 < dropout <= 1:
        raise FlagError(f"--bpe_dropout must be in (0, 1], got {dropout}")
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not isinstance(backend.model, models.BPE):
        kind = "a slow (Python) tokenizer" if backend is None else f"a {type(backend.model).__name__} model"
        raise FlagError(
            f"--bpe_dropout needs a BPE tokenizer (a `tokenizers` BPE model); {type(tokenizer).__name__} has {kind}"
        )
    segmenter = Tokenizer.from_str(backend.to_str())
    segmenter.no_truncation()
    segmenter.no_padding()
    segmenter.model.dropout = dropout
    return segmenter


class BPEDropoutPairs(Dataset):
    """Training pairs (`input_ids`, `attention_mask`, `labels`) in one random BPE-dropout segmentation, drawn anew by
    `resegment` (`BPEDropoutBatchSampler` calls it at each epoch).

    Sources and targets are cut to `max_source_length` / `max_target_length` tokens as the ordinary training set is
    (keeping the end-of-sentence token).
    """

    def __init__(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        tokenizer: PreTrainedTokenizerBase,
        dropout: float,
        max_source_length: int,
        max_target_length: int,
    ):
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        self.sources, self.targets = list(sources), list(targets)
        self.segmenter = dropout_segmenter(tokenizer, dropout)
        self.max_source_length, self.max_target_length = max_source_length, max_target_length
        self.resegment()

    def _segment(self, segmenter: Tokenizer, texts: list[str], limit: int) -> list[list[int]]:
        return [truncate(encoding.ids, limit) for encoding in segmenter.encode_batch(texts)]

    def resegment(self) -> None:
        """Draw a new segmentation of every pair."""
        self.input_ids = self._segment(self.segmenter, self.sources, self.max_source_length)
        self.labels = self._segment(self.segmenter, self.targets, self.max_target_length)

    def lengths(self) -> tuple[list[int], list[int]]:
        """Source and target lengths in tokens, in the current segmentation."""
        return [len(ids) for ids in self.input_ids], [len(ids) for ids in self.labels]

    def longest_lengths(self) -> tuple[list[int], list[int]]:
        """The longest each source and target can be: every merge skipped (characters), cut to the limits."""
        characters = Tokenizer.from_str(self.segmenter.to_str())
        characters.model.dropout = 1.0
        sources = self._segment(characters, self.sources, self.max_source_length)
        targets = self._segment(characters, self.targets, self.max_target_length)
        return [len(ids) for ids in sources], [len(ids) for ids in targets]

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> dict:
        source = self.input_ids[index]
        return {"input_ids": source, "attention_mask": [1] * len(source), "labels": self.labels[index]}


class BPEDropoutBatchSampler(TokenBatchSampler):
    """`TokenBatchSampler` over `BPEDropoutPairs`: each new epoch draws a new segmentation and packs it again.

    The epoch keeps the number of batches of the first packing (Trainer counts an epoch's steps once; `pack_into`).
    The sampler changes the dataset it reads, so it needs the dataset in the same process: one training process
    and no DataLoader workers (the recipe's `validate` checks).
    """

    def __init__(self, pairs: BPEDropoutPairs, max_tokens: int, seed: int = 0):
        super().__init__(*pairs.lengths(), max_tokens, seed=seed)
        self.pairs, self.segmented_for = pairs, 0

    def __iter__(self) -> Iterator[list[int]]:
        if self.epoch != self.segmented_for:
            self.pairs.resegment()
            lengths = self.pairs.lengths()
            self.batches = pack_into(*lengths, self.max_tokens, len(self.batches), self.seed + self.epoch)
            self.padding_fraction = padding_fraction(self.batches, *lengths)
            self.segmented_for = self.epoch
            if logger.isEnabledFor(logging.DEBUG):
                largest = max(len(b) * max(max(lengths[0][i], lengths[1][i]) for i in b) for b in self.batches)
                logger.debug(
                    f"epoch {self.epoch}: a new BPE-dropout segmentation, padding {self.padding_fraction:.1%}, "
                    f"largest batch {largest} padded tokens"
                )
        yield from super().__iter__()
