"""The batching queue of `attn serve`: `Batcher` packs the sentences of concurrent requests into token batches.

Each sentence is queued under its decoding options (a `Group`); one worker thread translates the group whose oldest
sentence has waited longest, up to `ServeLimits.max_batch_tokens` rows or after `max_wait_ms`. Batching does not
change a translation (the models are padding-invariant); a sampling request with a `seed` is never merged with
another. A request's sentences are queued all or none (`QueueFull` when they do not fit); a failure inside
generate() fails that batch's requests and the worker goes on; `close` translates what is still queued, then stops.
The batches run on an engine (`engines.py`: the torch model, or an export engine with torch for what it lacks); the
torch engine switches a Transformer to the eager attention (the one with attention weights) for the batches that align
and back after. Pairs to score (`POST /score`) queue as a group of their own and run on `engine.score`. Streamed
requests queue as the others do (the same queue, limits and order): a streamed document's sentences ramp (its batches
take 1, 2, 4... of them, so the first comes back early) and each is reported when done; a token-streamed sentence is a
group of its own, decoded alone, its text handed on as it comes; a cancelled request's sentences (a stream whose client
has gone) are dropped when their turn comes. No FastAPI: `server.py` awaits `submit`'s futures.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .alignment import AlignedTranslation
from .constraints import ConstraintWarning
from .engines import Engine, as_engine
from .scoring import Score
from .streaming import StreamClosed, stream_sentence
from .translation import Hypothesis

SAMPLING_BATCH = 32  # sentences per generate() call of a seeded sampling request: `attn translate`'s --batch_size


@dataclass(frozen=True)
class ServeLimits:
    """How the server batches and what it refuses (the flags of `attn serve`)."""

    max_batch_tokens: int = 8192  # rows generate() decodes per call: sentences x longest x beams
    max_wait_ms: float = 0.0  # the longest a sentence waits for others to join its batch (docs/serve.md: why 0)
    max_queue: int = 1024  # sentences waiting; a request that does not fit answers 503
    max_body_bytes: int = 1 << 20  # a larger request body answers 413

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_queue", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be 0 or more, got {self.max_wait_ms}")


class QueueFull(RuntimeError):
    """The queue cannot take a request's sentences now (503)."""


Found = Hypothesis | AlignedTranslation  # a hypothesis: text and score, with its word alignment when asked for


def _translate_group(engine: Engine, batch: list[_Sentence], group: Group) -> list[list[Found]] | list[Score]:
    """One call of the engine on the `batch` with the group's options and each sentence's own: `translate_nbest`, or
    `translate_aligned_nbest` (the same hypotheses and scores, each with its word alignment) when the group asks for
    alignments; for a scoring group, whose texts are (source, target) pairs, `score`."""
    texts = [sentence.text for sentence in batch]
    if group.scoring:
        return engine.score([source for source, _ in texts], [target for _, target in texts], len(texts))
    own = {name for sentence in batch for name in sentence.steering}
    options = {**group.options, **{name: [sentence.steering.get(name) for sentence in batch] for name in own}}
    if group.constrained:
        options["constraints"] = [sentence.constraints or [] for sentence in batch]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConstraintWarning)  # answered in `unmet_constraints`
            return engine.translate_nbest(texts, group.num_return_sequences, **options)
    if group.alignment_words is None:
        return engine.translate_nbest(texts, group.num_return_sequences, **options)
    return engine.translate_aligned_nbest(texts, group.num_return_sequences, words=group.alignment_words, **options)


@dataclass
class _Job:
    """One request: its answers, filled in by the worker, and the future its handler awaits. A streamed request
    also has `on_result(index, found)`, called in the event loop as each sentence is done, and `on_text(piece)`,
    each piece of a token-streamed sentence's text; `ramp`: the most of its sentences the next batch takes."""

    results: list[list[Found] | None]
    remaining: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    on_result: Callable[[int, Any], None] | None = None
    on_text: Callable[[str], None] | None = None
    ramp: int | None = None


