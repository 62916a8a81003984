"""A translation server over HTTP: `create_app(model, tokenizer, ...)` builds a FastAPI application.

`Batcher` packs the sentences of concurrent requests into token batches for one worker thread; `attn serve`
(`cli/serve.py`) runs it with uvicorn. docs/serve.md describes each part:
- endpoints: `POST /translate` (the decoding options of `attn translate`, n-best lists, word alignments),
  `GET /health`, `GET /model`, `GET /docs` and `GET /openapi.json`;
- batching: each sentence is queued under its decoding options; the worker translates the group whose oldest
  sentence has waited longest, up to `max_batch_tokens` or after `max_wait_ms`. Batching does not change a
  translation (the models are padding-invariant); a sampling request with a `seed` is never merged with another;
- refusals, each with a JSON body `{"error": "<field>: <what is wrong>"}` naming the field (400, 413, 422, and 503
  with `Retry-After` for a full queue); a failure inside generate() answers 500 for that batch and the worker goes on;
- shutdown: on SIGTERM the requests in flight and the sentences still queued are finished (`Batcher.close`).
The Transformer's attention weights need the eager attention, so the worker switches the model to it for the
batches that align and back after.
"""

from __future__ import annotations

import asyncio
import copy
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers import PreTrainedModel, PreTrainedTokenizerBase, set_seed

from ..registry import MODEL_TYPES
from .alignment import AlignedTranslation, translate_aligned_nbest
from .ensemble import AttnEnsemble, describe_ensemble
from .errors import UserError
from .hub import (
    RESULTS_FILE,
    _describe_alignments,
    _describe_generation,
    _describe_size,
    decoding_settings,
    model_origin,
    read_results,
)
from .translation import (
    Hypothesis,
    TranslateError,
    check_nbest,
    eager_attention,
    generation_overrides,
    translate_nbest,
)

SAMPLING_BATCH = 32  # sentences per generate() call of a seeded sampling request: `attn translate`'s --batch_size


@dataclass(frozen=True)
class ServeLimits:
    """How the server batches and what it refuses (the flags of `attn serve`)."""

    max_batch_tokens: int = 8192  # rows generate() decodes per call: sentences x longest x beams
    max_wait_ms: float = 10.0  # the longest a sentence waits for others to join its batch
    max_queue: int = 1024  # sentences waiting; a request that does not fit answers 503
    max_body_bytes: int = 1 << 20  # a larger request body answers 413

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_queue", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be 0 or more, got {self.max_wait_ms}")


# -- requests and answers ----------------------------------------------------------------------------------------


