"""Lexically constrained beam search: target phrases that every translation must contain.

Dynamic beam allocation (Post & Vilar, 2018, "Fast Lexically Constrained Decoding with Dynamic Beam Allocation";
Hu et al., 2019) as fairseq's `LexicallyConstrainedBeamSearch` does it, restated: each hypothesis carries a
`PhraseState`; a step's candidates are the search's usual top ones, each beam's best token and each beam's tokens
that advance a phrase (`SentenceConstraints.next_tokens`); they are grouped into banks by progress (constraint tokens
produced) and the beam is filled round-robin across the banks, furthest bank first (`allocate`). A hypothesis ends
only once every phrase is in it, or at its length limit (then it is reported unmet, never dropped). Deviation from
fairseq's trie: each phrase is matched on its own (Knuth-Morris-Pratt), so phrases may overlap in the output ("a b"
and "b c" are both in "a b c"); a phrase given twice must appear twice (non-overlapping). `generation.py` takes
generate()'s `force_words_ids`; `beam_search.ConstrainedSentences` runs the search (`ConstrainedListBeamSearch` in
the fast decoding loop), `beam_search.allocated` a step's candidates. Phrases as text, constraints files and
glossaries: `api/constraints.py`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import Any

from transformers import LogitsProcessor

# (progress: tokens of the phrase matched at the end of the output, found: times the phrase is complete), per phrase
PhraseState = tuple[tuple[int, int], ...]
# The argument of generate() that carries one list of phrases (token ids) per sentence.
PER_SENTENCE_ARGUMENT = "force_words_ids_per_sentence"


def _failure(phrase: Sequence[int]) -> list[int]:
    """Knuth-Morris-Pratt's table: failure[i] = the longest proper prefix of phrase[: i + 1] that is also its
    suffix."""
    failure, matched = [0] * len(phrase), 0
    for index in range(1, len(phrase)):
        while matched and phrase[index] != phrase[matched]:
            matched = failure[matched - 1]
        if phrase[index] == phrase[matched]:
            matched += 1
        failure[index] = matched
    return failure


class SentenceConstraints:
    """One sentence's phrases (token ids), each to appear as many times as it is given, in any order."""

    def __init__(self, phrases: Iterable[Sequence[int]]):
        counts = Counter(tuple(int(token) for token in phrase) for phrase in phrases)
        if () in counts:
            raise ValueError("an empty constraint phrase (no tokens)")
        self.phrases = list(counts)
        self.required = [counts[phrase] for phrase in self.phrases]
        self.failures = [_failure(phrase) for phrase in self.phrases]
        self.tokens = sum(len(phrase) * count for phrase, count in zip(self.phrases, self.required, strict=True))
        self.start: PhraseState = tuple((0, 0) for _ in self.phrases)
        # a search asks the same few questions at every step: the answers, remembered (states are small tuples)
        self._advanced: dict[tuple[PhraseState, int], PhraseState] = {}
        self._banks: dict[PhraseState, int] = {}
        self._met: dict[PhraseState, bool] = {}
        self._next: dict[PhraseState, frozenset[int]] = {}

    def __bool__(self) -> bool:
        return bool(self.phrases)

    def advance(self, state: PhraseState, token: int) -> PhraseState:
        """The state after `token` is appended to the output."""
        found = self._advanced.get((state, token))
        if found is None:
            found = self._advanced[state, token] = self._advance(state, token)
        return found

    def _advance(self, state: PhraseState, token: int) -> PhraseState:
        advanced = []
        for (progress, found), phrase, failure, required in zip(
            state, self.phrases, self.failures, self.required, strict=True
        ):
            if found < required:
                while progress and phrase[progress] != token:
                    progress = failure[progress - 1]
                if phrase[progress] == token:
                    progress += 1
                if progress == len(phrase):  # complete: counted, and matched afresh (occurrences do not overlap)
                    progress, found = 0, found + 1
            advanced.append((progress, found))
        return tuple(advanced)

    def run(self, tokens: Iterable[int]) -> PhraseState:
        """The state after `tokens`, from the start."""
        state = self.start
        for token in tokens:
            state = self.advance(state, token)
        return state

    def next_tokens(self, state: PhraseState) -> frozenset[int]:
        """The tokens that take a phrase still missing one token further."""
        tokens = self._next.get(state)
        if tokens is None:
            tokens = self._next[state] = frozenset(
                phrase[progress]
                for (progress, found), phrase, required in zip(state, self.phrases, self.required, strict=True)
                if found < required
            )
        return tokens

    def bank(self, state: PhraseState) -> int:
        """Constraint tokens produced: those of the complete phrases and of each phrase's partial match."""
        bank = self._banks.get(state)
        if bank is None:
            bank = self._banks[state] = sum(
                len(phrase) * required if found >= required else len(phrase) * found + progress
                for (progress, found), phrase, required in zip(state, self.phrases, self.required, strict=True)
            )
        return bank

    def met(self, state: PhraseState) -> bool:
        met = self._met.get(state)
        if met is None:
            met = self._met[state] = all(
                found >= required for (_, found), required in zip(state, self.required, strict=True)
            )
        return met

    def missing(self, tokens: Iterable[int]) -> list[tuple[int, ...]]:
        """The phrases (one per time short) that `tokens` lack."""
        state = self.run(tokens)
        return [
            phrase
            for (_, found), phrase, required in zip(state, self.phrases, self.required, strict=True)
            for _ in range(required - min(found, required))
        ]


