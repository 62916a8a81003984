"""Scoring: the log-probability a model gives a given translation of a source (`engine.score`, `attn score`).

`Score(tokens, log_probs)` is one pair's result: the target's tokens as the tokenizer splits them, then the end
token, each with its log-probability given the source and the tokens before it (teacher-forced); `.total` is their
sum, the target's log-probability, and `.mean` the per-token mean. The end token counts (CTranslate2's `score_batch`
appends and scores it too; `translation.sequence_scores`, the n-best score, counts it), so an empty target scores
the end token alone. A target the tokenizer ends with the end token gets no second one.

`prepare_pairs` reads the pairs as every engine does (token ids; a pair with an empty source or a side longer than
the model's position table is a `PairError` naming it); `score_pairs` is the torch engine's scoring, one
teacher-forced pass (`translation.teacher_forced_log_probs`, as n-best scores are computed), also an ensemble's
combined distribution; `scored_in_batches` runs an engine's scoring `batch_size` pairs at a time.
docs/translate-evaluate.md, "Scoring".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .translation import TranslateError, _eos_ids, teacher_forced_log_probs
from .values import COUNT


@dataclass(frozen=True)
class Score:
    """One pair's scores (module docstring): `tokens[i]` has log-probability `log_probs[i]`; the end token last."""

    tokens: list[str]
    log_probs: list[float]

    @property
    def total(self) -> float:
        """The target's log-probability: the sum over its tokens and the end token."""
        return math.fsum(self.log_probs)

    @property
    def mean(self) -> float:
        """The per-token mean of the log-probabilities (the end token counted)."""
        return self.total / len(self.log_probs)

    def as_dict(self, tokens: bool = False) -> dict:
        """What `attn score` writes as a JSON line and `POST /score` answers: total, mean, length (tokens, the end
        token counted) and, with `tokens`, the tokens and their log-probabilities."""
        found = {"total": self.total, "mean": self.mean, "length": len(self.log_probs)}
        return {**found, "tokens": self.tokens, "log_probs": self.log_probs} if tokens else found


class PairError(TranslateError):
    """A pair that cannot be scored: `row` is its index among the pairs given, `side` "source" or "target",
    `detail` the message without the pair's position."""

    def __init__(self, row: int, side: str, detail: str):
        super().__init__(f"pair {row}: the {side} {detail}")
        self.row, self.side, self.detail = row, side, detail


def end_token_id(model: PreTrainedModel) -> int:
    """The end token a target is scored with: the generation config's first (generate() stops on it)."""
    eos = _eos_ids(model)
    if not eos:
        raise TranslateError("the model has no eos_token_id (generation_config or config): nothing ends a target")
    return eos[0]


def _start_token_id(model: PreTrainedModel) -> int:
    start = model.generation_config.decoder_start_token_id
    return model.config.decoder_start_token_id if start is None else start


def _quoted(text: str) -> str:
    return f"{text[:40]!r}{'...' if len(text) > 40 else ''}"


def check_pairs(sources: Sequence[str], targets: Sequence[str]) -> None:
    """TranslateError unless `sources` and `targets` are lists of strings of one length (TypeError for another
    type, naming the index)."""
    for name, texts in (("sources", sources), ("targets", targets)):
        if isinstance(texts, str | bytes):
            raise TypeError(f"{name}: give a list of sentences, not one {type(texts).__name__}: {texts!r:.40}")
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"{name}[{index}] is a {type(text).__name__}, not a str: {text!r:.40}")
    if len(sources) != len(targets):
        raise TranslateError(f"{len(targets)} targets for {len(sources)} sources; give one target per source")