class TranslateRequest(BaseModel):
    """The body of `POST /translate`: the sentences and the options of `attn translate`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: list[str] = Field(min_length=1, description="Sentences to translate, answered in this order.")
    num_beams: int | None = Field(None, ge=1, description="Beam size (default: the model's generation_config).")
    length_penalty: float | None = Field(None, description="Beam search length penalty (default: the model's).")
    max_new_tokens: int | None = Field(None, ge=1, description="Longest translation in tokens (default: the model's).")
    num_return_sequences: int = Field(1, ge=1, description="Hypotheses per sentence (n-best, in `nbest`).")
    do_sample: bool = Field(False, description="Sample instead of searching (one beam unless num_beams is given).")
    top_k: int | None = Field(None, ge=1, description="Sample from the k most likely tokens.")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling: the smallest set with mass p.")
    temperature: float | None = Field(None, gt=0, description="Divide the logits by this before sampling.")
    seed: int | None = Field(None, ge=0, lt=2**32, description="Random seed: the same seed gives the same samples.")
    alignment: Literal["hard", "soft"] | None = Field(
        None,
        description="Word alignments with each translation (`attn translate --align`): hard, Pharaoh pairs "
        "[[source word, target word], ...]; soft, the words and the weights.",
    )
    alignment_words: Literal["whitespace", "alnum"] | None = Field(
        None, description="What a word is for the alignment (`--align_words`; default whitespace)."
    )

    @model_validator(mode="after")
    def _settings_need_their_switch(self) -> TranslateRequest:
        given = [name for name in ("top_k", "top_p", "temperature", "seed") if getattr(self, name) is not None]
        if given and not self.do_sample:
            raise ValueError(f'{", ".join(given)}: a sampling setting, with no do_sample; add "do_sample": true')
        if self.alignment_words is not None and self.alignment is None:
            raise ValueError('alignment_words: an alignment setting, with no alignment; add "alignment": "hard"')
        return self


class SoftAlignment(BaseModel):
    """`attn translate --align --align_format soft`'s line without the translation.

    `weights[j][i]` is the weight of target word j on source word i.
    """

    source_words: list[str]
    target_words: list[str]
    weights: list[list[float]]


class ScoredText(BaseModel):
    text: str
    score: float | None = Field(description="log-probability / length ** length_penalty; null for an empty sentence")
    alignment: list[tuple[int, int]] | SoftAlignment | None = Field(
        None,
        description='With "alignment": hard, [[source word, target word], ...] in target order; soft, the '
        "words and the weights.",
    )


class Translation(ScoredText):
    nbest: list[ScoredText] | None = Field(None, description="With num_return_sequences > 1: all, best first.")


class TranslateResponse(BaseModel):
    translations: list[Translation]


class RequestError(UserError, ValueError):
    """A request the model cannot serve (422); `field` is the request's field it names."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class QueueFull(RuntimeError):
    """The queue cannot take a request's sentences now (503)."""


# -- the batching queue --------------------------------------------------------------------------------------------

Found = Hypothesis | AlignedTranslation  # a hypothesis: text and score, with its word alignment when asked for


def _translate_group(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str], group: _Group
) -> list[list[Found]]:
    """One generate() call on `texts` with the group's options: `translate_nbest`, or `translate_aligned_nbest`
    (the same hypotheses and scores, each with its word alignment) when the group asks for alignments."""
    if group.alignment_words is None:
        return translate_nbest(model, tokenizer, texts, group.num_return_sequences, **group.options)
    with eager_attention(model):
        return translate_aligned_nbest(
            model, tokenizer, texts, group.num_return_sequences, words=group.alignment_words, **group.options
        )


@dataclass
class _Job:
    """One request: its answers, filled in by the worker, and the future its handler awaits."""

    results: list[list[Found] | None]
    remaining: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class _Sentence:
    job: _Job
    index: int  # in the request's `text`
    text: str
    tokens: int  # its length in tokens, end-of-sentence included
    arrived: float


