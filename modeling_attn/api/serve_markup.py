"""`attn serve`'s marked-up documents (`"format": "html"` or `"markdown"`): `api.markup` on the server's queue.

Each document of `text` is parsed and split in the handler (`markup.prepare_markup`; what cannot be parsed, or a
sentence over the position table with no clause to split it at: 422 naming `text[i]` and its line). Then
`markup.markup_events` runs in a thread of its own and hands each of its batches to the `Batcher` (`Batcher.submit`:
the queue, limits and turns of every request; the plain sentences in the request's group, those holding a tag's
boundary in a group with word alignments, over `alignment_words`), so a marked-up document shares the engine fairly
and batches with the other requests. The answer is `DocumentResponse`; streamed, one `block` event per block as it is
done (`text`: the source before the block and the block translated; they concatenate to the answer), then `done`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse, Response
from pydantic_core import to_json

from .batching import Group, QueueFull
from .markup import MarkedUpDocument, MarkupError, markup_events, prepare_markup
from .serve_schema import TranslateRequest
from .serve_stream import event_stream, sse
from .translation import SentenceTooLong, TranslateError

BATCH = 64  # sentences a document hands the queue at a time when not streamed (streamed: 1, 2, 4, ... up to it)


class _Gone(Exception):  # noqa: N818 (a signal: stop translating a stream nobody reads)
    pass


class _Refused(Exception):  # noqa: N818 (carries the response that refuses the request)
    def __init__(self, response: Response):
        super().__init__("refused")
        self.response = response


def prepared(serving: Any, request: TranslateRequest, language: str | None) -> list[MarkedUpDocument] | JSONResponse:
    """The request's documents parsed and split, or the 422 that names the document that cannot be (or says that
    their sentences are more than the server ever queues)."""
    documents = []
    for index, text in enumerate(request.text):
        try:
            documents.append(prepare_markup(serving.engine, text, request.format, language))
        except (MarkupError, SentenceTooLong) as error:
            detail = error.detail if isinstance(error, SentenceTooLong) else str(error)
            return JSONResponse({"error": f"text[{index}]: {detail}"}, status_code=422)
    sentences = sum(len(part.sentences) for document in documents for part in document.parts)
    if sentences > (most := serving.batcher.limits.max_queue):
        message = f"text: {sentences} sentences in its documents, more than the server queues (max_queue {most})"
        return JSONResponse({"error": message}, status_code=422)
    return documents


def _translator(serving: Any, groups: dict[bool, tuple[tuple, Group]], loop: asyncio.AbstractEventLoop) -> Callable:
    """`translate(sentences, aligned)` for `markup_events`, called in a worker thread: the batch queued in the
    `Batcher` (one submission per group) and waited for; `_Refused` with the response of a full queue or a failure."""

    async def queued(kind: bool, sentences: list[str]) -> list:
        key, group = groups[kind]
        tokens = [len(ids) for ids in serving.counting(sentences)["input_ids"]]
        try:
            future = serving.batcher.submit(sentences, tokens, key, group, loop)
        except QueueFull as error:
            serving.state["refused_full"] += 1
            full = JSONResponse({"error": str(error)}, status_code=503, headers={"Retry-After": "1"})
            raise _Refused(full) from None
        try:
            return await future
        except RuntimeError as error:  # the batch failed
            raise _Refused(JSONResponse({"error": str(error)}, status_code=500)) from None

    def translate(sentences: list[str], aligned: list[bool]) -> list[Any]:
        found: list[Any] = [None] * len(sentences)
        for kind in (False, True):
            rows = [row for row, flag in enumerate(aligned) if flag == kind]
            if rows:
                results = asyncio.run_coroutine_threadsafe(queued(kind, [sentences[r] for r in rows]), loop).result()
                for row, hypotheses in zip(rows, results, strict=True):
                    found[row] = hypotheses[0] if kind else hypotheses[0].text
        return found

    return translate


def _events(
    serving: Any,
    request: TranslateRequest,
    documents: list[MarkedUpDocument],
    groups: dict,
    words: str,
    put: Callable[[tuple[int, Any]], None],
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Runs in a thread: each document's blocks translated in order, `put((document, event))` for each."""
    translate = _translator(serving, groups, loop)
    options = groups[False][1].options
    for number, document in enumerate(documents):
        batches = {"batch_size": BATCH, "ramp": request.stream}
        for event in markup_events(serving.engine, document, request.format, None, words=words, translate=translate,
                                   **batches, **options):  # fmt: skip
            put((number, event))


async def translate_markup_request(serving: Any, request: TranslateRequest, groups: dict, language: str | None) -> Any:
    """`POST /translate` with `"format": "html"` or `"markdown"` (module docstring); `groups`: the request's batching
    key and group without (False) and with (True) word alignments."""
    documents = prepared(serving, request, language)
    if isinstance(documents, Response):
        return documents
    words = request.alignment_words or "whitespace"
    loop, queue, gone = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()
    counts = [sum(len(part.sentences) for part in document.parts) for document in documents]
    texts = ["" for _ in documents]

    def put(item: tuple[int, Any]) -> None:
        if gone.is_set():  # the client of a stream has gone: no more batches are queued for it
            raise _Gone
        number, event = item
        texts[number] += event.text
        if request.stream:
            data = {"document": number, "index": event.index, "text": event.text, "line": event.line}
            loop.call_soon_threadsafe(queue.put_nowait, sse("block", data))

    def answer(_: Any) -> dict[str, Any]:
        return {"translations": [{"text": text, "sentences": n} for text, n in zip(texts, counts, strict=True)]}

    serving.state["requests"] += 1
    future = asyncio.ensure_future(asyncio.to_thread(_events, serving, request, documents, groups, words, put, loop))
    if request.stream:
        outcome = _settled(future)
        outcome.add_done_callback(lambda done: gone.set() if done.cancelled() else None)
        return event_stream(outcome, queue, answer, serving.state)
    serving.state["in_flight"] += 1
    try:
        await future
    except _Refused as refused:
        return refused.response
    except TranslateError as error:
        return JSONResponse({"error": f"text: {error}"}, status_code=422)
    finally:
        serving.state["in_flight"] -= 1
    return Response(to_json(answer(None)), media_type="application/json")


def _settled(future: asyncio.Future) -> asyncio.Future:
    """`future` with a refusal or a translating error turned into the RuntimeError `event_stream` sends as `error`."""
    outcome = asyncio.get_running_loop().create_future()

    def settle(done: asyncio.Future) -> None:
        if outcome.done():
            return
        if done.cancelled():
            outcome.cancel()
        elif isinstance(error := done.exception(), _Refused):
            outcome.set_exception(RuntimeError(json.loads(bytes(error.response.body))["error"]))
        elif isinstance(error, _Gone):
            outcome.cancel()
        elif error is not None:
            outcome.set_exception(RuntimeError(str(error)))
        else:
            outcome.set_result(None)

    future.add_done_callback(settle)
    return outcome


__all__ = ["translate_markup_request"]
