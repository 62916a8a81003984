"""Streaming: `translate_stream(engine, text, ...)` yields a translation as it is made, the events `attn serve` sends.

A document (`document=True`) streams a sentence at a time (`documents.document_events`, first batches small: a
`DocumentEvent` per sentence). A single sentence streams a token at a time where the engine can (greedy search or
sampling, one hypothesis: `engine.can_stream(options)`; the torch engine through generate()'s `streamer`, which
`fast_generation` feeds too, CTranslate2 through `generate_tokens`): a `TokenEvent` per token that adds text
(`TextDeltas`: a token ending in a partial character or in whitespace comes with the next). Beam search finishes its
hypotheses only at the end: there the sentence comes whole, as one `DocumentEvent`. In every case the events' `text`s
concatenate to the non-streamed translation, which `stream_sentence` returns with its score (tests/test_streaming.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from transformers.generation.streamers import BaseStreamer

from .documents import DocumentEvent, document_events
from .translation import Hypothesis


@dataclass(frozen=True)
class TokenEvent:
    """New text of sentence `index`'s translation: what its latest token(s) added."""

    index: int
    text: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class StreamClosed(Exception):  # noqa: N818 (a signal to stop decoding, not an error)
    """Raised from a token callback to stop decoding: nobody reads the stream any more."""


class TokenCallback(BaseStreamer):
    """transformers' streamer protocol (`generate(streamer=...)`) for one sentence: `on_token(id)` per new token; the
    first `put` is the decoder's start token, which is no part of the translation."""

    def __init__(self, on_token: Callable[[int], None]):
        self.on_token, self.started = on_token, False

    def put(self, value: Any) -> None:
        if not self.started:
            self.started = True
            return
        for token_id in value.reshape(-1).tolist():
            self.on_token(token_id)

    def end(self) -> None:
        pass


class TextDeltas:
    """A translation's text as its tokens come: `push(id)` returns the text the token adds ("" while it is held:
    it ends in a partial character, or in whitespace that a later token may change), `finish(text)` the rest of the
    final `text`. What was returned is always a prefix of the decoded tokens, so the pieces concatenate to `text`."""

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.ids, self.sent = tokenizer, [], ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        safe = text.rstrip()
        if safe.endswith("\ufffd") or not safe.startswith(self.sent):
            return ""
        piece, self.sent = safe[len(self.sent) :], safe
        return piece

    def finish(self, text: str) -> str:
        if not text.startswith(self.sent):  # a decoding that rewrites earlier text: never seen, never hidden
            raise RuntimeError(f"streamed {self.sent!r}, and the translation is {text!r}: they do not concatenate")
        rest, self.sent = text[len(self.sent) :], text
        return rest


def stream_sentence(engine: Any, sentence: str, emit: Callable[[str], None], **options: Any) -> Hypothesis:
    """`sentence` translated on `engine` with `options` (one hypothesis), `emit(text)` called with each piece of
    text as its tokens come (`engine.can_stream(options)`; else once, with the whole translation); the pieces
    concatenate to the returned hypothesis' text. `emit` may raise `StreamClosed` to stop decoding."""
    if not engine.can_stream(options):
        found = engine.translate_nbest([sentence], 1, **options)[0][0]
        if found.text:
            emit(found.text)
        return found
    deltas = TextDeltas(engine.tokenizer)

    def on_token(token_id: int) -> None:
        if piece := deltas.push(token_id):
            emit(piece)

    found = engine.translate_streamed(sentence, on_token, **options)
    if rest := deltas.finish(found.text):
        emit(rest)
    return found


def _in_thread(run: Callable[[Callable[[str], None]], Any]) -> Iterator[str]:
    """The pieces `run(emit)` emits, read from another thread as they come; `run`'s exception is raised here; closing
    the iterator stops `run` at its next piece (`StreamClosed`)."""
    pieces: queue.Queue = queue.Queue()
    closed = threading.Event()
    done = object()

    def emit(piece: str) -> None:
        if closed.is_set():
            raise StreamClosed
        pieces.put(piece)

    def work() -> None:
        try:
            run(emit)
            pieces.put(done)
        except StreamClosed:
            pass
        except BaseException as error:  # noqa: BLE001 (raised again in the reading thread)
            pieces.put(error)

    thread = threading.Thread(target=work, name="attn-stream", daemon=True)
    thread.start()
    try:
        while (piece := pieces.get()) is not done:
            if isinstance(piece, BaseException):
                raise piece
            yield piece
    finally:
        closed.set()


def translate_stream(
    engine: Any,
    text: str,
    document: bool = False,
    batch_size: int = 32,
    source_lang: str | None = None,
    **options: Any,
) -> Iterator[DocumentEvent | TokenEvent]:
    """`text` (one sentence, or with `document` running text) translated on `engine` with `options` (generate()'s
    keyword arguments), as events (module docstring); `"".join(event.text for event in ...)` is the translation."""
    if document:
        yield from document_events(engine, text, batch_size, source_lang, ramp=True, **options)
        return
    if not engine.can_stream(options):
        found = engine.translate_nbest([text], 1, **options)[0][0]
        yield DocumentEvent(0, text, found.text, found.text, 1)
        return
    for piece in _in_thread(lambda emit: stream_sentence(engine, text, emit, **options)):
        yield TokenEvent(0, piece)


__all__ = [
    "StreamClosed",
    "TextDeltas",
    "TokenCallback",
    "TokenEvent",
    "stream_sentence",
    "translate_stream",
]