@dataclass
class _Group:
    """Queued sentences with the same decoding options."""

    options: dict[str, Any]  # generate() keyword arguments
    num_return_sequences: int
    beams: int
    seed: int | None
    alignment_words: str | None = None  # with word alignments, over these words (`alignment.split_words`)
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

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, limits: ServeLimits):
        self.model, self.tokenizer, self.limits = model, tokenizer, limits
        self._groups: dict[tuple, _Group] = {}
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
        self, sentences: list[str], tokens: list[int], key: tuple, group: _Group, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future:
        """Queue a request's sentences (all or none) under `key`; a future of their hypotheses in input order."""
        job = _Job([None] * len(sentences), len(sentences), loop.create_future(), loop)
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
            for index, (text, count) in enumerate(zip(sentences, tokens, strict=True)):
                queued.sentences.append(_Sentence(job, index, text, count, now))
            self._waiting += len(sentences)
            self._condition.notify_all()
        return job.future

    def _cost(self, sentences: list[_Sentence], group: _Group) -> int:
        return len(sentences) * max(sentence.tokens for sentence in sentences) * group.beams

    def _full(self, group: _Group) -> bool:
        return self._cost(list(group.sentences), group) >= self.limits.max_batch_tokens

    def _next_batch(self) -> tuple[_Group, list[_Sentence]] | None:
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
            while group.seed is None and not self._closing and not self._full(group):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._condition.wait(remaining)
            if group.seed is not None:  # a seeded sampling request: alone, whole
                batch = list(group.sentences)
                group.sentences.clear()
            else:
                batch = [group.sentences.popleft()]
                while (
                    group.sentences and self._cost([*batch, group.sentences[0]], group) <= self.limits.max_batch_tokens
                ):
                    batch.append(group.sentences.popleft())
            if not group.sentences:
                del self._groups[key]
            self._waiting -= len(batch)
            return group, batch

    def _translate(self, group: _Group, batch: list[_Sentence]) -> list[list[Found]]:
        texts = [sentence.text for sentence in batch]
        if group.seed is None:
            return _translate_group(self.model, self.tokenizer, texts, group)
        set_seed(group.seed)  # as `attn translate --seed`: once, then the chunks in order
        hypotheses: list[list[Found]] = []
        for start in range(0, len(texts), SAMPLING_BATCH):
            hypotheses += _translate_group(self.model, self.tokenizer, texts[start : start + SAMPLING_BATCH], group)
        return hypotheses

    def _run(self) -> None:
        while (taken := self._next_batch()) is not None:
            group, batch = taken
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
                if job.remaining == 0:
                    job.loop.call_soon_threadsafe(_settle, job, job.results)


# -- what GET /model says ----------------------------------------------------------------------------------------


def describe_model(model: PreTrainedModel, model_dir: str | Path, quantization: str | None = None) -> dict[str, Any]:
    """What the model card says of `model` (loaded from `model_dir`, before any quantization: the parameter count
    is the float model's), with the languages and scores of the folder's `test_results.json` when it has one."""
    folder = Path(model_dir)
    ensemble = describe_ensemble(model) if isinstance(model, AttnEnsemble) else None
    # an ensemble's scores are not those of the folder's model
    results = read_results(folder / RESULTS_FILE) if (folder / RESULTS_FILE).is_file() and not ensemble else None
    _, origin = model_origin(folder) if folder.is_dir() else (None, None)
    languages = None
    if results and results.get("source_lang") and results.get("target_lang"):
        languages = {"source": results["source_lang"], "target": results["target_lang"]}
    scores = None
    if results:
        scores = {name: results.get(name) for name in ("bleu", "chrf", "bleu_signature", "data", "split", "sentences")}
    model_type = model.config.model_type
    return {
        "model": str(model_dir),
        "model_type": model_type,
        "architecture": MODEL_TYPES[model_type].describe if model_type in MODEL_TYPES else None,
        "parameters": model.num_parameters(),
        "size": _describe_size(model),
        "languages": languages,
        "results": scores,
        "decoding": _describe_generation(model.generation_config),
        "generation": decoding_settings(model.generation_config),
        "max_position_embeddings": getattr(model.config, "max_position_embeddings", None),
        "alignment": alignment_setting(model),
        "origin": origin,
        "ensemble": ensemble,
        "quantization": quantization,
        "device": str(model.device),
    }


def alignment_setting(model: PreTrainedModel) -> dict[str, Any] | None:
    """Where `"alignment"` reads word alignments from (`encoder_decoder.alignment_attention`): the Transformer's
    `alignment_layer` and `alignment_heads` (as in config.json; 0 heads: all), the RNN's alpha; None for a model type
    this project does not know. An ensemble: the average of its members' (`alignment.forced_attention`), each
    member's setting listed with its weight."""
    if isinstance(model, AttnEnsemble):
        return {
            "attention": "the members' alignment attention averaged with the ensemble's weights",
            "members": [
                {**(alignment_setting(member) or {}), "weight": round(weight, 6)}
                for member, weight in zip(model.members, model.weights, strict=True)
            ],
        }
    config = model.config
    if config.model_type not in MODEL_TYPES:
        return None
    setting: dict[str, Any] = {"attention": _describe_alignments(config)}
    if hasattr(config, "alignment_layer"):
        setting.update(alignment_layer=config.alignment_layer, alignment_heads=config.alignment_heads)
    return setting


