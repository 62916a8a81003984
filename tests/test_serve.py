"""`attn serve` (modeling_attn/cli/serve.py, modeling_attn/api/server.py): a real server process on 127.0.0.1 and
real HTTP clients (httpx, in threads), on a tiny random Transformer with a BPE tokenizer saved to a tmp folder.

Reference checks: the server's answers equal `attn translate`'s on the same sentences (texts exactly, scores as
`attn translate --num_return_sequences` prints them), whatever the batching of concurrent requests; a seeded
sampling request equals `attn translate --do_sample --seed`; a sentence translated alone equals the same sentence
in a padded batch (what lets the server batch). Every refusal names its field: checked on FastAPI's TestClient
(quick) and over real HTTP (slow). The slow tests also fill the queue (503, nothing lost), send SIGTERM with
requests in flight (all answered), and run 32 concurrent clients (no lost or wrong answer).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from modeling_attn.training.tokenizer import train_bpe_tokenizer

from modeling_attn import AttnTransformerConfig, AttnTransformerForConditionalGeneration
from modeling_attn.api.translation import load_model, translate_nbest
from modeling_attn.cli.translate import main as translate_main

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

CORPUS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "die Katze saß auf der Matte",
    "ein Hund lief im Park",
    "Tuesday, March 3rd, 1987",
    "1987-03-03",
    "the 4th of July 1776",
    "1776-07-04",
]
MAX_POSITIONS = 64
BODY_LIMIT = 8000  # bytes: --max_body_bytes of the servers under test
WORDS = " ".join(CORPUS).split()


def sentences(count: int, seed: int) -> list[str]:
    """Sentences of 1-12 words of the corpus (different lengths: batches are padded)."""
    generator = random.Random(seed)
    return [" ".join(generator.choices(WORDS, k=generator.randint(1, 12))) for _ in range(count)]


def save_model(folder: Path) -> Path:
    """A random tiny Transformer (64 positions) with a BPE tokenizer, beam 2 and 6 new tokens at most."""
    tokenizer = train_bpe_tokenizer(CORPUS, vocab_size=100, min_frequency=1)
    torch.manual_seed(0)
    config = AttnTransformerConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=2, decoder_layers=2,
                                   num_heads=4, d_ff=32, dropout=0.0, max_position_embeddings=MAX_POSITIONS,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)  # fmt: skip
    model = AttnTransformerForConditionalGeneration(config)
    model.generation_config.update(max_new_tokens=6, num_beams=2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("serve-model"))


def attn_translate(model_dir: Path, lines: list[str], tmp_path: Path, capsys, *flags: str) -> list[str]:
    """What `attn translate --input FILE` prints for `lines`."""
    source = tmp_path / "source.txt"
    source.write_text("".join(f"{line}\n" for line in lines))
    capsys.readouterr()
    assert translate_main(["--model", str(model_dir), "--input", str(source), "--no_progress", *flags]) == 0
    return capsys.readouterr().out.splitlines()


def nbest_lines(translations: list[dict], offset: int = 0) -> list[tuple[int, str, float]]:
    """The server's n-best answers as `attn translate --num_return_sequences` lines (index, text, score)."""
    return [(offset + index, hypothesis["text"], hypothesis["score"])
            for index, entry in enumerate(translations) for hypothesis in entry["nbest"]]  # fmt: skip


def parse_nbest(lines: list[str]) -> list[tuple[int, str, float]]:
    rows = [line.split(" ||| ") for line in lines]
    return [(int(index), text, float(score)) for index, text, score in rows]


def same_score(served: float | None, printed: float) -> bool:
    """Equal to the 4 decimals `attn translate` prints (padding changes the last float bits); null is its nan."""
    return math.isnan(printed) if served is None else abs(served - printed) <= 6e-5