@dataclass
class _Sentence:
    job: _Job
    index: int  # in the request's `text`
    text: str | tuple[str, str]  # a (source, target) pair to score
    tokens: int  # its length in tokens, end-of-sentence included
    arrived: float
    steering: dict[str, Any] = field(default_factory=dict)  # its per-sentence options (`PER_SENTENCE_OPTIONS`)
    constraints: list[str] | None = None  # target phrases its translation must contain (a constrained group's)


@dataclass
class Group:
    """Queued sentences with the same decoding options."""

    options: dict[str, Any]  # generate() keyword arguments
    num_return_sequences: int
    beams: int
    seed: int | None
    alignment_words: str | None = None  # with word alignments, over these words (`alignment.split_words`)
    scoring: bool = False  # pairs to score (`engine.score`), not sentences to translate
    constrained: bool = False  # each sentence with its own constraints (`_Sentence.constraints`)
    streamed: bool = False  # one sentence, its text sent as its tokens come (`streaming.stream_sentence`)
    sentences: deque[_Sentence] = field(default_factory=deque)


def _settle(job: _Job, outcome: BaseException | list) -> None:
    """Called in the event loop: resolve the request's future unless the client has gone."""
    if job.future.done():
        return
    if isinstance(outcome, BaseException):
        job.future.set_exception(outcome)
    else:
        job.future.set_result(outcome)


