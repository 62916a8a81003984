"""A translation server over HTTP: `create_app(engine)` (or `create_app(model, tokenizer)`) builds a FastAPI app.

`attn serve` (`cli/serve.py`) runs it with uvicorn; docs/serve.md describes each part:
- endpoints: `POST /translate` (`serve_schema.TranslateRequest`: the decoding options of `attn translate`, n-best
  lists, word alignments), `POST /score` (`serve_schema.ScoreRequest`: `attn score`'s pairs), `GET /health`,
  `GET /model` (`model_info.describe_model`), `GET /docs` and `GET /openapi.json`; `GET /model` names the engine
  that decodes (`engines.py`: torch, or an export engine with torch for what it lacks under `--engine auto`);
- documents (`"format": "text"`: each item of `text` a document, split by `documents.py`, its sentences queued as one
  request) and streams (`"stream": true`: Server-Sent Events, `serve_stream.py`; queued as any request);
- batching: `batching.Batcher`, whose worker thread runs between the application's startup and shutdown;
- refusals, each with a JSON body `{"error": "<field>: <what is wrong>"}` naming the field (400, 413, 422, and 503
  with `Retry-After` for a full queue); a failure inside generate() answers 500 for that batch and the worker goes on;
- shutdown: on SIGTERM the requests in flight and the sentences still queued are finished (`Batcher.close`).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic_core import to_json
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .batching import Batcher, Found, Group, QueueFull, ServeLimits
from .constraints import missing_phrases
from .documents import FALLBACK_LANGUAGE, Document, fit_sentences, split_document, token_counter
from .engines import Engine, as_engine
from .errors import UserError
from .markup import FORMATS as MARKUP_FORMATS
from .model_info import describe_model
from .scoring import PairError, Score, prepare_pairs
from .serve_markup import translate_markup_request
from .serve_schema import DocumentResponse, ScoreRequest, ScoreResponse, TranslateRequest, TranslateResponse
from .serve_stream import OrderedEvents, event_stream, sse
from .translation import (
    SentenceTooLong,
    TranslateError,
    check_nbest,
    check_prefixes,
    generation_overrides,
    target_ids,
    translation_limits,
)


class RequestError(UserError, ValueError):
    """A request the model cannot serve (422); `field` is the request's field it names."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _field_name(location: tuple | list) -> str:
    """`("body", "text", 3)` -> `text[3]`; the body itself -> `body`."""
    parts = [part for part in location if part != "body"]
    name = ""
    for part in parts:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "body"


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """FastAPI's validation errors as one message naming the fields (400 for JSON that does not parse)."""
    errors = error.errors()
    if any(entry.get("type") == "json_invalid" for entry in errors):
        entry = next(entry for entry in errors if entry.get("type") == "json_invalid")
        where = entry["loc"][1] if len(entry["loc"]) > 1 else "?"
        reason = (entry.get("ctx") or {}).get("error", "")
        return JSONResponse({"error": f"body: not valid JSON ({reason}, at character {where})"}, status_code=400)
    messages = []
    for entry in errors:
        name = _field_name(entry.get("loc", ()))
        message = entry.get("msg", "invalid").removeprefix("Value error, ")
        if name == "body" and entry.get("type") in ("missing", "model_attributes_type", "dict_type"):
            example = '{"source": ["..."], "target": ["..."]}' if request.url.path == "/score" else '{"text": ["..."]}'
            message = f"a JSON object such as {example} is required (content-type: application/json)"
        # a check of the whole request (`_sampling_settings_need_do_sample`) names its fields itself
        whole = name == "body" and entry.get("type") == "value_error"
        messages.append(message if whole else f"{name}: {message}")
    return JSONResponse({"error": "; ".join(messages)}, status_code=422)


async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    """The framework's own errors (404, 405, a body it cannot parse) in the shape of ours: {"error": message}."""
    return JSONResponse({"error": str(error.detail)}, status_code=error.status_code, headers=error.headers)


