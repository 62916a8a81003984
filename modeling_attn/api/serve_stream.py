"""`attn serve`'s streamed answers: Server-Sent Events (`"stream": true`), in order, then `done` or `error`.

An event is `event: NAME` and `data: JSON` lines and a blank line (the SSE format of the HTML standard), written
with Starlette's `StreamingResponse`: four lines of text need no library (sse-starlette's keep-alive pings and
reconnection ids are not needed by a stream that lasts one translation). `OrderedEvents` turns the `Batcher`'s
per-sentence results, which come batch by batch, into `sentence` events in input order; `event_stream` sends them,
or the `token` events of a token-streamed sentence, then `done` with the non-streamed answer's JSON, or `error` with
the JSON a refused request gets (`{"error": "..."}`). A client that goes away cancels its request's future: its
token-streamed sentence stops decoding at the next token (`batching.Batcher._stream`). docs/serve.md shows each event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic_core import to_json
from starlette.responses import StreamingResponse

MEDIA_TYPE = "text/event-stream"


def sse(name: str, data: Any) -> bytes:
    """One Server-Sent Event: its name and its data as one line of JSON (NaN and infinities as null; bytes: JSON
    already written)."""
    body = data if isinstance(data, bytes) else to_json(data, inf_nan_mode="null")
    return b"event: " + name.encode() + b"\ndata: " + body + b"\n\n"


class OrderedEvents:
    """`on_result(index, found)` for the `Batcher`: the events of results `0..count-1` in index order, each made by
    `event(index, found)` (a list of events) and put on `queue` once every result before it has come. `event` is
    also called with `found=None` for an index that has no result to wait for (`waiting(index)` false)."""

    def __init__(
        self,
        count: int,
        event: Callable[[int, Any], list[bytes]],
        queue: asyncio.Queue,
        waiting: Callable[[int], bool] = lambda index: True,
    ):
        self.count, self.event, self.queue, self.waiting = count, event, queue, waiting
        self.ready: dict[int, Any] = {}
        self.next = 0
        self.on_result(-1, None)  # what needs no result, before the first

    def on_result(self, index: int, found: Any) -> None:
        if index >= 0:
            self.ready[index] = found
        while self.next < self.count and (self.next in self.ready or not self.waiting(self.next)):
            for item in self.event(self.next, self.ready.pop(self.next, None)):
                self.queue.put_nowait(item)
            self.next += 1


async def _events(
    future: asyncio.Future, queue: asyncio.Queue, done: Callable[[Any], Any], state: dict[str, int]
) -> AsyncIterator[bytes]:
    """The queued events as they come, then `done(results)` as the `done` event, or the failure as `error`."""
    future.add_done_callback(lambda _: queue.put_nowait(None))  # after the results' events: both via the loop
    state["in_flight"] += 1
    try:
        while (item := await queue.get()) is not None:
            yield item
        try:
            results = future.result()
        except RuntimeError as error:  # the batch failed (a 500 when not streamed)
            yield sse("error", {"error": str(error)})
            return
        yield sse("done", done(results))
    finally:
        state["in_flight"] -= 1
        future.cancel()  # the client has gone (no-op once done): the worker stops streaming its tokens


def event_stream(
    future: asyncio.Future, queue: asyncio.Queue, done: Callable[[Any], Any], state: dict[str, int]
) -> StreamingResponse:
    """The streamed answer of a queued request: `queue`'s events, then `done` (module docstring)."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies pass each event on at once
    return StreamingResponse(_events(future, queue, done, state), media_type=MEDIA_TYPE, headers=headers)


__all__ = ["MEDIA_TYPE", "OrderedEvents", "event_stream", "sse"]