class Batcher:
    """The queue of sentences and the thread that translates them (see the module docstring)."""

    def __init__(
        self, model: PreTrainedModel | Engine, tokenizer: PreTrainedTokenizerBase | None, limits: ServeLimits
    ):
        """`model`: a model with its `tokenizer`, or an engine (`engines.as_engine`)."""
        self.engine, self.limits = as_engine(model, tokenizer), limits
        self._groups: dict[tuple, Group] = {}
        self._waiting = 0
        self._closing = False
        self._condition = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="attn-serve-batcher", daemon=True)
        self.batches = 0
        self.sentences_translated = 0

    @property
    def waiting(self) -> int:
        """Sentences queued and not yet taken into a batch."""
        return self._waiting

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Refuse new requests, translate every sentence still queued, and stop the worker."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def submit(
        self,
        sentences: list,
        tokens: list[int],
        key: tuple,
        group: Group,
        loop: asyncio.AbstractEventLoop,
        steering: list[dict[str, Any]] | None = None,
        constraints: list[list[str]] | None = None,
        stream: dict[str, Any] | None = None,
    ) -> asyncio.Future:
        """Queue a request's sentences (or pairs to score; all or none) under `key`, each with its per-sentence options
        (`steering`: one dict per sentence, default none) and, in a constrained `group`, its target phrases
        (`constraints`); a future of their hypotheses (or scores) in input order. `stream`: the job's `on_result`,
        `on_text` and `ramp` (`_Job`) for a streamed request."""
        steering = steering or [{} for _ in sentences]
        job = _Job([None] * len(sentences), len(sentences), loop.create_future(), loop, **(stream or {}))
        now = time.monotonic()
        with self._condition:
            if self._closing:
                raise QueueFull("the server is shutting down")
            if self._waiting + len(sentences) > self.limits.max_queue:
                raise QueueFull(
                    f"the queue is full ({self._waiting} sentences waiting, max_queue {self.limits.max_queue}, "
                    f"this request {len(sentences)}); retry later"
                )
            queued = self._groups.setdefault(key, group)
            for index, (text, count, own) in enumerate(zip(sentences, tokens, steering, strict=True)):
                phrases = None if constraints is None else constraints[index]
                queued.sentences.append(_Sentence(job, index, text, count, now, own, phrases))
            self._waiting += len(sentences)
            self._condition.notify_all()
        return job.future

    def _cost(self, sentences: list[_Sentence], group: Group) -> int:
        return len(sentences) * max(sentence.tokens for sentence in sentences) * group.beams

    def _full(self, group: Group) -> bool:
        return self._cost(list(group.sentences), group) >= self.limits.max_batch_tokens

    def _next_batch(self) -> tuple[Group, list[_Sentence]] | None:
        """Wait for the next batch (see the module docstring); None once closed and drained."""
        with self._condition:
            while not self._groups and not self._closing:
                self._condition.wait()
            if not self._groups:
                return None
            key = min(self._groups, key=lambda k: self._groups[k].sentences[0].arrived)
            group = self._groups[key]
            deadline = group.sentences[0].arrived + self.limits.max_wait_ms / 1000
            # Only this thread takes sentences out, so the group can only grow while it waits.
            alone = group.seed is not None or group.streamed  # nothing may join these
            while not alone and not self._closing and not self._full(group):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._condition.wait(remaining)
            if group.seed is not None and not group.streamed:  # a seeded sampling request: alone, whole
                batch = list(group.sentences)
                group.sentences.clear()
            else:
                batch = self._take(group)
            if not group.sentences:
                del self._groups[key]
            self._waiting -= len(batch)
            return group, batch

    def _take(self, group: Group) -> list[_Sentence]:
        """The group's oldest sentences up to `max_batch_tokens` (a streamed group's: one), and no more of a ramping
        job's than its `ramp`, which then doubles (1, 2, 4...: its first sentence comes back early)."""
        batch = [group.sentences.popleft()]
        taken = {id(batch[0].job): 1}
        while group.sentences and not group.streamed:
            following = group.sentences[0]
            ramp = following.job.ramp
            if ramp is not None and taken.get(id(following.job), 0) >= ramp:
                break
            if self._cost([*batch, following], group) > self.limits.max_batch_tokens:
                break
            batch.append(group.sentences.popleft())
            taken[id(following.job)] = taken.get(id(following.job), 0) + 1
        for job in {id(sentence.job): sentence.job for sentence in batch}.values():
            if job.ramp is not None:
                job.ramp *= 2
        return batch

    def _translate(self, group: Group, batch: list[_Sentence]) -> list[list[Found]]:
        if group.streamed:
            return [[self._stream(group, batch[0])]]
        if group.seed is None:
            return _translate_group(self.engine, batch, group)
        self.engine.seed(group.seed)  # as `attn translate --seed`: once, then the chunks in order
        hypotheses: list[list[Found]] = []
        for start in range(0, len(batch), SAMPLING_BATCH):
            hypotheses += _translate_group(self.engine, batch[start : start + SAMPLING_BATCH], group)
        return hypotheses

    def _stream(self, group: Group, sentence: _Sentence) -> Found:
        """A token-streamed sentence: each piece of its text handed to the event loop as it comes; decoding stops at
        the next token once the request's future is done (its client has gone)."""
        job = sentence.job

        def emit(piece: str) -> None:
            if job.future.done():
                raise StreamClosed
            job.loop.call_soon_threadsafe(job.on_text, piece)

        if group.seed is not None:
            self.engine.seed(group.seed)
        return stream_sentence(self.engine, sentence.text, emit, **group.options)

    def _run(self) -> None:
        while (taken := self._next_batch()) is not None:
            group, batch = taken
            batch = [sentence for sentence in batch if not sentence.job.future.cancelled()]  # a stream left behind
            if not batch:
                continue
            try:
                hypotheses = self._translate(group, batch)
            except Exception as error:  # noqa: BLE001 (answered as a 500 to the requests of this batch)
                failed = RuntimeError(f"translation failed: {type(error).__name__}: {error}")
                for job in {id(sentence.job): sentence.job for sentence in batch}.values():
                    job.loop.call_soon_threadsafe(_settle, job, failed)
                continue
            self.batches += 1
            self.sentences_translated += len(batch)
            for sentence, found in zip(batch, hypotheses, strict=True):
                job = sentence.job
                job.results[sentence.index] = found
                job.remaining -= 1
                if job.on_result is not None:
                    job.loop.call_soon_threadsafe(job.on_result, sentence.index, found)
                if job.remaining == 0:
                    job.loop.call_soon_threadsafe(_settle, job, job.results)


__all__ = ["SAMPLING_BATCH", "Batcher", "Found", "Group", "QueueFull", "ServeLimits"]
