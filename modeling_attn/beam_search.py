"""A beam search that stops computing sentences whose search is over, with transformers' results.

transformers' beam search keeps every sentence of a batch in the decoder until the last one is done.
`CompactBeamSearchMixin._beam_search` is transformers' algorithm step for step on the sentences still open only:
once none of a sentence's finished beams can change, they are written out and its rows leave the decoder input,
the cache and the encoder outputs (`OpenSentences.keep`, `select_rows`). It returns transformers' token ids for the
settings it accepts (tests/test_beam_search.py); the others go to transformers' own beam search
(docs/model.md, "Beam search"). The search steps (`OpenSentences.expand`, `.advance`) restate transformers 5.23's
beam-search helpers operation for operation, so that scores round alike.

Shapes: N open sentences, K beams, C candidates per sentence and step, L max_length, G = L - prompt length.
"""

from __future__ import annotations

import array
import itertools
import math
import struct
from dataclasses import dataclass, fields

import torch
from torch import nn
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation import logits_process
from transformers.generation import stopping_criteria as criteria
from transformers.generation.utils import ALL_CACHE_NAMES
from transformers.modeling_outputs import ModelOutput

from .constraints import LexicalConstraints, SentenceConstraints, allocate
from .generation import SourceLengthLimit, TargetPrefix

# Logits processors and stopping criteria that treat each row alone (a function of its own tokens and the step), so
# that dropping other rows from the batch cannot change what they do to a row; anything else goes to transformers.
ROW_LOCAL_PROCESSORS = tuple(
    getattr(logits_process, name)
    for name in (
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
        "NoRepeatNGramLogitsProcessor",
        "RepetitionPenaltyLogitsProcessor",
        "ForcedBOSTokenLogitsProcessor",
        "ForcedEOSTokenLogitsProcessor",
        "SuppressTokensLogitsProcessor",
        "SuppressTokensAtBeginLogitsProcessor",
        "NoBadWordsLogitsProcessor",
        "SequenceBiasLogitsProcessor",
        "InfNanRemoveLogitsProcessor",
        "ExponentialDecayLengthPenalty",
    )
    if hasattr(logits_process, name)
)
# The project's processors that hold one value per sentence: `select` keeps the open sentences' values.
PER_SENTENCE_PROCESSORS = (SourceLengthLimit, TargetPrefix)
# MaxLength stops every row at once; EosToken looks at a row's last token. (MaxTime is left out: a faster search
# reaches its deadline at a later step.)
ROW_LOCAL_CRITERIA = tuple(
    getattr(criteria, name) for name in ("MaxLengthCriteria", "EosTokenCriteria") if hasattr(criteria, name)
)
# transformers' private generation methods this search calls (a version without them falls back).
PRIVATE_HELPERS = ("_prefill", "_update_model_kwargs_for_generation")
# The step-to-step inputs `select_rows` knows: per-row masks, encoder outputs and caches (and the use_cache flag).
KNOWN_MODEL_KWARGS = {"attention_mask", "decoder_attention_mask", "encoder_outputs", "use_cache", *ALL_CACHE_NAMES}
NEG = -1.0e9  # transformers' score for "never pick this"


def rows_can_leave(cache: Cache) -> bool:
    """Whether `reorder_cache` with fewer rows than the cache has shrinks it and keeps it working: caches of
    transformers' dynamic layers, and caches that say so (`AttnRNNCache`); not static or quantized layers."""
    if isinstance(cache, EncoderDecoderCache):
        return rows_can_leave(cache.self_attention_cache) and rows_can_leave(cache.cross_attention_cache)
    if getattr(cache, "rows_can_leave", False):
        return True
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def select_rows(model_kwargs: dict, rows: torch.Tensor) -> dict:
    """Keep (and reorder) these decoder rows in everything generate() carries from step to step."""
    selected = dict(model_kwargs)
    for key, value in model_kwargs.items():
        if isinstance(value, Cache):
            value.reorder_cache(rows)  # every sub-cache, cross-attention included: rows leave, not just beams
        elif isinstance(value, torch.Tensor):  # the attention masks
            selected[key] = value.index_select(0, rows.to(value.device))
        elif isinstance(value, ModelOutput):  # encoder_outputs: (B*beams, S, E) tensors, or tuples of them
            selected[key] = type(value)(**{name: _select_tensors(field, rows) for name, field in value.items()})
    return selected


def _select_tensors(value, rows: torch.Tensor):
    if isinstance(value, torch.Tensor):
        return value.index_select(0, rows.to(value.device))
    return tuple(_select_tensors(item, rows) for item in value)


def _gather(tensor: torch.Tensor, beams: torch.Tensor) -> torch.Tensor:
    """tensor[n, beams[n, j], ...] for each sentence n and pick j (transformers' `_gather_beams`): the values of its
    `take_along_dim`, by `gather` on an expanded index, which costs a fraction of take_along_dim's index wrapping at
    these sizes (a batch-1 beam step does a dozen of these)."""
    index = beams.view(*beams.shape, *(1,) * (tensor.dim() - beams.dim()))
    return tensor.gather(1, index.expand(*beams.shape, *tensor.shape[beams.dim() :]))