def prepare_pairs(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sources: Sequence[str], targets: Sequence[str]
) -> tuple[list[list[int]], list[list[int]]]:
    """The sources' token ids and the targets' (the end token left out: the engines append it); PairError for an
    empty source (a translation of nothing has no probability to speak of) and for a source or target longer than
    the model's position table (never cut)."""
    check_pairs(sources, targets)
    for row, source in enumerate(sources):
        if not source.strip():
            raise PairError(row, "source", "is empty; a target is scored given a source: drop the pair")
    if not sources:
        return [], []
    end = end_token_id(model)
    source_ids = tokenizer(list(sources), return_token_type_ids=False)["input_ids"]
    target_ids = tokenizer(text_target=list(targets), return_token_type_ids=False)["input_ids"]
    target_ids = [ids[:-1] if ids[-1:] == [end] else ids for ids in target_ids]
    limit = getattr(model.config, "max_position_embeddings", None)
    for row, (source, target) in enumerate(zip(source_ids, target_ids, strict=True)):
        if limit is not None and len(source) > limit:
            raise PairError(
                row,
                "source",
                f"({_quoted(sources[row])}) has {len(source)} tokens, more than the model's "
                f"max_position_embeddings={limit}; split it",
            )
        # the decoder reads the start token and the target's tokens (the end token is only predicted)
        if limit is not None and len(target) + 1 > limit:
            raise PairError(
                row,
                "target",
                f"({_quoted(targets[row])}) has {len(target)} tokens, more than the {limit - 1} the model's "
                f"max_position_embeddings={limit} leaves after the decoder start token; split it",
            )
    return source_ids, target_ids


def scores_of(tokenizer: PreTrainedTokenizerBase, target_ids: list[list[int]], end: int, log_probs) -> list[Score]:
    """A `Score` per target (its ids without the end token) from its log-probabilities (the end token's last)."""
    return [
        Score(tokenizer.convert_ids_to_tokens([*ids, end]), [float(value) for value in values])
        for ids, values in zip(target_ids, log_probs, strict=True)
    ]


@torch.no_grad()
def score_pairs(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sources: Sequence[str], targets: Sequence[str]
) -> list[Score]:
    """Each target's `Score` given its source under `model` (a model of ours or an `AttnEnsemble`): one padded
    teacher-forced pass (`teacher_forced_log_probs`)."""
    source_ids, target_ids = prepare_pairs(model, tokenizer, sources, targets)
    if not source_ids:
        return []
    end, pad = end_token_id(model), tokenizer.pad_token_id or 0
    longest_source, longest_target = max(map(len, source_ids)), max(map(len, target_ids))
    input_ids = torch.tensor([ids + [pad] * (longest_source - len(ids)) for ids in source_ids])
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (longest_source - len(ids)) for ids in source_ids])
    # (rows, 1 + longest target + 1): the start token, the target, the end token, padding after it
    sequences = torch.tensor(
        [[_start_token_id(model), *ids, end] + [pad] * (longest_target - len(ids)) for ids in target_ids]
    )
    device = model.device
    log_probs = teacher_forced_log_probs(model, input_ids.to(device), attention_mask.to(device), sequences.to(device))
    # each row's tokens and end token, the padding after it left out
    rows = [row[: len(ids) + 1] for row, ids in zip(log_probs.cpu().tolist(), target_ids, strict=True)]
    return scores_of(tokenizer, target_ids, end, rows)


def scored_in_batches(
    score_batch: Callable[[list[str], list[str]], list[Score]],
    sources: Sequence[str],
    targets: Sequence[str],
    batch_size: int,
) -> list[Score]:
    """`score_batch` (an engine's scoring of one batch) on `batch_size` pairs at a time, a PairError's row counted
    among all the pairs."""
    COUNT.check("batch_size", batch_size)
    check_pairs(sources, targets)
    found: list[Score] = []
    for start in range(0, len(sources), batch_size):
        try:
            found += score_batch(list(sources[start : start + batch_size]), list(targets[start : start + batch_size]))
        except PairError as error:
            raise PairError(start + error.row, error.side, error.detail) from None
    return found


__all__ = ["PairError", "Score", "check_pairs", "end_token_id", "prepare_pairs", "score_pairs", "scored_in_batches"]