# -- the application -----------------------------------------------------------------------------------------------


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
            message = 'a JSON object such as {"text": ["..."]} is required (content-type: application/json)'
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


def _group_for(model: PreTrainedModel, request: TranslateRequest) -> tuple[tuple, _Group]:
    """The decoding options of a request as a batching key and group; RequestError for options generate() cannot
    honour with this model (checked before queueing)."""
    options = generation_overrides(request)
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
    seeded = request.do_sample and request.seed is not None
    # Sentences with and without alignments (or with other definitions of a word) never share a generate() call;
    # hard and soft do: they are two writings of the same alignment (`_answer`).
    words = (request.alignment_words or "whitespace") if request.alignment else None
    key = (tuple(sorted(options.items())), request.num_return_sequences, words, ("seed", object()) if seeded else None)
    group = _Group(options, request.num_return_sequences, beams, request.seed if seeded else None, words)
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


def _answer(hypotheses: list[list[Found]], nbest: bool, alignment: str | None = None) -> TranslateResponse:
    def scored(hypothesis: Found) -> dict[str, Any]:
        found = {"text": hypothesis.text, "score": None if math.isnan(hypothesis.score) else hypothesis.score}
        if alignment == "hard":
            found["alignment"] = hypothesis.alignment.pairs
        elif alignment == "soft":
            found["alignment"] = SoftAlignment(**hypothesis.alignment.soft())
        return found

    translations = []
    for found in hypotheses:  # `nbest` only when asked for: the response leaves out fields never set
        extra = {"nbest": [ScoredText(**scored(hypothesis)) for hypothesis in found]} if nbest else {}
        translations.append(Translation(**scored(found[0]), **extra))
    return TranslateResponse(translations=translations)


def create_app(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    limits: ServeLimits | None = None,
    info: dict[str, Any] | None = None,
) -> FastAPI:
    """The server's application for a loaded model (see the module docstring). `info`: what `GET /model` answers
    (default: `describe_model(model, "")`); the worker thread runs between the application's startup and shutdown."""
    limits = limits or ServeLimits()
    info = {**(info or describe_model(model, "")), "limits": asdict(limits)}
    batcher = Batcher(model, tokenizer, limits)
    counting_tokenizer = copy.deepcopy(tokenizer)  # the worker's pads and truncates: a Rust tokenizer each
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

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_unset=True)
    async def translate(request: TranslateRequest) -> Any:
        """Translate `text` (in order) with the options of `attn translate`; see the module docstring."""
        state["requests"] += 1
        try:
            if len(request.text) > limits.max_queue:
                raise RequestError(
                    "text",
                    f"{len(request.text)} sentences, more than the server queues (max_queue {limits.max_queue})",
                )
            key, group = _group_for(model, request)
            tokens = _token_counts(counting_tokenizer, model, request.text)
            future = batcher.submit(request.text, tokens, key, group, asyncio.get_running_loop())
        except RequestError as error:
            return JSONResponse({"error": str(error)}, status_code=422)
        except QueueFull as error:
            state["refused_full"] += 1
            return JSONResponse({"error": str(error)}, status_code=503, headers={"Retry-After": "1"})
        state["in_flight"] += 1
        try:
            hypotheses = await future
        except RuntimeError as error:
            return JSONResponse({"error": str(error)}, status_code=500)
        finally:
            state["in_flight"] -= 1
        return _answer(hypotheses, request.num_return_sequences > 1, request.alignment)

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


__all__ = [
    "Batcher",
    "QueueFull",
    "RequestError",
    "ServeLimits",
    "SoftAlignment",
    "TranslateRequest",
    "TranslateResponse",
    "alignment_setting",
    "create_app",
    "describe_model",
    "eager_attention",
]