class BodyChecks:
    """ASGI middleware: a request body over `limit` bytes answers 413 before the application reads it (by its
    Content-Length, or by counting a chunked body); a body that is not UTF-8 (JSON's encoding, RFC 8259) answers 400
    naming the first byte that is not."""

    def __init__(self, app: Callable[..., Awaitable[None]], limit: int):
        self.app, self.limit = app, limit

    async def _refuse(self, scope: dict, receive: Callable, send: Callable, size: str) -> None:
        message = f"body: {size} bytes, more than the server's limit of {self.limit} bytes (--max_body_bytes)"
        await JSONResponse({"error": message}, status_code=413)(scope, receive, send)

    async def __call__(self, scope: dict, receive: Callable[..., Awaitable[dict]], send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(scope, receive, send, length.decode())
        messages, size = [], 0
        while True:  # read the body here, counting, then hand it on
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                return await self._refuse(scope, receive, send, f"over {size}")
            if not message.get("more_body", False):
                break

        body = b"".join(message.get("body", b"") for message in messages)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as error:
            message = f"body: not UTF-8 (byte 0x{body[error.start]:02x} at offset {error.start}); send JSON in UTF-8"
            return await JSONResponse({"error": message}, status_code=400)(scope, receive, send)

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def _group_for(engine: Engine, request: TranslateRequest) -> tuple[tuple, Group]:
    """The decoding options of a request as a batching key and group; RequestError for options generate() cannot
    honour with this model, or the server's engine cannot (checked before queueing)."""
    model = engine.model
    options = generation_overrides(request)
    steering = {"target_prefix": request.prefix} if request.prefix is not None else {}
    constrained = request.constraints is not None
    probe = {**options, **steering, **({"constraints": []} if constrained else {})}
    if (reason := engine.refusal(probe, alignments=bool(request.alignment))) is not None:
        field = "alignment" if request.alignment else "do_sample" if request.do_sample else "options"
        field = "constraints" if constrained and reason.startswith("has no constraints") else field
        raise RequestError(field, f"the server's engine {engine.name} {reason}; start attn serve with --engine torch")
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and request.max_new_tokens is not None and request.max_new_tokens > limit:
        raise RequestError(
            "max_new_tokens",
            f"{request.max_new_tokens} is more than the model's max_position_embeddings={limit}: the decoder has "
            "no position for a longer translation",
        )
    try:
        check_nbest(model, request.num_return_sequences, options)
    except TranslateError as error:
        raise RequestError("num_return_sequences", str(error)) from None
    beams = options.get("num_beams") or model.generation_config.num_beams or 1
    if constrained and beams < 2:
        raise RequestError(
            "constraints", f"a beam search, and the model decodes with num_beams={beams}; give num_beams 2 or more"
        )
    seeded = request.do_sample and request.seed is not None
    # Sentences with and without alignments (or with other definitions of a word) never share a generate() call;
    # hard and soft do: they are two writings of the same alignment (`_answer`).
    words = (request.alignment_words or "whitespace") if request.alignment else None
    key = (tuple(sorted(options.items())), request.num_return_sequences, words, ("seed", object()) if seeded else None)
    key += (("constraints", True),) if constrained else ()  # constrained sentences share calls among themselves
    group = Group(
        options, request.num_return_sequences, beams, request.seed if seeded else None, words, constrained=constrained
    )
    return key, group


def _token_counts(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, text: list[str]) -> list[int]:
    """Each sentence's length in tokens as generate() gets it; RequestError naming `text[i]` over the model's
    position table (refused, never cut)."""
    counts = [len(ids) for ids in tokenizer(text, return_token_type_ids=False)["input_ids"]]
    counts = [count if sentence.strip() else 0 for count, sentence in zip(counts, text, strict=True)]
    limit = getattr(model.config, "max_position_embeddings", None)
    for index, count in enumerate(counts):
        if limit is not None and count > limit:
            raise RequestError(
                f"text[{index}]", f"{count} tokens, more than the model's max_position_embeddings={limit}; split it"
            )
    return counts


def _prefixes(
    tokenizer: PreTrainedTokenizerBase,
    model: PreTrainedModel,
    request: TranslateRequest,
    tokens: list[int],
    options: dict[str, Any],
) -> list[dict[str, Any]] | None:
    """Each sentence's per-sentence options (its `prefix`), checked before queueing: RequestError naming `prefix[i]`
    for a prefix with no room for the end token under its translation's length limit."""
    if request.prefix is None:
        return None
    try:
        limits = translation_limits(model, tokens, options)
        check_prefixes(target_ids(tokenizer, request.prefix), limits, list(range(len(tokens))))
    except SentenceTooLong as error:
        raise RequestError(f"prefix[{error.row}]", f"the sentence {error.detail}") from None
    return [{"target_prefix": prefix} for prefix in request.prefix]


def _pair_counts(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, request: ScoreRequest) -> list[int]:
    """Each pair's length in tokens (its longer side, the target's start token counted); RequestError naming
    `source[i]` or `target[i]` for a pair the engine would refuse (`scoring.prepare_pairs`), before it is queued."""
    try:
        sources, targets = prepare_pairs(model, tokenizer, request.source, request.target)
    except PairError as error:
        raise RequestError(f"{error.side}[{error.row}]", error.detail) from None
    return [max(len(source), len(target) + 1) for source, target in zip(sources, targets, strict=True)]


def _scores_answer(scores: list[Score], tokens: bool) -> Response:
    """The body of `ScoreResponse`, written as `_answer` writes its own (an infinite log-probability is null)."""
    body = to_json({"scores": [found.as_dict(tokens) for found in scores]}, inf_nan_mode="null")
    return Response(body, media_type="application/json")


def _answer(
    hypotheses: list[list[Found]], nbest: bool, alignment: str | None = None, unmet: Callable | None = None
) -> Response:
    """The body of `TranslateResponse` as FastAPI writes it under `response_model_exclude_unset` (the same bytes:
    tests/test_serve.py), written here: FastAPI's validation and serialization of the response model cost a lone
    request about 0.1 ms (docs/serve.md). The route keeps `response_model` for its OpenAPI schema; FastAPI sends a
    returned Response as it is. Fields never set (`alignment`, `nbest`, `unmet_constraints`) are left out; a NaN
    score is null. `unmet(row, text)`: the phrases of sentence `row`'s constraints that `text` lacks."""

    def scored(hypothesis: Found, row: int) -> dict[str, Any]:
        found = {"text": hypothesis.text, "score": None if math.isnan(hypothesis.score) else hypothesis.score}
        if alignment == "hard":
            found["alignment"] = hypothesis.alignment.pairs
        elif alignment == "soft":
            found["alignment"] = hypothesis.alignment.soft()
        if unmet is not None:
            found["unmet_constraints"] = unmet(row, hypothesis.text)
        return found

    translations = []
    for row, found in enumerate(hypotheses):
        translation = scored(found[0], row)
        if nbest:
            translation["nbest"] = [scored(hypothesis, row) for hypothesis in found]
        translations.append(translation)
    # pydantic's own JSON writer, as FastAPI's for a response model: the same numbers, infinities as null
    body = to_json({"translations": translations}, inf_nan_mode="null")
    return Response(body, media_type="application/json")


def _sentences(
    engine: Engine, tokenizer: PreTrainedTokenizerBase, request: TranslateRequest
) -> tuple[list, list[int], tuple, Group, dict[str, Any]]:
    """`POST /translate`'s part of `_queued`: the sentences, their token counts, the batching key and group, and each
    sentence's own options (its prefix, its constraints), all checked."""
    key, group = _group_for(engine, request)
    tokens = _token_counts(tokenizer, engine.model, request.text)
    prefixes = _prefixes(tokenizer, engine.model, request, tokens, group.options)
    return request.text, tokens, key, group, {"steering": prefixes, "constraints": request.constraints}


def _submitted(
    batcher: Batcher, state: dict[str, int], field: str, items: list, prepare: Callable[[], tuple]
) -> asyncio.Future | JSONResponse:
    """The future of a request's `items` (sentences, or pairs to score) queued by `prepare()` (its checks, then
    `Batcher.submit`'s items, token counts, key, group and its keyword arguments), or the response that refuses it;
    `state` counts."""
    state["requests"] += 1
    try:
        if len(items) > batcher.limits.max_queue:
            noun, queue = ("pairs" if field == "source" else "sentences"), f"max_queue {batcher.limits.max_queue}"
            raise RequestError(field, f"{len(items)} {noun}, more than the server queues ({queue})")
        items, tokens, key, group, own = prepare()
        return batcher.submit(items, tokens, key, group, asyncio.get_running_loop(), **own)
    except RequestError as error:
        return JSONResponse({"error": str(error)}, status_code=422)
    except QueueFull as error:
        state["refused_full"] += 1
        return JSONResponse({"error": str(error)}, status_code=503, headers={"Retry-After": "1"})


async def _queued(
    batcher: Batcher, state: dict[str, int], field: str, items: list, prepare: Callable[[], tuple]
) -> Any:
    """The results of `_submitted(...)`'s request, awaited, or the response that refuses it (500: the batch failed)."""
    future = _submitted(batcher, state, field, items, prepare)
    return future if isinstance(future, Response) else await _awaited(state, future)


async def _awaited(state: dict[str, int], future: asyncio.Future) -> Any:
    """A queued request's results, or the 500 that says its batch failed."""
    state["in_flight"] += 1
    try:
        return await future
    except RuntimeError as error:
        return JSONResponse({"error": str(error)}, status_code=500)
    finally:
        state["in_flight"] -= 1


@dataclass
class _Serving:
    """What the handlers of a streamed or document request share."""

    engine: Engine
    batcher: Batcher
    counting: PreTrainedTokenizerBase  # the event loop's tokenizer (the worker has its own)
    state: dict[str, int]


# The plain document formats of `POST /translate`: (text, language) -> `documents.Document`, its sentences and the
# text around them. The markup formats (html, markdown) are `serve_markup`'s.
DOCUMENT_FORMATS: dict[str, Callable[[str, str], Document]] = {"text": split_document}


def _documents(serving: _Serving, request: TranslateRequest) -> list[Document]:
    """Each document of `text` as its sentences (`DOCUMENT_FORMATS`, the sentence rules of `source_lang`, a sentence
    over the position table split at its clauses); RequestError naming the field."""
    split = DOCUMENT_FORMATS.get(request.format)
    if split is None:
        served = ", ".join(f'"{name}"' for name in ("sentences", *DOCUMENT_FORMATS))
        raise RequestError("format", f"{request.format} documents are not served yet; send {served}")
    model = serving.engine.model
    language = _language(model, request)
    count, limit = token_counter(model, serving.counting)
    documents = []
    for index, text in enumerate(request.text):
        try:
            documents.append(fit_sentences(split(text, language), count, limit))
        except SentenceTooLong as error:
            raise RequestError(f"text[{index}]", error.detail) from None
    sentences = sum(len(document.sentences) for document in documents)
    if sentences > serving.batcher.limits.max_queue:
        queue = f"max_queue {serving.batcher.limits.max_queue}"
        raise RequestError("text", f"{sentences} sentences in its documents, more than the server queues ({queue})")
    return documents


def _document_answer(documents: list[Document], found: list[list[Found]]) -> dict[str, Any]:
    """`DocumentResponse`: each document joined again around its sentences' translations."""
    translations, start = [], 0
    for document in documents:
        count = len(document.sentences)
        texts = [hypotheses[0].text for hypotheses in found[start : start + count]]
        translations.append({"text": document.join(texts), "sentences": count})
        start += count
    return {"translations": translations}


def _document_events(documents: list[Document], queue: asyncio.Queue) -> Callable[[int, Any], None]:
    """The `Batcher`'s `on_result` for the documents' queued sentences: a `sentence` event per sentence, in order (a
    document with none: one event with index -1 and its text); an event's `text` is the text before its sentence and
    its translation (the last also the text after it), so the texts concatenate to the documents' translations."""
    slots, positions = [], {}  # slots: (document, sentence index or -1); positions: queued sentence -> its slot
    for number, document in enumerate(documents):
        for index in range(len(document.sentences)):
            positions[len(positions)] = len(slots)
            slots.append((number, index))
        if not document.sentences:
            slots.append((number, -1))

    def event(slot: int, found: list[Found] | None) -> list[bytes]:
        number, index = slots[slot]
        document = documents[number]
        data = {"document": number, "index": index, "source": "", "translation": "", "text": document.gaps[0]}
        if index >= 0:
            tail = document.gaps[-1] if index == len(document.sentences) - 1 else ""
            translation = found[0].text
            text = document.gaps[index] + translation + tail
            data.update(source=document.sentences[index], translation=translation, text=text)
            data["line"] = document.lines[index]
        return [sse("sentence", data)]

    ordered = OrderedEvents(len(slots), event, queue, waiting=lambda slot: slots[slot][1] >= 0)
    return lambda queued, found: ordered.on_result(positions[queued], found)


async def _translate_documents(serving: _Serving, request: TranslateRequest) -> Any:
    """`POST /translate` with a document format: its documents' sentences queued as one request (ramping when
    streamed), the answer `DocumentResponse` (streamed: `sentence` events, then `done` with it)."""
    try:
        documents, (key, group) = _documents(serving, request), _group_for(serving.engine, request)
    except RequestError as error:
        serving.state["requests"] += 1
        return JSONResponse({"error": str(error)}, status_code=422)
    sentences = [sentence for document in documents for sentence in document.sentences]
    queue: asyncio.Queue = asyncio.Queue()
    stream = {"on_result": _document_events(documents, queue), "ramp": 1} if request.stream else {}

    def prepare() -> tuple[list, list[int], tuple, Group, dict[str, Any]]:
        tokens = _token_counts(serving.counting, serving.engine.model, sentences)
        return sentences, tokens, key, group, {"stream": stream}

    if not sentences:  # nothing to translate: the documents as they are
        serving.state["requests"] += 1
        future = asyncio.get_running_loop().create_future()
        future.set_result([])
    else:
        future = _submitted(serving.batcher, serving.state, "text", sentences, prepare)
    if isinstance(future, Response):
        return future
    if request.stream:
        return event_stream(future, queue, lambda found: _document_answer(documents, found), serving.state)
    found = await _awaited(serving.state, future)
    if isinstance(found, Response):
        return found
    return Response(to_json(_document_answer(documents, found)), media_type="application/json")


async def _translate_markup(serving: _Serving, request: TranslateRequest) -> Any:
    """`POST /translate` with `"format": "html"` or `"markdown"`: `serve_markup`, with the request's batching groups
    without and (where the engine aligns words) with word alignments."""
    try:
        plain = _group_for(serving.engine, request)
        words = request.alignment_words or "whitespace"
        aligning = request.model_copy(update={"alignment": "hard", "alignment_words": words})
        can_align = serving.engine.refusal(plain[1].options, alignments=True) is None
        groups = {False: plain, True: _group_for(serving.engine, aligning) if can_align else None}
    except RequestError as error:
        serving.state["requests"] += 1
        return JSONResponse({"error": str(error)}, status_code=422)
    return await translate_markup_request(serving, request, groups, _language(serving.engine.model, request))


def _language(model: PreTrainedModel, request: TranslateRequest) -> str:
    """A document's sentence rules: `source_lang`, the model's `config.source_lang`, else English rules (`attn
    translate --document` warns; a server has nobody to warn)."""
    return request.source_lang or getattr(model.config, "source_lang", None) or FALLBACK_LANGUAGE


def _token_streamed(engine: Engine, request: TranslateRequest) -> bool:
    """Whether a streamed request's translation comes a token at a time: one sentence, one hypothesis, no
    alignment or constraints, on an engine that streams tokens with its options (greedy search or sampling)."""
    if len(request.text) != 1 or request.num_return_sequences > 1 or request.alignment or request.constraints:
        return False
    prefix = {"target_prefix": request.prefix} if request.prefix is not None else {}
    return engine.can_stream({**generation_overrides(request), **prefix})


def _stream_sentences(serving: _Serving, request: TranslateRequest) -> Response:
    """`POST /translate` with `stream`: `token` events (`_token_streamed`: the sentence a group of its own, decoded
    alone), else a `sentence` event per sentence as its batch is done (ramping); then `done` with the answer."""
    queue: asyncio.Queue = asyncio.Queue()
    by_token = _token_streamed(serving.engine, request)
    if by_token:
        stream = {"on_text": lambda piece: queue.put_nowait(sse("token", {"index": 0, "text": piece}))}
    else:

        def event(index: int, found: list[Found]) -> list[bytes]:
            text, source = found[0].text, request.text[index]
            return [sse("sentence", {"index": index, "source": source, "translation": text, "text": text})]

        stream = {"on_result": OrderedEvents(len(request.text), event, queue).on_result, "ramp": 1}

    def prepare() -> tuple[list, list[int], tuple, Group, dict[str, Any]]:
        sentences, tokens, key, group, own = _sentences(serving.engine, serving.counting, request)
        if by_token:
            key, group.streamed = (*key, ("stream", object())), True  # alone: nothing may join it
        return sentences, tokens, key, group, {**own, "stream": stream}

    future = _submitted(serving.batcher, serving.state, "text", request.text, prepare)
    if isinstance(future, Response):
        return future
    nbest, unmet = request.num_return_sequences > 1, _unmet_of(serving.counting, request)
    done = lambda found: _answer(found, nbest, request.alignment, unmet).body  # noqa: E731
    return event_stream(future, queue, done, serving.state)


def _unmet_of(tokenizer: PreTrainedTokenizerBase, request: TranslateRequest) -> Callable | None:
    """`_answer`'s `unmet` for the request's `constraints` (None: the request has none)."""
    constraints = request.constraints
    if constraints is None:
        return None

    def unmet(row: int, text: str) -> list[str]:
        return missing_phrases(tokenizer, text, constraints[row]) if constraints[row] else []

    return unmet


def create_app(
    model: PreTrainedModel | Engine,
    tokenizer: PreTrainedTokenizerBase | None = None,
    limits: ServeLimits | None = None,
    info: dict[str, Any] | None = None,
) -> FastAPI:
    """The server's application for a loaded model with its tokenizer, or an engine (`engines.py`; tokenizer None)
    (see the module docstring). `info`: what `GET /model` answers (default: `describe_model(model, "")`, with the
    engine); the worker thread runs between the application's startup and shutdown."""
    engine = as_engine(model, tokenizer)
    model, tokenizer = engine.model, engine.tokenizer
    limits = limits or ServeLimits()
    info = {**(info or describe_model(model, "")), "limits": asdict(limits)}
    info.setdefault("engine", engine.describe())
    batcher = Batcher(engine, None, limits)
    counting = copy.deepcopy(tokenizer)  # the worker's pads and truncates: a Rust tokenizer each
    state = {"requests": 0, "in_flight": 0, "refused_full": 0}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        await asyncio.to_thread(batcher.close)  # translate what is still queued

    app = FastAPI(
        title="attn serve",
        summary=f"Translation with {info.get('model_type')} ({info.get('model')})",
        lifespan=lifespan,
    )
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(BodyChecks, limit=limits.max_body_bytes)
    app.state.batcher = batcher

    serving = _Serving(engine, batcher, counting, state)

    @app.post("/translate", response_model=TranslateResponse | DocumentResponse, response_model_exclude_unset=True)
    async def translate(request: TranslateRequest) -> Any:
        """Translate `text` (in order) with the options of `attn translate`; see the module docstring."""
        if request.format != "sentences":
            markup = request.format in MARKUP_FORMATS
            return await (_translate_markup if markup else _translate_documents)(serving, request)
        if request.stream:
            return _stream_sentences(serving, request)
        prepare = functools.partial(_sentences, engine, counting, request)
        found, nbest = await _queued(batcher, state, "text", request.text, prepare), request.num_return_sequences > 1
        unmet = _unmet_of(counting, request)
        return found if isinstance(found, Response) else _answer(found, nbest, request.alignment, unmet)

    @app.post("/score", response_model=ScoreResponse, response_model_exclude_unset=True)
    async def score(request: ScoreRequest) -> Any:
        """The log-probability of each `target` given its `source` (`attn score`), batched with other pairs."""

        def prepare() -> tuple[list, list[int], tuple, Group, dict[str, Any]]:
            tokens = _pair_counts(counting, model, request)
            pairs = list(zip(request.source, request.target, strict=True))
            return pairs, tokens, ("score",), Group({}, 1, 1, None, scoring=True), {}

        found = await _queued(batcher, state, "source", request.source, prepare)
        return found if isinstance(found, Response) else _scores_answer(found, request.tokens)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """The server is up; its queue and counts."""
        return {
            "status": "ok",
            "waiting_sentences": batcher.waiting,
            "requests_in_flight": state["in_flight"],
            "requests": state["requests"],
            "refused_queue_full": state["refused_full"],
            "batches": batcher.batches,
            "sentences_translated": batcher.sentences_translated,
        }

    @app.get("/model")
    async def model_card() -> dict[str, Any]:
        """What the model card says: model type, size, languages, scores, decoding; the quantization and limits."""
        return info

    return app


__all__ = ["RequestError", "create_app"]