def allocate(
    candidates: Iterable[tuple[float, int, int]],
    states: Sequence[PhraseState],
    constraints: SentenceConstraints,
    count: int,
) -> list[tuple[float, int, int, PhraseState]]:
    """Dynamic beam allocation for one sentence: of the candidates (score, beam, token), each (beam, token) once,
    the `count` to keep, in the order the beam takes them, with their states. Sorted by bank (progress) and score,
    then taken round-robin across the banks: the best of the furthest bank, the best of the next, ..., then the
    second best of each (fairseq's stripes)."""
    advance, bank = constraints.advance, constraints.bank
    seen, scored = set(), []
    for score, beam, token in candidates:
        if (beam, token) in seen:
            continue
        seen.add((beam, token))
        state = advance(states[beam], token)
        scored.append((bank(state), score, beam, token, state))
    # bank descending, then score descending: two stable sorts (reverse=True keeps equal items in their order)
    scored.sort(key=itemgetter(1), reverse=True)
    scored.sort(key=itemgetter(0), reverse=True)
    ranks, rank_in_bank, previous = [], -1, None
    for bank_of, *_ in scored:
        rank_in_bank = rank_in_bank + 1 if bank_of == previous else 0
        previous = bank_of
        ranks.append(rank_in_bank)
    order = sorted(range(len(scored)), key=ranks.__getitem__)[:count]  # stable: furthest bank first in each stripe
    return [scored[index][1:] for index in order]


class LexicalConstraints(LogitsProcessor):
    """The constraints of one generate() call (one `SentenceConstraints` per sentence), carried in its logits
    processors to `CompactBeamSearchMixin._beam_search`, which takes it out and runs the constrained search. Any
    other decoding loop that calls it refuses the call: it would decode without the constraints."""

    def __init__(self, sentences: list[SentenceConstraints]):
        self.sentences = sentences

    def __call__(self, input_ids, scores):
        raise ValueError(
            "generate(): force_words_ids needs modeling_attn's beam search (num_beams > 1, no sampling); this "
            "decoding loop would ignore the constraints"
        )


def constraints_argument(kwargs: dict, config: Any, batch_size: int) -> LexicalConstraints | None:
    """The constraints of a generate(**kwargs) call on `batch_size` sentences, popped from `kwargs`:
    `force_words_ids` (transformers 4's argument: token-id lists every sentence must contain, here or in the
    generation config) or `force_words_ids_per_sentence` (one such list per sentence); None when there are none.
    ValueError naming the argument for a form this search does not take (disjunctive lists, an empty phrase) or a
    call that is not a beam search."""
    shared = kwargs.pop("force_words_ids", getattr(config, "force_words_ids", None))
    per_sentence = kwargs.pop(PER_SENTENCE_ARGUMENT, None)
    if shared is None and per_sentence is None:
        return None
    if shared is not None and per_sentence is not None:
        raise ValueError(f"generate(): give force_words_ids or {PER_SENTENCE_ARGUMENT}, not both")
    if per_sentence is None:
        per_sentence, name = [shared] * batch_size, "force_words_ids"
    else:
        name = PER_SENTENCE_ARGUMENT
        if len(per_sentence) != batch_size:
            raise ValueError(f"generate(): {name} has {len(per_sentence)} entries for {batch_size} sentences")
    sentences = []
    for phrases in per_sentence:
        if not all(isinstance(phrase, list | tuple) for phrase in phrases) or any(
            not isinstance(token, int) or isinstance(token, bool) for phrase in phrases for token in phrase
        ):
            raise ValueError(
                f"generate(): {name} must be lists of token ids (disjunctive constraints, lists of lists of token "
                f"ids, are not supported), got {phrases!r:.80}"
            )
        try:
            sentences.append(SentenceConstraints(phrases))
        except ValueError as error:
            raise ValueError(f"generate(): {name}: {error}") from None
    if not any(sentences):
        return None
    num_beams = kwargs.get("num_beams", config.num_beams) or 1
    if num_beams < 2 or kwargs.get("do_sample", config.do_sample):
        raise ValueError(
            f"generate(): {name} needs beam search: num_beams of 2 or more and no sampling (got num_beams="
            f"{num_beams}{', do_sample=True' if kwargs.get('do_sample', config.do_sample) else ''})"
        )
    return LexicalConstraints(sentences)


__all__ = [
    "PER_SENTENCE_ARGUMENT",
    "LexicalConstraints",
    "PhraseState",
    "SentenceConstraints",
    "allocate",
    "constraints_argument",
]