@dataclass(frozen=True)
class BeamSettings:
    """What stays fixed during one search."""

    num_beams: int
    candidates: int  # continuations kept per sentence and step, enough that num_beams of them do not end it
    length_penalty: float
    early_stopping: bool | str
    max_length: int
    prompt_length: int
    returned: int = 1  # num_return_sequences: a constrained search closes a sentence whose best cannot change

    @classmethod
    def of(cls, generation_config: GenerationConfig, prompt_length: int) -> BeamSettings:
        """The settings of `generation_config`; as transformers, enough candidates per step that `num_beams` of
        them do not end the sentence."""
        eos_token_id = generation_config._eos_token_tensor
        n_eos = eos_token_id.shape[0] if eos_token_id is not None else 0
        return cls(
            num_beams=generation_config.num_beams,
            candidates=max(2, 1 + n_eos) * generation_config.num_beams,
            length_penalty=generation_config.length_penalty,
            early_stopping=generation_config.early_stopping,
            max_length=generation_config.max_length,
            prompt_length=prompt_length,
            returned=generation_config.num_return_sequences or 1,
        )

    def best_length(self, cur_len: int) -> int:
        """The length at which the best running score is compared with the finished ones after the step that made
        `cur_len` + 1 tokens (transformers' `_check_early_stop_heuristic`): the longest possible length under
        `early_stopping="never"` with a positive length penalty, else that step's."""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            return self.max_length - self.prompt_length
        return cur_len + 1 - self.prompt_length


@dataclass
class OpenSentences:
    """The search state of the sentences still open, one row each; `keep(rows)` drops the others.

    Running beams are the best continuations that have not ended; finished beams the best ended ones
    (length-penalised scores, `NEG` for an empty slot). Origins record, per generated position, the decoder row
    each beam continued (-1 before it was generated).
    """

    sentences: torch.Tensor  # (N,) each open sentence's index in the batch
    running: torch.Tensor  # (N, K, L) token ids
    running_scores: torch.Tensor  # (N, K) summed log-probabilities
    running_origins: torch.Tensor  # (N, K, G)
    finished: torch.Tensor  # (N, K, L)
    finished_scores: torch.Tensor  # (N, K)
    finished_origins: torch.Tensor  # (N, K, G)
    is_finished: torch.Tensor  # (N, K) bool: slot holds an ended beam
    may_improve: torch.Tensor  # (N, 1) bool: a running beam may still beat a finished one

    @classmethod
    def start(cls, input_ids: torch.Tensor, settings: BeamSettings, fill: int) -> OpenSentences:
        """Every sentence open, its `num_beams` rows of `input_ids` (the prompt) as running beams."""
        beams, device = settings.num_beams, input_ids.device
        batch_size, prompt_length = input_ids.shape[0] // beams, input_ids.shape[1]
        running = torch.full((batch_size, beams, settings.max_length), fill, dtype=torch.long, device=device)
        running[:, :, :prompt_length] = input_ids.view(batch_size, beams, prompt_length)
        running_scores = torch.zeros(batch_size, beams, dtype=torch.float, device=device)
        running_scores[:, 1:] = NEG  # the beams of a sentence start identical: only the first one expands
        origins = torch.full(
            (batch_size, beams, settings.max_length - prompt_length), -1, dtype=torch.int32, device=device
        )
        return cls(
            sentences=torch.arange(batch_size, device=device),
            running=running,
            running_scores=running_scores,
            running_origins=origins,
            finished=running.clone(),
            finished_scores=torch.full((batch_size, beams), NEG, dtype=torch.float, device=device),
            finished_origins=origins.clone(),
            is_finished=torch.zeros(batch_size, beams, dtype=torch.bool, device=device),
            may_improve=torch.ones(batch_size, 1, dtype=torch.bool, device=device),
        )

    def keep(self, rows: torch.Tensor) -> None:
        """Keep the open sentences at positions `rows` (in this order), drop the others."""
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name)[rows])

    def expand(self, log_probs: torch.Tensor, settings: BeamSettings, cur_len: int):
        """The C best continuations of each sentence from next-token `log_probs` (N * K, V): their summed scores
        (N, C), sequences (N, C, L) and origins (N, C, G)."""
        open_count, beams = self.running.shape[:2]
        totals = (log_probs.view(open_count, beams, -1) + self.running_scores[:, :, None]).view(open_count, -1)
        scores, picks = torch.topk(totals, k=settings.candidates)
        vocab_size = totals.shape[-1] // beams
        parents = picks // vocab_size
        origins = _gather(self.running_origins, parents)
        sequences = _gather(self.running, parents)
        sequences[:, :, cur_len] = picks % vocab_size
        rows = parents + torch.arange(open_count, device=picks.device).view(-1, 1) * beams  # decoder rows
        origins[:, :, cur_len - settings.prompt_length] = rows
        return scores, sequences, origins

    def advance(self, scores, sequences, origins, stops: torch.Tensor, settings: BeamSettings, cur_len: int) -> None:
        """One step: the best K continuations that did not stop run on; the best K ended ones (length-penalised)
        join the finished beams; then whether a running beam may still beat a finished one. `stops` (N, C) says
        which continuations hit a stopping criterion."""
        # the running beams for the next step (transformers' `_get_running_beams_for_next_iteration`)
        running_scores = scores + stops.to(torch.float32) * NEG
        best = torch.topk(running_scores, k=settings.num_beams)[1]
        self.running = _gather(sequences, best)
        self.running_scores = _gather(running_scores, best)
        self.running_origins = _gather(origins, best)

        # the finished beams (`_update_finished_beams`): only the top K candidates may end a translation
        top_k = torch.arange(settings.candidates, device=stops.device) < settings.num_beams
        just_finished = stops & top_k[None, :]
        ended = scores / ((cur_len + 1 - settings.prompt_length) ** settings.length_penalty)
        full = torch.all(self.is_finished, axis=-1, keepdims=True) & (settings.early_stopping is True)
        ended += full.to(torch.float32) * NEG
        ended += (~self.may_improve).to(torch.float32) * NEG
        ended += (~just_finished) * NEG
        candidates = torch.cat((self.finished_scores, ended), dim=1)
        merged = candidates.topk(k=settings.num_beams)[1]
        self.finished = _gather(torch.cat((self.finished, sequences), dim=1), merged)
        self.finished_scores = _gather(candidates, merged)
        self.finished_origins = _gather(torch.cat((self.finished_origins, origins), dim=1), merged)
        self.is_finished = _gather(torch.cat((self.is_finished, just_finished), dim=1), merged)

        # can a running beam still beat the worst finished one (`_check_early_stop_heuristic`, at cur_len + 1)
        best_length = settings.best_length(cur_len)
        best_running = self.running_scores[:, :1] / (best_length**settings.length_penalty)
        worst_finished = torch.where(self.is_finished, torch.min(self.finished_scores, dim=1, keepdim=True)[0], NEG)
        self.may_improve = self.may_improve & torch.any(best_running > worst_finished, dim=-1, keepdim=True)


