"""`attn serve`'s documents and Server-Sent Events (issue 58; modeling_attn/api/serve_stream.py and server.py).

References: `translate_document` on the same engine (a document request's answer, and the concatenation of its
streamed `sentence` events), the non-streamed answer of the same request (a token stream's `token` events concatenate
to its text, `done` carries it), the refusals' JSON. On FastAPI's TestClient for the torch and CTranslate2 engines;
the slow tests run a real `attn serve` process: a streamed request on a full queue is refused (503) like any other.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from tasks import one_thread
from test_engines import SENTENCES
from test_serve import BODY_LIMIT, free_port, server  # noqa: F401 (free_port: server's)

from modeling_attn.api.batching import Batcher, Group, ServeLimits
from modeling_attn.api.documents import translate_document
from modeling_attn.api.engines import TorchEngine, load_translator
from modeling_attn.api.translation import Hypothesis

httpx = pytest.importorskip("httpx", reason="the server tests' client is httpx (the test extra)")
pytest.importorskip("fastapi", reason="the serve extra's fastapi is not installed")

DOCUMENTS = ["a b c\nd e f g\n\nh i\nj k l m\n  b a  ", "  \n", "m l k"]


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module", params=["torch", "ctranslate2"])
def served(request, reverser_dir):
    """(TestClient, engine) of an app on the reverser with the named engine, 64 sentences at most queued."""
    from fastapi.testclient import TestClient

    from modeling_attn.api.server import create_app

    engine = load_translator(str(reverser_dir), engine=request.param, device="cpu", threads=1)
    app = create_app(engine, None, ServeLimits(max_queue=64, max_body_bytes=BODY_LIMIT))
    with TestClient(app) as client:
        yield client, engine


def events(body: str) -> list[tuple[str, dict]]:
    """The (name, data) of each Server-Sent Event of a body."""
    found = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        found.append((lines["event"], json.loads(lines["data"])))
    return found


def same_answer(found: dict, expected: dict) -> bool:
    """The same translations, scores equal within float noise (batches of other sizes: a streamed request's ramp)."""

    def entries(answer: dict) -> list[tuple[str, float | None]]:
        translations = answer["translations"]
        nbest = [hypothesis for entry in translations for hypothesis in entry.get("nbest", [])]
        return [(entry["text"], entry["score"]) for entry in [*translations, *nbest]]

    pairs = list(zip(entries(found), entries(expected), strict=True))
    return all(text == other and score == pytest.approx(score_, abs=1e-5) for (text, score), (other, score_) in pairs)


def streamed(client, body: dict) -> list[tuple[str, dict]]:
    with client.stream("POST", "/translate", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return events(response.read().decode())


def test_a_document_request_answers_each_document_translated_with_its_layout(served):
    client, engine = served
    response = client.post("/translate", json={"text": DOCUMENTS, "format": "text", "source_lang": "en"})
    assert response.status_code == 200, response.text
    expected = [translate_document(engine, document, source_lang="en") for document in DOCUMENTS]
    assert [entry["text"] for entry in response.json()["translations"]] == expected
    assert [entry["sentences"] for entry in response.json()["translations"]] == [5, 0, 1]


def test_a_streamed_document_sends_its_sentences_in_order_then_done(served):
    client, _ = served
    body = {"text": DOCUMENTS, "format": "text", "source_lang": "en"}
    answer = client.post("/translate", json=body).json()
    found = streamed(client, body)
    assert [name for name, _ in found] == ["sentence"] * 7 + ["done"]
    assert [(data["document"], data["index"]) for _, data in found[:-1]] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (1, -1),
        (2, 0),
    ]
    for number, entry in enumerate(answer["translations"]):
        assert "".join(data["text"] for _, data in found[:-1] if data["document"] == number) == entry["text"]
    assert found[-1][1] == answer
    first = found[0][1]
    assert (first["source"], first["line"], first["text"]) == ("a b c", 1, first["translation"])
    empty = {"text": [" \n "], "format": "text", "num_beams": 1}  # nothing to translate: no queue, the text back
    expected = {"translations": [{"text": " \n ", "sentences": 0}]}
    assert client.post("/translate", json=empty).json() == expected
    only = [(name, data.get("index"), data.get("text")) for name, data in streamed(client, empty)]
    assert only[0] == ("sentence", -1, " \n ") and only[1] == ("done", None, None)


def test_a_streamed_sentence_sends_its_tokens_then_the_non_streamed_answer(served):
    client, _ = served
    for sentence in SENTENCES[:6]:
        body = {"text": [sentence], "num_beams": 1}
        answer = client.post("/translate", json=body).json()
        found = streamed(client, body)
        assert {name for name, _ in found[:-1]} == {"token"} and found[-1][0] == "done"
        assert "".join(data["text"] for _, data in found[:-1]) == answer["translations"][0]["text"]
        assert len(found) - 1 == len(answer["translations"][0]["text"].split())  # a token (a letter) an event
        assert same_answer(found[-1][1], answer)


def test_a_seeded_sampled_sentence_streams_its_tokens_then_the_non_streamed_sample(served):
    client, _ = served
    body = {"text": [SENTENCES[7]], "do_sample": True, "top_k": 4, "temperature": 2.0, "seed": 11}
    answer = client.post("/translate", json=body).json()
    found = streamed(client, body)
    assert "".join(data["text"] for name, data in found if name == "token") == answer["translations"][0]["text"]
    assert found[-1][1]["translations"][0]["text"] == answer["translations"][0]["text"]


def test_beam_search_streams_each_sentence_as_its_batch_is_done(served):
    client, _ = served
    body = {"text": SENTENCES[:5], "num_return_sequences": 2}
    answer = client.post("/translate", json=body).json()
    found = streamed(client, body)
    expected = [("sentence", index) for index in range(5)] + [("done", None)]
    assert [(name, data.get("index")) for name, data in found] == expected
    assert [data["text"] for _, data in found[:-1]] == [entry["text"] for entry in answer["translations"]]
    assert same_answer(found[-1][1], answer)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"text": ["<p>a</p>", "<p>a\n<b>b</p>"], "format": "html"}, 422, "text[1]: line 2: <b> is not closed"),
        ({"text": ["<p>b</b>"], "format": "html", "stream": True}, 422, "text[0]: line 1: </b> closes no open <b>"),
        ({"text": ["<p>a</p>"], "format": "html", "alignment": "hard"}, 422, "alignment: applies to one sentence"),
        ({"text": ["a"], "alignment_words": "alnum"}, 422, "alignment_words: an alignment setting, with no alignme"),
        ({"text": ["a"], "format": "pdf"}, 422, "format: Input should be 'sentences', 'text', 'html' or 'markdown'"),
        ({"text": ["a"], "stream": "yes"}, 422, "stream: Input should be a valid boolean"),
        ({"text": ["a"], "format": "text", "prefix": ["b"]}, 422, "prefix: applies to one sentence, not to a docum"),
        ({"text": ["a"], "format": "text", "alignment": "hard"}, 422, "alignment: applies to one sentence"),
        ({"text": ["a"], "format": "text", "constraints": [["b"]]}, 422, "constraints: applies to one sentence"),
        ({"text": ["a"], "format": "text", "num_beams": 2, "num_return_sequences": 2}, 422, "num_return_sequences:"),
        ({"text": [" "], "format": "text", "num_return_sequences": 3}, 422, "num_return_sequences: applies"),
        ({"text": [" "], "format": "text", "max_new_tokens": 100}, 422, "max_new_tokens: 100 is more than"),
        ({"text": ["a"], "source_lang": "de"}, 422, 'source_lang: a document\'s language; add "format": "text"'),
        ({"text": ["a", "b " * 40], "format": "text"}, 422, "text[1]: line 1: the sentence 'b b b b"),
        ({"text": ["a\n" * 65], "format": "text", "stream": True}, 422, "text: 65 sentences in its documents, more"),
        ({"text": ["a b. " * 2000], "format": "text"}, 413, "body: 10"),
    ],
)
def test_a_bad_document_or_stream_request_is_refused_naming_the_field(served, body, status, message):
    client, _ = served
    response = client.post("/translate", json=body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"].startswith(message), response.json()


def test_a_failure_mid_stream_is_an_error_event_with_the_error_body(served):
    client, engine = served
    calls = []
    translate_nbest = engine.translate_nbest

    def failing(sentences, n=1, **options):
        calls.append(len(sentences))
        if len(calls) == 2:
            raise ValueError("out of luck")
        return translate_nbest(sentences, n, **options)

    engine.translate_nbest = failing
    try:
        found = streamed(client, {"text": [DOCUMENTS[0]], "format": "text", "source_lang": "en"})
    finally:
        del engine.translate_nbest
    assert calls[:2] == [1, 2]  # the batches ramp: one sentence, then two
    assert [name for name, _ in found] == ["sentence", "error"]
    assert found[1][1] == {"error": "translation failed: ValueError: out of luck"}
    assert client.get("/health").json()["requests_in_flight"] == 0


@pytest.mark.slow
def test_over_http_a_streamed_request_on_a_full_queue_is_refused_and_streams_once_there_is_room(reverser_dir):
    with one_thread(), server(reverser_dir, "--max_queue", "4", "--max_wait_ms", "3000") as (url, _, _):
        first = {}
        body = {"text": SENTENCES[:3]}
        waiting = threading.Thread(target=lambda: first.update(response=httpx.post(f"{url}/translate", json=body)))
        waiting.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").json()["waiting_sentences"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        document = {"text": ["a b\nc d"], "format": "text", "source_lang": "en", "stream": True}
        refused = httpx.post(f"{url}/translate", json=document, timeout=60)  # 3 + 2 > 4
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"].startswith("the queue is full (3 sentences waiting, max_queue 4")
        waiting.join()
        assert first["response"].status_code == 200
        with httpx.stream("POST", f"{url}/translate", json=document, timeout=60) as response:
            found = events(response.read().decode())
        answer = httpx.post(f"{url}/translate", json={**document, "stream": False}, timeout=60).json()
        assert [name for name, _ in found] == ["sentence", "sentence", "done"]
        assert "".join(data["text"] for _, data in found[:-1]) == answer["translations"][0]["text"]
        token = {"text": [SENTENCES[4]], "num_beams": 1}
        with httpx.stream("POST", f"{url}/translate", json={**token, "stream": True}, timeout=60) as response:
            found = events(response.read().decode())
        text = httpx.post(f"{url}/translate", json=token, timeout=60).json()["translations"][0]["text"]
        assert "".join(data["text"] for name, data in found if name == "token") == text
        assert httpx.get(f"{url}/health").json()["refused_queue_full"] == 1


class RecordingEngine(TorchEngine):
    """An engine that translates a sentence as itself and records the batches it is given."""

    def __init__(self):
        super().__init__(None, None)
        self.batches = []

    def translate_nbest(self, sentences, n=1, **options):
        self.batches.append(list(sentences))
        return [[Hypothesis(sentence, 0.0)] for sentence in sentences]


def test_the_sentences_of_a_cancelled_request_are_dropped_when_their_turn_comes():
    recording = RecordingEngine()
    batcher = Batcher(recording, None, ServeLimits())

    async def run() -> list:
        loop = asyncio.get_running_loop()
        left = batcher.submit(["a", "b"], [2, 2], ("key",), Group({}, 1, 1, None), loop, stream={"ramp": 1})
        kept = batcher.submit(["c"], [2], ("key",), Group({}, 1, 1, None), loop)
        left.cancel()  # its client has gone
        batcher.start()
        try:
            return await asyncio.wait_for(kept, 30)
        finally:
            await asyncio.to_thread(batcher.close)

    assert [found[0].text for found in asyncio.run(run())] == ["c"]
    assert recording.batches == [["c"]]


MARKED_UP = {
    "html": '<h1>a b</h1>\n<p>c <b>d e</b> f. <a href="/g h">g h</a> i?</p>\n<pre>j k</pre>\n<img alt="l m">\n',
    "markdown": "# a b\n\nc **d e** f. [g h](/g_h) i?\n\n```\nj k\n```\n\n- l m\n",
}


@pytest.mark.parametrize("format", ["html", "markdown"])
def test_a_marked_up_document_is_answered_as_translate_markup_translates_it(served, format):
    from modeling_attn.api.markup import translate_markup

    client, engine = served
    expected = translate_markup(engine, MARKED_UP[format], format, source_lang="en")
    body = {"text": [MARKED_UP[format], "  "], "format": format, "source_lang": "en"}
    answer = client.post("/translate", json=body).json()
    assert [entry["text"] for entry in answer["translations"]] == [expected, "  "]
    # the heading, the paragraph (one sentence: sentencex reads "f. g" as no sentence end), the alt text or list item
    assert answer["translations"][0]["sentences"] == 3 and answer["translations"][1]["sentences"] == 0
    found = streamed(client, body)
    assert [name for name, _ in found] == ["block"] * (len(found) - 1) + ["done"]
    assert "".join(data["text"] for name, data in found if data.get("document") == 0) == expected
    assert found[-1][1] == answer


def test_a_marked_up_document_over_the_queue_is_refused_naming_the_field(reverser_dir):
    """Its sentences are queued as every request's, a batch at a time: more than the server ever queues is refused."""
    from fastapi.testclient import TestClient

    from modeling_attn.api.server import create_app

    engine = load_translator(str(reverser_dir), engine="torch", device="cpu", threads=1)
    text = "".join(f"<p>{sentence}.</p>" for sentence in SENTENCES[:5])
    with TestClient(create_app(engine, None, ServeLimits(max_queue=4))) as client:
        for stream in (False, True):
            body = {"text": [text], "format": "html", "source_lang": "en", "stream": stream}
            response = client.post("/translate", json=body)
            assert response.status_code == 422
            assert (
                response.json()["error"]
                == "text: 5 sentences in its documents, more than the server queues (max_queue 4)"
            )