def same_nbest(served: list[tuple[int, str, float | None]], printed: list[tuple[int, str, float]]) -> bool:
    return len(served) == len(printed) and all(
        (a[0], a[1]) == (b[0], b[1]) and same_score(a[2], b[2]) for a, b in zip(served, printed, strict=True)
    )


# -- quick: the application on FastAPI's TestClient ---------------------------------------------------------------


@pytest.fixture(scope="module")
def client(model_dir):
    from fastapi.testclient import TestClient

    from modeling_attn.api.server import ServeLimits, create_app, describe_model

    model, tokenizer = load_model(str(model_dir), "cpu")
    app = create_app(model, tokenizer, ServeLimits(max_body_bytes=BODY_LIMIT), describe_model(model, model_dir))
    with TestClient(app) as test_client:
        yield test_client


# (body, status, the error message's start): each names the field that is wrong
REFUSALS = [
    ({"text": []}, 422, "text: List should have at least 1 item"),
    ({"text": "the cat"}, 422, "text: Input should be a valid list"),
    ({"text": ["the cat", 7]}, 422, "text[1]: Input should be a valid string"),
    ({}, 422, "text: Field required"),
    ({"text": ["a"], "num_beams": 0}, 422, "num_beams: Input should be greater than or equal to 1"),
    ({"text": ["a"], "num_beams": "4"}, 422, "num_beams: Input should be a valid integer"),
    ({"text": ["a"], "num_beams": 2.5}, 422, "num_beams: Input should be a valid integer"),
    ({"text": ["a"], "do_sample": "yes"}, 422, "do_sample: Input should be a valid boolean"),
    ({"text": ["a"], "top_p": 1.5}, 422, "top_p: Input should be less than or equal to 1"),
    ({"text": ["a"], "temperature": 0}, 422, "temperature: Input should be greater than 0"),
    ({"text": ["a"], "length_penalty": "long"}, 422, "length_penalty: Input should be a valid number"),
    ({"text": ["a"], "beams": 4}, 422, "beams: Extra inputs are not permitted"),
    ({"text": ["a"], "alignment": "hard"}, 422, "alignment: Extra inputs are not permitted"),
    ({"text": ["a"], "top_k": 5, "seed": 1}, 422, "top_k, seed: a sampling setting, with no do_sample"),
    ({"text": ["a"], "num_return_sequences": 3}, 422, "num_return_sequences: num_return_sequences=3 is more than "
                                                      "num_beams=2"),
    ({"text": ["a"], "max_new_tokens": 100}, 422, "max_new_tokens: 100 is more than the model's "
                                                  "max_position_embeddings=64"),
    ({"text": ["the cat", "the cat sat on the mat " * 12]}, 422, "text[1]: 98 tokens, more than the model's "
                                                               "max_position_embeddings=64; split it"),
    ({"text": ["a"] * 1025}, 422, "text: 1025 sentences, more than the server queues (max_queue 1024)"),
    ({"text": ["a" * BODY_LIMIT]}, 413, "body: 8"),  # its byte count, then "more than the server's limit of ..."
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "message"), REFUSALS)
def test_a_bad_request_is_refused_with_a_message_naming_the_field(client, body, status, message):
    response = client.post("/translate", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"].startswith(message), response.json()


@pytest.mark.parametrize(
    ("content", "content_type", "status", "message"),
    [
        (b'{"text": ["a"', "application/json", 400, "body: not valid JSON ("),
        (b"", "application/json", 422, 'body: a JSON object such as {"text": ["..."]} is required'),
        (b'["a", "b"]', "application/json", 422, 'body: a JSON object such as {"text": ["..."]} is required'),
        (b"text=a", "text/plain", 422, 'body: a JSON object such as {"text": ["..."]} is required'),
    ],
)
def test_a_body_that_is_not_a_json_object_is_refused(client, content, content_type, status, message):
    response = client.post("/translate", content=content, headers={"content-type": content_type})
    assert response.status_code == status, response.text
    assert response.json()["error"].startswith(message), response.json()


def test_health_model_and_openapi(client, model_dir):
    assert client.get("/health").json()["status"] == "ok"
    info = client.get("/model").json()
    assert (info["model_type"], info["parameters"], info["max_position_embeddings"]) == ("attn_transformer",
                                                                                        12736, MAX_POSITIONS)  # fmt: skip
    assert info["size"].startswith("0.01M parameters: 2 encoder and 2 decoder layers, d_model 16")
    assert info["decoding"].startswith("beam search with 2 beams") and info["quantization"] is None
    assert info["limits"]["max_body_bytes"] == BODY_LIMIT
    schema = client.get("/openapi.json").json()
    assert set(schema["paths"]) == {"/translate", "/health", "/model"}
    options = schema["components"]["schemas"]["TranslateRequest"]["properties"]
    assert {"text", "num_beams", "num_return_sequences", "do_sample", "seed"} <= set(options)
    assert "alignment" not in options  # not offered until the alignment API exists
    assert client.get("/docs").status_code == 200


def test_answers_equal_attn_translate_in_input_order(client, model_dir, tmp_path, capsys):
    lines = [*sentences(6, seed=1), "", *sentences(3, seed=2)]
    answer = client.post("/translate", json={"text": lines}).json()["translations"]
    assert [entry["text"] for entry in answer] == attn_translate(model_dir, lines, tmp_path, capsys)
    assert answer[6] == {"text": "", "score": None} and "nbest" not in answer[0]
    answer = client.post("/translate", json={"text": lines, "num_return_sequences": 2}).json()["translations"]
    printed = attn_translate(model_dir, lines, tmp_path, capsys, "--num_return_sequences", "2")
    assert same_nbest(nbest_lines(answer), parse_nbest(printed))
    assert [(entry["text"], entry["score"]) for entry in answer] == [
        (entry["nbest"][0]["text"], entry["nbest"][0]["score"]) for entry in answer
    ]


def test_a_seeded_sampling_request_equals_attn_translate_with_the_seed(client, model_dir, tmp_path, capsys):
    lines = sentences(40, seed=3)  # more than attn translate's batch of 32: two generate() calls, one seed
    body = {"text": lines, "do_sample": True, "seed": 11, "top_k": 20, "num_return_sequences": 2}
    answer = client.post("/translate", json=body).json()["translations"]
    printed = attn_translate(model_dir, lines, tmp_path, capsys, "--do_sample", "--seed", "11", "--top_k", "20",
                             "--num_return_sequences", "2")  # fmt: skip
    assert same_nbest(nbest_lines(answer), parse_nbest(printed))
    assert client.post("/translate", json=body).json()["translations"] == answer


def test_a_sentence_alone_translates_as_in_a_padded_batch(model_dir):
    """Padding invariance, what lets the server batch sentences of different requests."""
    model, tokenizer = load_model(str(model_dir), "cpu")
    lines = sentences(30, seed=4)
    batched = translate_nbest(model, tokenizer, lines, 2)
    alone = [translate_nbest(model, tokenizer, [line], 2)[0] for line in lines]
    assert len({hypotheses[0].text for hypotheses in batched}) > 5  # the random model does not translate all alike
    for one, many in zip(alone, batched, strict=True):
        assert [h.text for h in one] == [h.text for h in many]
        assert [h.score for h in one] == pytest.approx([h.score for h in many], abs=1e-5)


# -- slow: a real server process and real HTTP clients -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def server(model_dir: Path, *flags: str) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """`attn serve` in its own process on a free port of 127.0.0.1; (base URL, process, log file)."""
    port = free_port()
    log = model_dir.parent / f"serve-{port}.log"
    command = [sys.executable, "-m", "modeling_attn.cli.main", "serve", "--model", str(model_dir),
               "--port", str(port), "--threads", "1", *flags]  # fmt: skip
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, log.read_text()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield url, process, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def served(model_dir) -> Iterator[str]:
    with server(model_dir, "--max_body_bytes", str(BODY_LIMIT), "--max_wait_ms", "20") as (url, _, log):
        yield url, log


def post(url: str, body: dict | bytes | Iterator[bytes], **kwargs) -> httpx.Response:
    """POST /translate: a dict as JSON, bytes (or an iterator of them: chunked, no Content-Length) as they are."""
    if not isinstance(body, dict):
        return httpx.post(f"{url}/translate", content=body, timeout=120, **kwargs)
    return httpx.post(f"{url}/translate", json=body, timeout=120, **kwargs)


def in_threads(count: int, work) -> list:
    """`work(i)` for i in range(count), each in its own thread, all started together; their results in order."""
    results: list = [None] * count
    start = threading.Barrier(count)

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = work(index)
        except Exception as error:  # noqa: BLE001 (a failed client is a result the test checks)
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.slow
def test_the_server_binds_loopback_and_answers_as_attn_translate(served, model_dir, tmp_path, capsys):
    url, log = served
    assert f"Uvicorn running on {url}" in log.read_text()  # 127.0.0.1 unless --host says otherwise
    lines = sentences(48, seed=5)
    printed = attn_translate(model_dir, lines, tmp_path, capsys, "--num_return_sequences", "2")
    # 8 concurrent clients, each with a different slice: the server batches sentences of different requests.
    slices = [lines[start : start + 6] for start in range(0, 48, 6)]
    answers = in_threads(8, lambda i: post(url, {"text": slices[i], "num_return_sequences": 2}))
    served_lines = []
    for index, response in enumerate(answers):
        assert response.status_code == 200, response
        served_lines += nbest_lines(response.json()["translations"], offset=6 * index)
    assert same_nbest(served_lines, parse_nbest(printed))
    health = httpx.get(f"{url}/health").json()
    assert health["batches"] < 8, health  # some sentences of different requests shared a generate() call


@pytest.mark.slow
def test_32_concurrent_clients_lose_no_answer_and_get_none_wrong(served, model_dir, tmp_path, capsys):
    url, _ = served
    pool = sentences(64, seed=6)
    expected = dict(zip(pool, attn_translate(model_dir, pool, tmp_path, capsys), strict=True))
    greedy = dict(zip(pool, attn_translate(model_dir, pool, tmp_path, capsys, "--num_beams", "1"), strict=True))

    def client(index: int) -> list[bool]:
        generator = random.Random(index)
        checks = []
        for _ in range(8):
            lines = generator.sample(pool, generator.randint(1, 4))
            beams = generator.choice([None, 1])  # two decodings: two groups in the queue
            body = {"text": lines} if beams is None else {"text": lines, "num_beams": 1}
            response = post(url, body)
            reference = expected if beams is None else greedy
            texts = [entry["text"] for entry in response.json()["translations"]]
            checks.append(response.status_code == 200 and texts == [reference[line] for line in lines])
        return checks

    results = in_threads(32, client)
    assert all(isinstance(result, list) for result in results), [r for r in results if not isinstance(r, list)]
    assert sum(len(result) for result in results) == 256 and all(all(result) for result in results)


@pytest.mark.slow
def test_every_refusal_over_http_names_the_field(served):
    url, _ = served
    for body, status, message in REFUSALS[:-2]:
        response = post(url, body)
        assert (response.status_code, response.json()["error"][: len(message)]) == (status, message), response.text
    response = post(url, b'{"text": ["a", }', headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"].startswith("body: not valid JSON")
    big = json.dumps({"text": ["a" * BODY_LIMIT]}).encode()
    response = post(url, big, headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    assert response.json()["error"] == (
        f"body: {len(big)} bytes, more than the server's limit of {BODY_LIMIT} bytes (--max_body_bytes)"
    )

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts
        yield b'{"text": ["'
        for _ in range(BODY_LIMIT // 1000 + 1):
            yield b"a" * 1000
        yield b'"]}'

    response = post(url, chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and f"the server's limit of {BODY_LIMIT} bytes" in response.json()["error"]
    assert post(url, {"text": ["the cat"]}).status_code == 200  # still serving


@pytest.mark.slow
def test_a_full_queue_answers_503_and_loses_nothing(model_dir, tmp_path, capsys):
    lines = sentences(6, seed=7)
    expected = attn_translate(model_dir, lines, tmp_path, capsys)
    # Sentences wait 3 s for company (the budget is never full), so the first request stays queued.
    with server(model_dir, "--max_queue", "4", "--max_wait_ms", "3000") as (url, _, _):
        first = {}
        waiting = threading.Thread(target=lambda: first.update(response=post(url, {"text": lines[:3]})))
        waiting.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").json()["waiting_sentences"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        refused = post(url, {"text": lines[3:5]})  # 3 + 2 > 4
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"].startswith("the queue is full (3 sentences waiting, max_queue 4")
        waiting.join()
        assert first["response"].status_code == 200
        assert [entry["text"] for entry in first["response"].json()["translations"]] == expected[:3]
        again = post(url, {"text": lines[3:6]})  # a retry, once there is room
        assert [entry["text"] for entry in again.json()["translations"]] == expected[3:]
        # 16 clients at once on a 4-sentence queue: each is answered right or told 503, none is lost.
        responses = in_threads(16, lambda i: post(url, {"text": [lines[i % 6]]}))
        statuses = [response.status_code for response in responses]
        assert set(statuses) <= {200, 503} and 200 in statuses and 503 in statuses, statuses
        for index, response in enumerate(responses):
            if response.status_code == 200:
                assert response.json()["translations"][0]["text"] == expected[index % 6]
        health = httpx.get(f"{url}/health").json()
        assert health["refused_queue_full"] == 1 + statuses.count(503)


@pytest.mark.slow
def test_sigterm_answers_the_requests_in_flight_then_exits(model_dir, tmp_path, capsys):
    lines = sentences(8, seed=8)
    expected = attn_translate(model_dir, lines, tmp_path, capsys)
    with server(model_dir, "--max_wait_ms", "2000") as (url, process, log):
        results = {}

        def client(index: int) -> None:
            results[index] = post(url, {"text": [lines[index]]})

        threads = [threading.Thread(target=client, args=(index,)) for index in range(8)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").json()["requests_in_flight"] < 8:  # all queued, none answered yet
            assert time.monotonic() < deadline
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join()
        # uvicorn shuts down gracefully, then re-raises the signal: the process ends as killed by SIGTERM
        assert process.wait(timeout=60) == -signal.SIGTERM, log.read_text()
        assert "Application shutdown complete" in log.read_text()
        assert [results[index].status_code for index in range(8)] == [200] * 8
        assert [results[index].json()["translations"][0]["text"] for index in range(8)] == expected
        with pytest.raises(httpx.ConnectError):  # no longer listening
            httpx.get(f"{url}/health", timeout=5)


@pytest.mark.slow
def test_serve_refuses_quantize_on_a_gpu_and_a_bad_flag_in_one_line(model_dir):
    environment = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for flags, message in [
        (["--device", "cuda", "--quantize", "int8"], "attn serve: error: --quantize int8 runs on the CPU only"),
        (["--max_wait_ms", "-1"], "attn serve: error: argument --max_wait_ms: must be 0 or more, got -1.0"),
        (["--port", "70000"], "attn serve: error: argument --port: must be 0..65535, got 70000"),
    ]:
        result = subprocess.run([sys.executable, "-m", "modeling_attn.cli.main", "serve", "--model", str(model_dir),
                                 *flags], capture_output=True, text=True, env=environment)  # fmt: skip
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith(message), result.stderr