def block_unmet_ends(log_probs: torch.Tensor, constraints: list, states: list, at_limit: list[bool], eos) -> None:
    """A beam whose phrases are not all in it cannot end: its end tokens get -inf in `log_probs` (N * K, V), unless
    its row is `at_limit` (its next token is the last its length limit allows)."""
    rows = [
        row
        for position, (sentence, beams) in enumerate(zip(constraints, states, strict=True))
        for row, state in enumerate(beams, start=position * len(beams))
        if not at_limit[row] and not sentence.met(state)
    ]
    if rows and len(eos):
        vocab_size = log_probs.shape[-1]
        flat = [row * vocab_size + token for row in rows for token in eos]
        log_probs.view(-1).index_fill_(0, torch.tensor(flat, device=log_probs.device), -math.inf)


def allocated(totals: torch.Tensor, live: list[list[bool]], states: list, constraints: list, count: int) -> list:
    """Per open sentence, the `count` candidates (score, beam, token, state) of one constrained step in allocation
    order (`constraints.allocate`), from the summed scores `totals` (N, K, V): the top `count` (beam, token), each
    live beam's tokens that advance its phrases and its best token. A sentence whose beams all meet their
    constraints gets its top `count` as they are, without the state machine: what `allocate` would give it (every
    candidate in one bank, so score order; none scores above the top `count`, and a tie keeps the earlier one)."""
    open_count, beams, vocab_size = totals.shape
    top_scores, picks = torch.topk(totals.view(open_count, -1), k=count)
    best_scores, best_tokens = totals.max(dim=-1)  # (N, K): each beam's best continuation
    top_scores, picks = top_scores.tolist(), picks.tolist()
    unmet = [
        position
        for position, (sentence, sentence_states) in enumerate(zip(constraints, states, strict=True))
        if not all(sentence.met(state) for state in sentence_states)
    ]
    extra: dict[int, list[tuple[float, int, int]]] = {position: [] for position in unmet}
    if unmet:
        wanted = [
            (position, beam, token)
            for position in unmet
            for beam, state in enumerate(states[position])
            if live[position][beam]
            for token in sorted(constraints[position].next_tokens(state))
        ]
        flat = [(position * beams + beam) * vocab_size + token for position, beam, token in wanted]
        wanted_scores = totals.view(-1)[torch.tensor(flat, dtype=torch.long, device=totals.device)].tolist()
        for (position, beam, token), score in zip(wanted, wanted_scores, strict=True):
            extra[position].append((score, beam, token))
        best_scores, best_tokens = best_scores.tolist(), best_tokens.tolist()
        for position in unmet:
            scores, tokens = best_scores[position], best_tokens[position]
            extra[position] += [(scores[beam], beam, tokens[beam]) for beam in range(beams) if live[position][beam]]
    chosen = []
    for position, (scores, flat) in enumerate(zip(top_scores, picks, strict=True)):
        candidates = [(score, pick // vocab_size, pick % vocab_size) for score, pick in zip(scores, flat, strict=True)]
        if position in extra:
            candidates += [item for item in extra[position] if item[0] != -math.inf]
            chosen.append(allocate(candidates, states[position], constraints[position], count))
        else:  # every beam meets its constraints: the states stay as they are
            chosen.append([(score, beam, token, states[position][beam]) for score, beam, token in candidates])
    return chosen


@dataclass
class ConstrainedSentences(OpenSentences):
    """`OpenSentences` with lexical constraints (`constraints.py`): a `PhraseState` per running beam and whether
    each finished beam contains every phrase. `expand` adds each beam's best token and the tokens that advance its
    phrases to the top candidates, and orders them by dynamic beam allocation (`constraints.allocate`); `advance`
    keeps the first K that do not stop, in that order, and ranks finished beams that meet their constraints above
    those that do not (which end only at their length limit); with one translation returned, a sentence whose
    translation is settled closes (`settled_length`)."""

    constraints: list = None  # per open sentence: its `SentenceConstraints`
    states: list = None  # per open sentence: a `PhraseState` per running beam
    finished_met: torch.Tensor = None  # (N, K) bool
    candidate_states: list = None  # per open sentence: the state of each candidate of the last `expand`

    @classmethod
    def start_constrained(cls, input_ids, settings: BeamSettings, fill: int, constraints) -> ConstrainedSentences:
        """Every sentence open (`OpenSentences.start`), each with its constraints (one `SentenceConstraints` per
        sentence) at their start."""
        state = cls.start(input_ids, settings, fill)
        state.constraints = list(constraints)
        state.states = [[sentence.start] * settings.num_beams for sentence in state.constraints]
        state.finished_met = torch.zeros_like(state.is_finished)
        return state

    def keep(self, rows: torch.Tensor) -> None:
        positions = rows.tolist()
        for name in ("constraints", "states"):
            setattr(self, name, [getattr(self, name)[position] for position in positions])
        for field in fields(OpenSentences):
            setattr(self, field.name, getattr(self, field.name)[rows])
        self.finished_met = self.finished_met[rows]

    def expand(self, log_probs: torch.Tensor, settings: BeamSettings, cur_len: int, at_limit=None, eos=()):
        """`OpenSentences.expand` under the constraints: a beam whose phrases are not all in it cannot end (its end
        tokens get -inf) unless it is `at_limit` (N * K,) bool; the C candidates come in allocation order."""
        open_count, beams = self.running.shape[:2]
        at_limit = [False] * (open_count * beams) if at_limit is None else at_limit.tolist()
        block_unmet_ends(log_probs, self.constraints, self.states, at_limit, eos)
        vocab_size = log_probs.shape[-1]
        totals = log_probs.view(open_count, beams, vocab_size) + self.running_scores[:, :, None]
        live = (self.running_scores > NEG / 2).tolist()  # the copies of the first beam at the start are not
        chosen = allocated(totals, live, self.states, self.constraints, settings.candidates)
        parents = [[beam for _, beam, _, _ in picks] for picks in chosen]
        chosen_tokens = [[token for _, _, token, _ in picks] for picks in chosen]
        chosen_scores = [[score for score, _, _, _ in picks] for picks in chosen]
        self.candidate_states = [[state for *_, state in picks] for picks in chosen]
        device = self.running.device
        parents = torch.tensor(parents, dtype=torch.long, device=device)
        scores = torch.tensor(chosen_scores, dtype=torch.float, device=device)
        origins = _gather(self.running_origins, parents)
        sequences = _gather(self.running, parents)
        sequences[:, :, cur_len] = torch.tensor(chosen_tokens, dtype=torch.long, device=device)
        origins[:, :, cur_len - settings.prompt_length] = (
            parents + torch.arange(open_count, device=device).view(-1, 1) * beams
        )
        return scores, sequences, origins

    def advance(self, scores, sequences, origins, stops: torch.Tensor, settings: BeamSettings, cur_len: int) -> None:
        """`OpenSentences.advance` in allocation order: the first K candidates that do not stop run on; of the top K
        candidates, those that stop join the finished beams, ranked by (meets its constraints, length-penalised
        score); whether a running beam may still beat a finished one."""
        beams = settings.num_beams
        running_scores = scores + stops.to(torch.float32) * NEG
        best = torch.sort(stops.to(torch.int8), dim=1, stable=True).indices[:, :beams]  # allocation order kept
        self.running = _gather(sequences, best)
        self.running_scores = _gather(running_scores, best)
        self.running_origins = _gather(origins, best)
        picked = best.tolist()
        self.states = [
            [states[index] for index in indices] for states, indices in zip(self.candidate_states, picked, strict=True)
        ]
        met = torch.tensor(
            [
                [sentence.met(state) for state in states]
                for sentence, states in zip(self.constraints, self.candidate_states, strict=True)
            ],
            dtype=torch.bool,
            device=stops.device,
        )

        top_k = torch.arange(settings.candidates, device=stops.device) < beams
        just_finished = stops & top_k[None, :]
        ended = scores / ((cur_len + 1 - settings.prompt_length) ** settings.length_penalty)
        full = torch.all(self.is_finished, axis=-1, keepdims=True) & (settings.early_stopping is True)
        ended += full.to(torch.float32) * NEG
        ended += (~self.may_improve).to(torch.float32) * NEG
        ended += (~just_finished) * NEG
        candidates = torch.cat((self.finished_scores, ended), dim=1)
        counted = just_finished & ~full & self.may_improve  # the others are masked (their sentence is closed)
        candidates_met = torch.cat((self.finished_met, met & counted), dim=1)
        by_score = torch.sort(candidates, dim=1, descending=True, stable=True).indices
        by_met = torch.sort(_gather(candidates_met, by_score).to(torch.int8), dim=1, descending=True, stable=True)
        merged = _gather(by_score, by_met.indices)[:, :beams]
        self.finished = _gather(torch.cat((self.finished, sequences), dim=1), merged)
        self.finished_scores = _gather(candidates, merged)
        self.finished_origins = _gather(torch.cat((self.finished_origins, origins), dim=1), merged)
        self.is_finished = _gather(torch.cat((self.is_finished, just_finished), dim=1), merged)
        self.finished_met = _gather(candidates_met, merged)

        # as `OpenSentences.advance`, with the best running score anywhere in the beam (allocation order is not
        # score order)
        best_length = settings.best_length(cur_len)
        top_running = self.running_scores.max(dim=1, keepdim=True)[0]
        best_running = top_running / (best_length**settings.length_penalty)
        worst_finished = torch.where(self.is_finished, torch.min(self.finished_scores, dim=1, keepdim=True)[0], NEG)
        self.may_improve = self.may_improve & torch.any(best_running > worst_finished, dim=-1, keepdim=True)
        if settings.returned == 1:  # closed once the translation returned cannot change (`settled_length`)
            best_ever = top_running / (settled_length(settings, cur_len) ** settings.length_penalty)
            self.may_improve &= ~(self.finished_met[:, :1] & (best_ever <= self.finished_scores[:, :1]))


def settled_length(settings: BeamSettings, cur_len: int) -> int:
    """The length at which a running beam's best possible length-penalised score is reached: scores only fall as
    tokens are added, so at the longest length when the penalty is positive, else at the next step's length. A
    constrained sentence whose best finished hypothesis meets its constraints and scores at least that (for the best
    running beam) keeps it first whatever the search does next: when one translation is returned, it is closed
    (fewer steps, the same translation; its other finished slots, not returned, may differ)."""
    if settings.length_penalty > 0.0:
        return settings.max_length - settings.prompt_length
    return cur_len + 2 - settings.prompt_length


def beam_settings(prompt_length: int, generation_config: GenerationConfig) -> tuple[BeamSettings, int]:
    """The search's fixed settings for prompts of `prompt_length` tokens, and the id that fills unused positions of
    the sequences: as transformers, the pad token, or the end token when the pad id is 0 (its `or`)."""
    eos_token_id = generation_config._eos_token_tensor
    fill = (generation_config._pad_token_tensor or eos_token_id[0]) if eos_token_id is not None else -1
    return BeamSettings.of(generation_config, prompt_length), fill


@dataclass
class SearchResults:
    """The finished beams of every sentence of the batch, one row each, written when the sentence closes; and the
    two flags transformers' stopping test reads for all of them (closed sentences keep the flags they closed with)."""

    sequences: torch.Tensor  # (B, K, L)
    origins: torch.Tensor  # (B, K, G)
    may_improve: torch.Tensor  # (B,) bool
    full: torch.Tensor  # (B,) bool: every finished slot holds an ended beam

    @classmethod
    def start(cls, state: OpenSentences) -> SearchResults:
        may_improve = torch.ones(len(state.sentences), dtype=torch.bool, device=state.running.device)
        return cls(state.finished.clone(), state.finished_origins.clone(), may_improve, torch.zeros_like(may_improve))

    def closed_sentences(self, state: OpenSentences, stops: torch.Tensor, settings: BeamSettings):
        """After a step: None when the search is over, else which open sentences (N,) are closed."""
        full = state.is_finished.all(dim=-1)
        self.may_improve[state.sentences], self.full[state.sentences] = state.may_improve[:, 0], full
        # transformers' stopping test over the whole batch; its "every candidate hit a stopping criterion" can only
        # come from max_length here (end tokens are fewer than the candidates), which stops the rows of closed
        # sentences too.
        if not (self.may_improve.any() and not (self.full.all() and settings.early_stopping is True)) or stops.all():
            return None
        # A sentence is closed when no finished beam can change any more: no improvement possible, or (with
        # early_stopping=True) all its beams finished.
        closed = ~state.may_improve[:, 0] | (full & (settings.early_stopping is True))
        return None if closed.all() else closed  # all closed: transformers would run on without effect

    def close(self, state: OpenSentences, closed: torch.Tensor) -> torch.Tensor:
        """Write out the `closed` sentences' finished beams and drop them from `state`; return the positions (in
        the open sentences before the drop) of those kept."""
        self.sequences[state.sentences[closed]] = state.finished[closed]
        self.origins[state.sentences[closed]] = state.finished_origins[closed]
        kept = (~closed).nonzero().squeeze(1)
        state.keep(kept)
        return kept

    def finish(self, state: OpenSentences, returned: int, prompt_length: int) -> torch.Tensor:
        """The best `returned` translations of each sentence, (B * returned, prompt + longest generated)."""
        self.sequences[state.sentences], self.origins[state.sentences] = state.finished, state.finished_origins
        sequences = self.sequences[:, :returned].flatten(0, 1)
        # transformers' crop: to the longest returned translation (its generated positions have an origin)
        generated = (self.origins[:, :returned] != -1).flatten(0, 1).sum(dim=1).max()
        return sequences[:, : prompt_length + generated]


_FLOAT32 = struct.Struct("f")


def f32(value: float) -> float:
    """`value` rounded to the nearest float32, infinite past float32's range (a float32 sum, quotient or product
    computed in double and rounded once is the float32 operation's result: double has more than twice float32's
    precision)."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:  # where struct checks the range (its native "f" casts: inf already)
        return math.copysign(math.inf, value)


def f32s(values: list[float]) -> list[float]:
    """`f32` of each value, in one call (array's "f" items are C floats: the same rounding; past float32's range,
    infinite)."""
    return array.array("f", values).tolist()


def top(values: list[float], k: int) -> list[int]:
    """`torch.topk(torch.tensor(values), k).indices.tolist()` for float32 `values`: a Python sort when distinct
    values decide the answer (the k largest and the next one all differ, no NaN), else torch.topk itself (its order
    among ties is its own)."""
    order = sorted(range(len(values)), key=values.__getitem__, reverse=True)
    head = [values[index] for index in order[: k + 1]]
    if all(a > b for a, b in itertools.pairwise(head)) and not any(value != value for value in values):
        return order[:k]
    return torch.topk(torch.tensor(values, dtype=torch.float32), k).indices.tolist()


class _Beams:
    """One open sentence of `ListBeamSearch`: `OpenSentences`' row for it, as lists (token ids after the prompt)."""

    __slots__ = (
        "sentence",
        "running",
        "running_scores",
        "rows",
        "finished",
        "finished_scores",
        "is_finished",
        "may_improve",
    )

    def __init__(self, sentence: int, beams: int):
        self.sentence = sentence
        self.running: list[list[int]] = [[] for _ in range(beams)]
        self.running_scores = [0.0] + [NEG] * (beams - 1)  # only the first of identical beams expands
        self.rows: list[int] = []  # the decoder row each running beam continued at the last step
        self.finished: list[list[int]] = [[] for _ in range(beams)]
        self.finished_scores = [NEG] * beams
        self.is_finished = [False] * beams
        self.may_improve = True

    def advance(self, scores, sequences, rows, stops, settings: BeamSettings, cur_len: int) -> None:
        """`OpenSentences.advance` for this open sentence: the same float32 operations in the same order."""
        beams, penalty = settings.num_beams, settings.length_penalty
        running_scores = [f32(score + NEG) if stop else score for score, stop in zip(scores, stops, strict=True)]
        best = top(running_scores, beams)
        self.running = [sequences[index] for index in best]
        self.running_scores = [running_scores[index] for index in best]
        self.rows = [rows[index] for index in best]

        just_finished = [stop and index < beams for index, stop in enumerate(stops)]
        divisor = f32((cur_len + 1 - settings.prompt_length) ** penalty)
        # the tensor search also masks every candidate of a sentence that is full (with early_stopping=True) or can no
        # longer improve: such a sentence is closed before its next step, so here (open sentences only) never
        ended = [f32(score / divisor) for score in scores]
        ended = [score if just else f32(score + NEG) for score, just in zip(ended, just_finished, strict=True)]
        candidates = self.finished_scores + ended
        merged = top(candidates, beams)
        pool, flags = self.finished + sequences, self.is_finished + just_finished
        self.finished = [pool[index] for index in merged]
        self.finished_scores = [candidates[index] for index in merged]
        self.is_finished = [flags[index] for index in merged]

        best_length = settings.best_length(cur_len)
        best_running = f32(self.running_scores[0] / f32(best_length**penalty))
        worst = min(self.finished_scores)
        self.may_improve = any(best_running > (worst if finished else NEG) for finished in self.is_finished)


class ListBeamSearch:
    """`OpenSentences` and `SearchResults` on Python lists and floats, for the fast decoding loop
    (`fast_generation.beam_search`): a tensor step of the search is ~50 operations on (N, 2K) tensors, which at batch
    1 cost more than a small model's decoder step. Per step torch computes the summed scores' top 2K from the
    (N * K, V) log-probabilities; the rest is the tensor search's float32 arithmetic on Python floats (`f32`: each
    sum, quotient and -1e9 mask rounded as torch rounds it) and its top-k selections (`top`: torch.topk itself where
    ties decide), so that it picks what the tensor search picks (tests/test_beam_search.py drives both with the same
    log-probabilities; tests/test_fast_generation.py: generate()'s ids)."""

    def __init__(self, batch_size: int, settings: BeamSettings, start: list[int], fill: int, eos: list[int]):
        self.settings, self.start, self.fill, self.eos = settings, start, fill, set(eos)
        self.open = [_Beams(sentence, settings.num_beams) for sentence in range(batch_size)]
        self.done: list[_Beams | None] = [None] * batch_size
        self.may_improve = [True] * batch_size  # per sentence, as `SearchResults`: closed ones keep their last
        self.full = [False] * batch_size

    def running_scores(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([beams.running_scores for beams in self.open], dtype=torch.float32, device=device)

    def step(self, log_probs: torch.Tensor, cur_len: int) -> tuple[list[int], list[int] | None] | None:
        """One step from next-token `log_probs` (N * K, V) of the open sentences' rows; None when the search is
        over, else the decoder row each next row continues (kept sentences only) and, when sentences closed, the
        positions of those kept among the open ones before (None: all kept)."""
        settings = self.settings
        open_count, vocab_size = len(self.open), log_probs.shape[-1]
        totals = log_probs.view(open_count, settings.num_beams, -1) + self.running_scores(log_probs.device)[..., None]
        scores, picks = torch.topk(totals.view(open_count, -1), k=settings.candidates)
        scores, picks = scores.tolist(), picks.tolist()
        at_max_length = cur_len + 1 >= settings.max_length
        every_stop = True
        for position, beams in enumerate(self.open):
            parents = [pick // vocab_size for pick in picks[position]]
            tokens = [pick % vocab_size for pick in picks[position]]
            stops = [at_max_length or token in self.eos for token in tokens]
            every_stop = every_stop and all(stops)
            sequences = [[*beams.running[parent], token] for parent, token in zip(parents, tokens, strict=True)]
            rows = [parent + position * settings.num_beams for parent in parents]
            beams.advance(scores[position], sequences, rows, stops, settings, cur_len)
        return self._close(every_stop)

    def _close(self, every_stop: bool) -> tuple[list[int], list[int] | None] | None:
        """After the open sentences advanced: `step`'s answer (`SearchResults.closed_sentences`), the sentences
        that closed moved to `done`. `every_stop`: every candidate of the step hit a stopping criterion."""
        settings = self.settings
        full = [all(beams.is_finished) for beams in self.open]
        for beams, sentence_full in zip(self.open, full, strict=True):
            self.may_improve[beams.sentence], self.full[beams.sentence] = beams.may_improve, sentence_full
        stopping = settings.early_stopping is True
        if not (any(self.may_improve) and not (all(self.full) and stopping)) or every_stop:
            return None  # `SearchResults.closed_sentences`
        closed = [not beams.may_improve or (done and stopping) for beams, done in zip(self.open, full, strict=True)]
        if all(closed):
            return None
        kept = None
        if any(closed):
            for beams, done in zip(self.open, closed, strict=True):
                if done:
                    self.done[beams.sentence] = beams
            kept = [position for position, done in enumerate(closed) if not done]
            self.open = [self.open[position] for position in kept]
        return [row for beams in self.open for row in beams.rows], kept

    def last_tokens(self) -> list[int]:
        """The token each decoder row of the next step gets: its running beam's last."""
        return [tokens[-1] for beams in self.open for tokens in beams.running]

    def finish(self, returned: int, device: torch.device) -> torch.LongTensor:
        """`SearchResults.finish`: the best `returned` translations of each sentence, prompt first, padded with the
        fill id to the longest."""
        for beams in self.open:
            self.done[beams.sentence] = beams
        hypotheses = [tokens for beams in self.done for tokens in beams.finished[:returned]]
        longest = max(len(tokens) for tokens in hypotheses)
        rows = [[*self.start, *tokens, *[self.fill] * (longest - len(tokens))] for tokens in hypotheses]
        return torch.tensor(rows, dtype=torch.long, device=device)


class _ConstrainedBeams(_Beams):
    """One open sentence of `ConstrainedListBeamSearch`: `_Beams` with `ConstrainedSentences`' row for it."""

    __slots__ = ("constraints", "states", "finished_met")

    def __init__(self, sentence: int, beams: int, constraints: SentenceConstraints):
        super().__init__(sentence, beams)
        self.constraints = constraints
        self.states = [constraints.start] * beams  # a `PhraseState` per running beam
        self.finished_met = [False] * beams

    def advance(self, chosen, sequences, rows, stops, settings: BeamSettings, cur_len: int) -> None:
        """`ConstrainedSentences.advance` for this open sentence, on its `allocated` candidates `chosen`: the same
        float32 operations, and its stable sorts as Python's (stable) sorts."""
        beams, penalty = settings.num_beams, settings.length_penalty
        scores = [score for score, *_ in chosen]
        running_scores = f32s([score + NEG if stop else score for score, stop in zip(scores, stops, strict=True)])
        best = sorted(range(len(stops)), key=stops.__getitem__)[:beams]  # allocation order kept
        self.running = [sequences[index] for index in best]
        self.running_scores = [running_scores[index] for index in best]
        self.rows = [rows[index] for index in best]
        self.states = [chosen[index][3] for index in best]

        just_finished = [stop and index < beams for index, stop in enumerate(stops)]
        divisor = f32((cur_len + 1 - settings.prompt_length) ** penalty)
        # as `_Beams.advance`: a sentence full (early_stopping=True) or past improving is closed, never here
        ended = f32s([score / divisor for score in scores])
        ended = f32s([score if just else score + NEG for score, just in zip(ended, just_finished, strict=True)])
        candidates = self.finished_scores + ended
        met = [just and self.constraints.met(item[3]) for item, just in zip(chosen, just_finished, strict=True)]
        candidates_met = self.finished_met + met
        # those that meet their constraints first, then by score; among equals, the earlier
        merged = sorted(range(len(candidates)), key=lambda index: (not candidates_met[index], -candidates[index]))
        merged = merged[:beams]
        pool, flags = self.finished + sequences, self.is_finished + just_finished
        self.finished = [pool[index] for index in merged]
        self.finished_scores = [candidates[index] for index in merged]
        self.is_finished = [flags[index] for index in merged]
        self.finished_met = [candidates_met[index] for index in merged]

        best_length = settings.best_length(cur_len)
        top_running = max(self.running_scores)
        best_running = f32(top_running / f32(best_length**penalty))
        worst = min(self.finished_scores)
        self.may_improve = any(best_running > (worst if finished else NEG) for finished in self.is_finished)
        if settings.returned == 1 and self.finished_met[0]:  # as `ConstrainedSentences.advance`
            best_ever = f32(top_running / f32(settled_length(settings, cur_len) ** penalty))
            self.may_improve = self.may_improve and not best_ever <= self.finished_scores[0]


class ConstrainedListBeamSearch(ListBeamSearch):
    """`ConstrainedSentences` on Python lists and floats, for the fast decoding loop, as `ListBeamSearch` is
    `OpenSentences`: the same candidates (`allocated`), the same float32 arithmetic and the same order, so that it
    picks what generate()'s constrained search picks (tests/test_beam_search.py step by step,
    tests/test_fast_generation.py generate()'s ids). `constraints`: a `SentenceConstraints` per sentence; `limits`:
    per sentence, the most tokens its translation may have (None: max_length only), where a beam may end without
    its constraints."""

    def __init__(
        self,
        batch_size: int,
        settings: BeamSettings,
        start: list[int],
        fill: int,
        eos: list[int],
        constraints: list[SentenceConstraints],
        limits: list[int] | None = None,
    ):
        super().__init__(batch_size, settings, start, fill, eos)
        self.open = [
            _ConstrainedBeams(sentence, settings.num_beams, constraints[sentence]) for sentence in range(batch_size)
        ]
        self.limits, self.eos_ids = limits, sorted(self.eos)

    def step(self, log_probs: torch.Tensor, cur_len: int) -> tuple[list[int], list[int] | None] | None:
        """`ListBeamSearch.step` under the constraints (`ConstrainedSentences.expand` and `.advance`)."""
        settings, beams = self.settings, self.settings.num_beams
        at_max_length = cur_len + 1 >= settings.max_length
        limits = self.limits
        at_limit = [  # the rows `_rows_at_limit` finds: cur_len - 1 tokens generated
            at_max_length or (limits is not None and cur_len - 1 >= limits[sentence.sentence] - 1)
            for sentence in self.open
            for _ in range(beams)
        ]
        constraints = [sentence.constraints for sentence in self.open]
        states = [sentence.states for sentence in self.open]
        block_unmet_ends(log_probs, constraints, states, at_limit, self.eos_ids)
        totals = log_probs.view(len(self.open), beams, -1) + self.running_scores(log_probs.device)[..., None]
        live = [[score > NEG / 2 for score in sentence.running_scores] for sentence in self.open]
        chosen = allocated(totals, live, states, constraints, settings.candidates)
        every_stop = True
        for position, (sentence, candidates) in enumerate(zip(self.open, chosen, strict=True)):
            stops = [at_max_length or token in self.eos for _, _, token, _ in candidates]
            every_stop = every_stop and all(stops)
            sequences = [[*sentence.running[parent], token] for _, parent, token, _ in candidates]
            rows = [parent + position * beams for _, parent, _, _ in candidates]
            sentence.advance(candidates, sequences, rows, stops, settings, cur_len)
        return self._close(every_stop)


def _rows_at_limit(processors, flat_running: torch.Tensor, cur_len: int, settings: BeamSettings) -> torch.Tensor:
    """(rows,) bool: the decoder rows whose next token is the last one their length limit allows (the per-sentence
    limit, `SourceLengthLimit`, or max_length): there a translation may end without its constraints."""
    if cur_len + 1 >= settings.max_length:
        return torch.ones(flat_running.shape[0], dtype=torch.bool, device=flat_running.device)
    limits = [p for p in processors if isinstance(p, SourceLengthLimit)]
    at_limit = torch.zeros(flat_running.shape[0], dtype=torch.bool, device=flat_running.device)
    for limit in limits:
        at_limit |= limit.at_limit(flat_running)
    return at_limit


class CompactBeamSearchMixin:
    """transformers' beam search, run only on the sentences whose search is still open (module docstring).

    `beam_search_observer`, when set on a model (None by default), is called after every step of this search with
    `(settings, cur_len, state, scores, sequences, origins, stops)`: the `BeamSettings`, the length before the step,
    the `OpenSentences` after `advance`, and the step's candidates (`OpenSentences.expand`'s scores, sequences and
    origins, and which of them hit a stopping criterion). It must not change them; the explainer
    (`modeling_attn.api.explain`) records the search tree with it. transformers' own beam search (the settings
    this one passes on) calls no observer.
    """

    beam_search_observer = None

    def _compact_beam_search_refusal(
        self,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        synced_gpus: bool,
        model_kwargs: dict,
    ) -> str | None:
        """Why this call must go to transformers' beam search (None: it need not)."""
        if not all(hasattr(type(self), name) for name in PRIVATE_HELPERS):
            return "this transformers version lacks the generation helpers this search calls"
        if generation_config.return_dict_in_generate:
            return "return_dict_in_generate: scores and beam indices are laid out over the whole batch"
        if generation_config.do_sample or synced_gpus or generation_config.low_memory:
            return "beam sampling, synced_gpus or low_memory"
        if not model_kwargs.get("use_cache") or set(model_kwargs) - KNOWN_MODEL_KWARGS:
            return "no cache, or model inputs this search does not know how to select rows of"
        if any(isinstance(value, Cache) and not rows_can_leave(value) for value in model_kwargs.values()):
            return "a cache that cannot drop rows (static or quantized layers)"
        # exact types: a subclass may override __call__ with per-batch logic
        if any(type(p) not in (*ROW_LOCAL_PROCESSORS, *PER_SENTENCE_PROCESSORS) for p in logits_processor):
            return "a logits processor not known to be per-row"
        if any(isinstance(getattr(p, "prompt_ignore_length", None), torch.Tensor) for p in logits_processor):
            return "a repetition penalty with one prompt length per row"
        if any(type(c) not in ROW_LOCAL_CRITERIA for c in stopping_criteria):
            return "a stopping criterion not known to be per-row (or max_time)"
        return None

    def _beam_search(
        self,
        input_ids: torch.LongTensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        synced_gpus: bool = False,
        **model_kwargs,
    ) -> torch.LongTensor:
        constraints = next((p for p in logits_processor if isinstance(p, LexicalConstraints)), None)
        if constraints is not None:  # the constrained search below runs them (`constraints.py`)
            logits_processor = LogitsProcessorList(p for p in logits_processor if p is not constraints)
        refusal = self._compact_beam_search_refusal(
            logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs
        )
        if refusal is not None and constraints is not None:
            raise ValueError(
                f"generate(): force_words_ids runs on modeling_attn's beam search, which refuses {refusal}"
            )
        if refusal is not None:
            return super()._beam_search(
                input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, **model_kwargs
            )
        settings, fill = beam_settings(input_ids.shape[1], generation_config)
        if constraints is None:
            state = OpenSentences.start(input_ids, settings, fill)
        else:
            state = ConstrainedSentences.start_constrained(input_ids, settings, fill, constraints.sentences)
            eos = (
                generation_config._eos_token_tensor.tolist() if generation_config._eos_token_tensor is not None else []
            )
        results = SearchResults.start(state)
        flat_running = input_ids
        outputs = self._prefill(
            input_ids, generation_config, model_kwargs, is_first_iteration=not generation_config.is_assistant
        )
        cur_len = settings.prompt_length
        while True:
            model_kwargs = self._update_model_kwargs_for_generation(
                outputs, model_kwargs, is_encoder_decoder=self.config.is_encoder_decoder
            )
            # transformers copies the logits to float32 first; log_softmax can cast them itself (same values), which
            # saves a copy of a (rows, vocabulary) tensor per step
            logits = outputs.logits[:, -1, :].to(input_ids.device)
            del outputs
            log_probs = logits_processor(flat_running, nn.functional.log_softmax(logits, dim=-1, dtype=torch.float32))
            if constraints is None:
                scores, sequences, origins = state.expand(log_probs, settings, cur_len)
            else:
                at_limit = _rows_at_limit(logits_processor, flat_running, cur_len, settings)
                scores, sequences, origins = state.expand(log_probs, settings, cur_len, at_limit, eos)
            open_count = len(state.sentences)
            stops = stopping_criteria(sequences[:, :, : cur_len + 1].flatten(0, 1), None).view(open_count, -1)
            state.advance(scores, sequences, origins, stops, settings, cur_len)
            if self.beam_search_observer is not None:  # a recorder of the search (see the class docstring)
                self.beam_search_observer(settings, cur_len, state, scores, sequences, origins, stops)
            rows = state.running_origins[..., cur_len - settings.prompt_length].flatten().long()  # cache rows
            cur_len += 1
            closed = results.closed_sentences(state, stops, settings)
            if closed is None:  # the search is over
                break
            if closed.any():
                kept = results.close(state, closed)
                model_kwargs = select_rows(model_kwargs, rows.view(open_count, settings.num_beams)[kept].flatten())
                logits_processor = LogitsProcessorList(
                    p.select(kept) if isinstance(p, PER_SENTENCE_PROCESSORS) else p for p in logits_processor
                )
            else:
                model_kwargs = self._reorder_beams(model_kwargs, rows)
            flat_running = state.running[:, :, :cur_len].flatten(0, 1)
            inputs = self.prepare_inputs_for_generation(flat_running, next_sequence_length=1, **model_kwargs)
            outputs = self(**inputs, return_dict=True)
        return results.finish(state, generation_config.num_return_sequences, settings.prompt_length)

    def _reorder_beams(self, model_kwargs: dict, rows: torch.Tensor) -> dict:
        """Every sentence still open: its cache rows follow the beams that continue (`rows`, one per decoder row)."""
        cache_name = next(name for name in ALL_CACHE_NAMES if name in model_kwargs)
        if hasattr(self, "_reorder_cache"):
            model_kwargs[cache_name] = self._reorder_cache(model_kwargs[cache_name], rows)
        else:
            model_kwargs[cache_name].reorder_cache(rows)
        return model_kwargs


__all__ = [
    "CompactBeamSearchMixin",
    "ConstrainedListBeamSearch",
    "ConstrainedSentences",
    "ListBeamSearch",
    "OpenSentences",
    "SearchResults",
    "beam_settings",
    "rows_can_leave",
    "select_rows",
]
