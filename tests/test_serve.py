"""`attn serve` (modeling_attn/cli/serve.py, modeling_attn/api/server.py and batching.py): a real server process on
127.0.0.1 and real HTTP clients (httpx, in threads), on a tiny random Transformer with a BPE tokenizer saved to a tmp
folder.

Reference checks: the server's answers equal `attn translate`'s on the same sentences (texts exactly, scores as
`attn translate --num_return_sequences` prints them), whatever the batching of concurrent requests; a seeded
sampling request equals `attn translate --do_sample --seed`; a sentence translated alone equals the same sentence
in a padded batch (what lets the server batch). Word alignments (`"alignment": "hard" | "soft"`) equal the lines of
`attn translate --align` / `--align_format soft`'s output file, for attn_transformer and attn_rnn, with concurrent
clients mixing requests with and without alignments; each n-best hypothesis's alignment equals that of its tokens read
teacher-forced. Every refusal names its field: checked on FastAPI's TestClient (quick) and over real HTTP (slow).
The slow tests also fill the queue (503, nothing lost), send SIGTERM with requests in flight (all answered), and run
32 concurrent clients (no lost or wrong answer).
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
from tiny import spread_tiny_rnn, tiny_config

from modeling_attn import AttnTransformerForConditionalGeneration
from modeling_attn.api.alignment import (
    decoded_spans,
    encode_with_spans,
    format_pharaoh,
    translate_aligned,
    translate_aligned_nbest,
    word_alignment,
)
from modeling_attn.api.translation import load_model, translate_nbest
from modeling_attn.cli.translate import main as translate_main
from modeling_attn.encoder_decoder import alignment_attention

httpx = pytest.importorskip("httpx", reason="the server tests' client is httpx (the test extra)")
pytest.importorskip("fastapi", reason="the serve extra's fastapi is not installed")
pytest.importorskip("uvicorn", reason="the serve extra's uvicorn is not installed")

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


SPECIAL_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)


def save_model(folder: Path) -> Path:
    """A random tiny Transformer (64 positions) with a BPE tokenizer, beam 2 and 6 new tokens at most."""
    tokenizer = train_bpe_tokenizer(CORPUS, vocab_size=100, min_frequency=1)
    torch.manual_seed(0)
    config = tiny_config(vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS, **SPECIAL_IDS)
    model = AttnTransformerForConditionalGeneration(config)
    model.generation_config.update(max_new_tokens=6, num_beams=2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("serve-model"))


def save_alignment_model(folder: Path, model_type: str) -> Path:
    """A random tiny model whose translations have several words, for the alignment tests: a Transformer aligning on
    its 2nd of 3 decoder layers, first 2 heads, or an RNN; weights spread (a model at the default init translates
    every sentence alike), beam 2, 10 new tokens at most, no token repeated (`no_repeat_ngram_size=1`: fewer
    degenerate repetitions)."""
    tokenizer = train_bpe_tokenizer(CORPUS, vocab_size=100, min_frequency=1)
    if model_type == "attn_rnn":
        model = spread_tiny_rnn(vocab_size=len(tokenizer), **SPECIAL_IDS)
    else:
        torch.manual_seed(0)
        config = tiny_config(
            vocab_size=len(tokenizer),
            decoder_layers=3,
            max_position_embeddings=MAX_POSITIONS,
            alignment_layer=1,
            alignment_heads=2,
            **SPECIAL_IDS,
        )
        model = AttnTransformerForConditionalGeneration(config)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() > 1:
                    parameter.uniform_(-0.3, 0.3)
    model.generation_config.update(max_new_tokens=10, num_beams=2, no_repeat_ngram_size=1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def alignment_models(tmp_path_factory) -> dict[str, Path]:
    return {
        model_type: save_alignment_model(tmp_path_factory.mktemp(model_type), model_type)
        for model_type in ("attn_transformer", "attn_rnn")
    }


def attn_translate(model_dir: Path, lines: list[str], tmp_path: Path, capsys, *flags: str) -> list[str]:
    """What `attn translate --input FILE` prints for `lines`."""
    source = tmp_path / "source.txt"
    source.write_text("".join(f"{line}\n" for line in lines))
    capsys.readouterr()
    assert translate_main(["--model", str(model_dir), "--input", str(source), "--no_progress", *flags]) == 0
    return capsys.readouterr().out.splitlines()


def attn_translate_file(model_dir: Path, lines: list[str], tmp_path: Path, *flags: str) -> list[str]:
    """The lines `attn translate --input FILE --output OUT` writes to OUT for `lines`."""
    source, output = tmp_path / "source.txt", tmp_path / f"output-{len(list(tmp_path.glob('output-*')))}.txt"
    source.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    flags = ("--model", str(model_dir), "--input", str(source), "--output", str(output), "--no_progress", *flags)
    assert translate_main(list(flags)) == 0
    written = output.read_text(encoding="utf-8")
    assert written.endswith("\n")
    return written[:-1].split("\n")


def hard_line(entry: dict) -> str:
    """A served translation with `"alignment": "hard"` as `attn translate --align` writes it."""
    return f"{entry['text']} ||| {format_pharaoh(tuple(pair) for pair in entry['alignment'])}"


def same_soft(entry: dict, line: str) -> bool:
    """A served translation with `"alignment": "soft"` against a line of `attn translate --align_format soft`: the same
    translation and words, weights equal to the 5 digits written (batches padded differently can move the rounding
    of the last digit)."""
    record = json.loads(line)
    alignment = entry["alignment"]
    if (entry["text"], alignment["source_words"], alignment["target_words"]) != (
        record["translation"],
        record["source_words"],
        record["target_words"],
    ):
        return False
    served, written = alignment["weights"], record["weights"]
    return len(served) == len(written) and all(
        len(a) == len(b) and all(abs(x - y) <= 1.5e-5 for x, y in zip(a, b, strict=True))
        for a, b in zip(served, written, strict=True)
    )


def nbest_lines(translations: list[dict], offset: int = 0) -> list[tuple[int, str, float]]:
    """The server's n-best answers as `attn translate --num_return_sequences` lines (index, text, score)."""
    return [
        (offset + index, hypothesis["text"], hypothesis["score"])
        for index, entry in enumerate(translations)
        for hypothesis in entry["nbest"]
    ]


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

    from modeling_attn.api.batching import ServeLimits
    from modeling_attn.api.model_info import describe_model
    from modeling_attn.api.server import create_app

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
    ({"text": ["a"], "alignment": "best"}, 422, "alignment: Input should be 'hard' or 'soft'"),
    ({"text": ["a"], "alignment": True}, 422, "alignment: Input should be 'hard' or 'soft'"),
    (
        {"text": ["a"], "alignment": "hard", "alignment_words": "chars"},
        422,
        "alignment_words: Input should be 'whitespace' or 'alnum'",
    ),
    ({"text": ["a"], "alignment_words": "alnum"}, 422, "alignment_words: an alignment setting, with no alignment"),
    ({"text": ["a"], "top_k": 5, "seed": 1}, 422, "top_k, seed: a sampling setting, with no do_sample"),
    (
        {"text": ["a"], "num_return_sequences": 3},
        422,
        "num_return_sequences: num_return_sequences=3 is more than num_beams=2",
    ),
    (
        {"text": ["a"], "max_new_tokens": 100},
        422,
        "max_new_tokens: 100 is more than the model's max_position_embeddings=64",
    ),
    (
        {"text": ["the cat", "the cat sat on the mat " * 12]},
        422,
        "text[1]: 98 tokens, more than the model's max_position_embeddings=64; split it",
    ),
    ({"text": ["a"] * 1025}, 422, "text: 1025 sentences, more than the server queues (max_queue 1024)"),
    ({"text": ["a" * BODY_LIMIT]}, 413, "body: 8"),  # its byte count, then "more than the server's limit of ..."
]


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
        (
            '{"text": ["caf\u00e9"]}'.encode("latin-1"),
            "application/json",
            400,
            "body: not UTF-8 (byte 0xe9 at offset 14); send JSON in UTF-8",
        ),
    ],
)
def test_a_body_that_is_not_a_json_object_is_refused(client, content, content_type, status, message):
    response = client.post("/translate", content=content, headers={"content-type": content_type})
    assert response.status_code == status, response.text
    assert response.json()["error"].startswith(message), response.json()


def test_the_framework_s_own_errors_come_in_the_same_shape(client):
    assert (client.get("/nowhere").status_code, client.get("/nowhere").json()) == (404, {"error": "Not Found"})
    response = client.get("/translate")
    assert (response.status_code, response.json()) == (405, {"error": "Method Not Allowed"})
    assert response.headers["allow"] == "POST"


def test_health_model_and_openapi(client, model_dir):
    assert client.get("/health").json()["status"] == "ok"
    info = client.get("/model").json()
    assert (info["model_type"], info["parameters"], info["max_position_embeddings"]) == (
        "attn_transformer",
        12736,
        MAX_POSITIONS,
    )
    assert info["size"].startswith("0.01M parameters: 2 encoder and 2 decoder layers, d_model 16")
    assert info["decoding"].startswith("beam search with 2 beams") and info["quantization"] is None
    assert info["limits"]["max_body_bytes"] == BODY_LIMIT
    schema = client.get("/openapi.json").json()
    assert set(schema["paths"]) == {"/translate", "/score", "/health", "/model"}
    options = schema["components"]["schemas"]["TranslateRequest"]["properties"]
    assert {"text", "num_beams", "num_return_sequences", "do_sample", "seed", "alignment"} <= set(options)
    assert set(schema["components"]["schemas"]["ScoreRequest"]["properties"]) == {"source", "target", "tokens"}
    assert info["alignment"] == {
        "attention": "the cross-attention of decoder layer 1 of 2, the mean of all its heads (`alignment_layer`, "
        "`alignment_heads` in config.json)",
        "alignment_layer": 0,
        "alignment_heads": 0,
    }
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
    printed = attn_translate(
        model_dir,
        lines,
        tmp_path,
        capsys,
        "--do_sample",
        "--seed",
        "11",
        "--top_k",
        "20",
        "--num_return_sequences",
        "2",
    )
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


def teacher_forced(model, tokenizer, sentence: str, aligned, words: str):
    """The word alignment of a translation's tokens read teacher-forced: one forward pass over the hypothesis, the
    reference the alignment recorded step by step during generate() (beams followed back) must equal."""
    source_ids, source_spans, _ = encode_with_spans(tokenizer, sentence)
    target_ids = tokenizer.convert_tokens_to_ids(aligned.attention.target_tokens)
    assert aligned.text == tokenizer.decode(target_ids, skip_special_tokens=True)
    decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, *target_ids[:-1]]])
    with torch.no_grad():
        outputs = model(torch.tensor([source_ids]), decoder_input_ids=decoder_input_ids, output_attentions=True)
    weights = alignment_attention(outputs.cross_attentions, model.config)[0]
    target = (aligned.text, decoded_spans(tokenizer, target_ids, aligned.text))
    return word_alignment(weights, (sentence, source_spans), target, words)


@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
def test_each_nbest_hypothesis_is_aligned_as_its_tokens_read_teacher_forced(alignment_models, model_type):
    """`translate_aligned_nbest` (what the server calls): translate_nbest's hypotheses and scores, its best one
    translate_aligned's, and each hypothesis with its own alignment."""
    model, tokenizer = load_model(str(alignment_models[model_type]), "cpu", eager=True)
    lines = [*sentences(5, seed=9), "", "1987-03-03"]
    aligned = translate_aligned_nbest(model, tokenizer, lines, 2, words="alnum")
    plain = translate_nbest(model, tokenizer, lines, 2)
    assert [[hypothesis.text for hypothesis in block] for block in aligned] == [[h.text for h in b] for b in plain]
    for block, reference in zip(aligned, plain, strict=True):
        assert [h.score for h in block] == pytest.approx([h.score for h in reference], abs=1e-5, nan_ok=True)
    for best, block in zip(translate_aligned(model, tokenizer, lines, words="alnum"), aligned, strict=True):
        assert (best.text, best.alignment.pairs) == (block[0].text, block[0].alignment.pairs)
        torch.testing.assert_close(best.alignment.weights, block[0].alignment.weights)
    assert all(h.text == "" and h.alignment.pairs == [] and math.isnan(h.score) for h in aligned[5])
    for sentence, block in zip(lines, aligned, strict=True):
        for hypothesis in block if sentence else []:
            expected = teacher_forced(model, tokenizer, sentence, hypothesis, "alnum")
            torch.testing.assert_close(hypothesis.alignment.weights, expected.weights, rtol=1e-4, atol=1e-5)
            assert hypothesis.alignment.pairs == expected.pairs
            assert len(hypothesis.alignment.pairs) == len(hypothesis.alignment.target_words) > 0
    # the check can fail: the hypotheses and their alignments differ
    assert len({hypothesis.alignment.pharaoh() for block in aligned for hypothesis in block}) > 3


@pytest.fixture(scope="module", params=["attn_transformer", "attn_rnn"])
def alignment_client(request, alignment_models):
    from fastapi.testclient import TestClient

    from modeling_attn.api.model_info import describe_model
    from modeling_attn.api.server import create_app

    folder = alignment_models[request.param]
    model, tokenizer = load_model(str(folder), "cpu")
    with TestClient(create_app(model, tokenizer, info=describe_model(model, folder))) as test_client:
        yield test_client, folder, model


def test_alignments_equal_attn_translate_align(alignment_client, tmp_path, capsys):
    client, folder, model = alignment_client
    lines = [*sentences(7, seed=10), "", "Tuesday, March 3rd, 1987"]
    for words in ("whitespace", "alnum"):
        flags = ("--align_words", words)
        hard = client.post("/translate", json={"text": lines, "alignment": "hard", "alignment_words": words})
        assert [hard_line(entry) for entry in hard.json()["translations"]] == attn_translate_file(
            folder, lines, tmp_path, "--align", *flags
        )
        soft = client.post("/translate", json={"text": lines, "alignment": "soft", "alignment_words": words})
        written = attn_translate_file(folder, lines, tmp_path, "--align", "--align_format", "soft", *flags)
        assert all(same_soft(entry, line) for entry, line in zip(soft.json()["translations"], written, strict=True))
        assert len(soft.json()["translations"]) == len(written)
    assert hard.json()["translations"][7] == {"text": "", "score": None, "alignment": []}
    plain = client.post("/translate", json={"text": lines}).json()["translations"]
    assert all("alignment" not in entry for entry in plain)
    assert [entry["text"] for entry in plain] == attn_translate_file(folder, lines, tmp_path)
    # the worker put the attention back: the model serves without alignments as it was loaded
    assert model.config._attn_implementation == (
        "sdpa" if model.config.model_type == "attn_transformer" else model.config._attn_implementation
    )
    nbest = client.post("/translate", json={"text": lines, "alignment": "hard", "num_return_sequences": 2})
    nbest = nbest.json()["translations"]
    assert same_nbest(
        nbest_lines(nbest), parse_nbest(attn_translate_file(folder, lines, tmp_path, "--num_return_sequences", "2"))
    )
    eager, tokenizer = load_model(str(folder), "cpu", eager=True)
    for entry, block in zip(nbest, translate_aligned_nbest(eager, tokenizer, lines, 2), strict=True):
        assert [hypothesis["alignment"] for hypothesis in entry["nbest"]] == [
            [list(pair) for pair in hypothesis.alignment.pairs] for hypothesis in block
        ]
        assert entry["alignment"] == entry["nbest"][0]["alignment"]


def test_seeded_sampling_with_alignments_equals_attn_translate_align_with_the_seed(alignment_client, tmp_path):
    client, folder, _ = alignment_client
    lines = sentences(40, seed=13)  # two chunks of 32, one seed, as attn translate's batches
    body = {"text": lines, "alignment": "hard", "do_sample": True, "seed": 11, "top_k": 20}
    answer = client.post("/translate", json=body).json()["translations"]
    flags = ("--align", "--do_sample", "--seed", "11", "--top_k", "20")
    assert [hard_line(entry) for entry in answer] == attn_translate_file(folder, lines, tmp_path, *flags)


def test_an_int8_server_aligns_as_attn_translate_quantize_int8_align(alignment_models, tmp_path):
    """Quantized after loading with the model's own attention, switched to eager per batch: the same as loading
    eager, then quantizing (`attn translate --quantize int8 --align`)."""
    from fastapi.testclient import TestClient

    from modeling_attn.api.quantize import quantize
    from modeling_attn.api.server import create_app

    folder = alignment_models["attn_transformer"]
    model, tokenizer = load_model(str(folder), "cpu")
    lines = [*sentences(9, seed=14), ""]
    with TestClient(create_app(quantize(model, "int8"), tokenizer)) as client:
        answer = client.post("/translate", json={"text": lines, "alignment": "hard"}).json()["translations"]
    expected = attn_translate_file(folder, lines, tmp_path, "--align", "--quantize", "int8")
    assert [hard_line(entry) for entry in answer] == expected


def test_requests_with_and_without_alignments_never_share_a_batch(alignment_models):
    from modeling_attn.api.engines import TorchEngine
    from modeling_attn.api.serve_schema import TranslateRequest
    from modeling_attn.api.server import _group_for

    model = TorchEngine(*load_model(str(alignment_models["attn_transformer"]), "cpu"))

    def key(**options):
        return _group_for(model, TranslateRequest(text=["a"], **options))[0]

    keys = [key(), key(alignment="hard"), key(alignment="hard", alignment_words="alnum"), key(num_beams=1)]
    assert len(set(keys)) == 4
    assert key(alignment="hard") == key(alignment="hard", alignment_words="whitespace")  # the default
    assert key(alignment="hard") == key(alignment="soft")  # one alignment, written two ways: they share a batch
    group = _group_for(model, TranslateRequest(text=["a"], alignment="soft", alignment_words="alnum"))[1]
    assert (group.alignment_words, _group_for(model, TranslateRequest(text=["a"]))[1].alignment_words) == (
        "alnum",
        None,
    )


def test_eager_attention_is_put_back_even_on_an_error(alignment_models):
    from modeling_attn.api.translation import eager_attention

    model, _ = load_model(str(alignment_models["attn_transformer"]), "cpu")
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="inside"), eager_attention(model):
        assert model.config._attn_implementation == "eager"
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"


def test_model_reports_the_alignment_setting(alignment_models):
    from modeling_attn.api.model_info import describe_model

    for model_type, expected in [
        (
            "attn_transformer",
            {
                "attention": "the cross-attention of decoder layer 2 of 3, the mean of its first 2 "
                "head(s) (`alignment_layer`, `alignment_heads` in config.json)",
                "alignment_layer": 1,
                "alignment_heads": 2,
            },
        ),
        ("attn_rnn", {"attention": "the RNN's alignment weights alpha (Bahdanau et al. 2015)"}),
    ]:
        model, _ = load_model(str(alignment_models[model_type]), "cpu")
        assert describe_model(model, alignment_models[model_type])["alignment"] == expected


def test_the_answer_s_bytes_are_those_fastapi_wrote_from_the_response_model():
    """`_answer` writes the body itself; the reference is FastAPI's own route returning the response model (as the
    server did before), on hypotheses with NaN and infinite scores and weights, non-ASCII text, n-best lists and
    both alignments."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from modeling_attn.api.alignment import AlignedTranslation, WordAlignment
    from modeling_attn.api.serve_schema import ScoredText, SoftAlignment, TranslateResponse, Translation
    from modeling_attn.api.server import _answer
    from modeling_attn.api.translation import Hypothesis

    def as_model(hypotheses, nbest: bool, alignment: str | None) -> TranslateResponse:
        def scored(hypothesis) -> dict:
            found = {"text": hypothesis.text, "score": None if math.isnan(hypothesis.score) else hypothesis.score}
            if alignment == "hard":
                found["alignment"] = hypothesis.alignment.pairs
            elif alignment == "soft":
                found["alignment"] = SoftAlignment(**hypothesis.alignment.soft())
            return found

        translations = []
        for found in hypotheses:
            extra = {"nbest": [ScoredText(**scored(hypothesis)) for hypothesis in found]} if nbest else {}
            translations.append(Translation(**scored(found[0]), **extra))
        return TranslateResponse(translations=translations)

    weights = torch.tensor([[0.1234567, 1e-5, 0.0], [math.nan, 2.5e-7, math.inf]])
    aligned = WordAlignment(["a", "Maß", "c"], ["x", "ÿ"], weights, [(0, 0), (2, 1)])
    empty = WordAlignment(["a"], [], torch.zeros(0, 1), [])
    plain = [
        [Hypothesis("1987-03-03", -0.2069178968667984), Hypothesis('"q"\\ \n ü', -math.inf)],
        [Hypothesis("", math.nan), Hypothesis("x", 1e16)],
    ]
    with_alignments = [
        [AlignedTranslation("x ÿ", aligned, None, -0.5), AlignedTranslation("x", empty, None, -1e-20)],
        [AlignedTranslation("", empty, None, math.nan), AlignedTranslation("", empty, None, math.nan)],
    ]
    cases = [(plain, nbest, None) for nbest in (False, True)]
    cases += [(with_alignments, nbest, alignment) for nbest in (False, True) for alignment in ("hard", "soft")]
    app = FastAPI()

    @app.post("/reference/{case}", response_model=TranslateResponse, response_model_exclude_unset=True)
    async def reference(case: int) -> TranslateResponse:
        return as_model(*cases[case])

    with TestClient(app) as client:
        for index, case in enumerate(cases):
            expected = client.post(f"/reference/{index}")
            answer = _answer(*case)
            assert answer.body == expected.content, case
            assert answer.headers["content-type"] == expected.headers["content-type"] == "application/json"


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
    command = [
        sys.executable,
        "-m",
        "modeling_attn.cli.main",
        "serve",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--threads",
        "1",
        *flags,
    ]
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
@pytest.mark.parametrize("engine", sorted({"x86", "onednn"} & set(torch.backends.quantized.supported_engines)))
def test_an_int8_server_answers_as_attn_translate_with_the_same_engine(model_dir, tmp_path, engine):
    """`attn serve --quantize int8 --int8_engine E` (a real process) answers as `attn translate` with the same flags,
    and GET /model names the kernels (each engine this torch build has)."""
    lines = sentences(12, seed=15)
    flags = ("--quantize", "int8", "--int8_engine", engine)
    with server(model_dir, *flags) as (url, _, _):
        answer = post(url, {"text": lines}).json()["translations"]
        assert httpx.get(f"{url}/model").json()["quantization"] == f"int8 ({engine} kernels)"
    assert [entry["text"] for entry in answer] == attn_translate_file(model_dir, lines, tmp_path, *flags)


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
def test_serve_refuses_quantize_on_a_gpu_a_bad_flag_and_an_address_it_cannot_listen_on_in_one_line(model_dir):
    """Each refused before the model is loaded (the address: by binding it first), in one line, exit status 2."""
    environment = {**os.environ, "PYTHONWARNINGS": "ignore"}
    taken = socket.create_server(("127.0.0.1", 0))  # a port another program listens on
    for flags, message in [
        (["--device", "cuda", "--quantize", "int8"], "attn serve: error: --quantize int8 runs on the CPU only"),
        (
            ["--max_wait_ms", "-1"],
            "attn serve: error: argument --max_wait_ms: must be a finite number of 0 or more, got -1.0",
        ),
        (["--port", "70000"], "attn serve: error: argument --port: must be an integer in [0, 65535], got 70000"),
        (["--host", "999.1.1.1"], "attn serve: error: --host 999.1.1.1: not an address this machine can resolve ("),
        (
            ["--host", "192.0.2.1", "--port", "0"],  # TEST-NET-1: never an address of this machine
            "attn serve: error: --host 192.0.2.1 --port 0: cannot listen there (",
        ),
        (
            ["--port", str(taken.getsockname()[1])],
            f"attn serve: error: --host 127.0.0.1 --port {taken.getsockname()[1]}: cannot listen there (",
        ),
        (["--int8_engine", "onednn"], "attn serve: error: --int8_engine onednn: picks the kernels of --quantize int8"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "modeling_attn.cli.main", "serve", "--model", str(model_dir), *flags],
            capture_output=True,
            text=True,
            env=environment,
        )
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith(message), result.stderr
    taken.close()


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
def test_concurrent_clients_mixing_alignments_get_attn_translate_align_answers(alignment_models, model_type, tmp_path):
    """A real server; 16 clients, 4 slices of the sentences x (hard, soft, none, hard n-best): each answer equals the
    matching line of `attn translate`'s output file (--align, --align_format soft, plain, --num_return_sequences 2).
    The
    requests without alignments are queued first and the others sent while they wait: a server that put sentences
    with and without alignments in one generate() call would answer some without alignments."""
    folder = alignment_models[model_type]
    lines = [*sentences(23, seed=12), ""]
    written = {
        "hard": attn_translate_file(folder, lines, tmp_path, "--align"),
        "soft": attn_translate_file(folder, lines, tmp_path, "--align", "--align_format", "soft"),
        None: attn_translate_file(folder, lines, tmp_path),
        "nbest": parse_nbest(attn_translate_file(folder, lines, tmp_path, "--num_return_sequences", "2")),
    }
    modes = ["hard", "soft", None, "nbest"]
    eager, tokenizer = load_model(str(folder), "cpu", eager=True)
    nbest_alignments = [
        [hypothesis.alignment.pairs for hypothesis in block]
        for block in translate_aligned_nbest(eager, tokenizer, lines, 2)
    ]
    with server(folder, "--max_wait_ms", "1500") as (url, _, log):
        info = httpx.get(f"{url}/model").json()
        assert info["model_type"] == model_type and info["alignment"]["attention"].startswith("the ")

        def client(index: int) -> httpx.Response:
            mode, start = modes[index % 4], 6 * (index // 4)
            body = {"text": lines[start : start + 6]}
            if mode is not None:
                body["alignment"] = "hard" if mode == "nbest" else mode
            if mode == "nbest":
                body["num_return_sequences"] = 2
            return post(url, body)

        responses: list = [None] * 16
        plain = threading.Thread(
            target=lambda: responses.__setitem__(slice(2, 16, 4), in_threads(4, lambda i: client(4 * i + 2)))
        )
        plain.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").json()["waiting_sentences"] < 24:  # all queued, waiting for company
            assert time.monotonic() < deadline and plain.is_alive(), log.read_text()
            time.sleep(0.01)
        others = [index for index in range(16) if index % 4 != 2]
        for index, response in zip(others, in_threads(12, lambda i: client(others[i])), strict=True):
            responses[index] = response
        plain.join()
        health = httpx.get(f"{url}/health").json()
    for index, response in enumerate(responses):
        assert isinstance(response, httpx.Response) and response.status_code == 200, (response, log.read_text())
        mode, start = modes[index % 4], 6 * (index // 4)
        answer = response.json()["translations"]
        if mode == "hard":
            assert [hard_line(entry) for entry in answer] == written["hard"][start : start + 6]
        elif mode == "soft":
            assert all(
                same_soft(entry, line) for entry, line in zip(answer, written["soft"][start : start + 6], strict=True)
            )
        elif mode is None:
            assert [entry["text"] for entry in answer] == written[None][start : start + 6]
            assert all("alignment" not in entry for entry in answer)
        else:
            assert same_nbest(nbest_lines(answer, offset=start), written["nbest"][2 * start : 2 * start + 12])
            assert [[[tuple(pair) for pair in h["alignment"]] for h in entry["nbest"]] for entry in answer] == (
                nbest_alignments[start : start + 6]
            )
            # the best hypothesis's alignment is the one `attn translate --align` prints
            assert [hard_line(entry) for entry in answer] == written["hard"][start : start + 6]
    assert health["sentences_translated"] == 16 * 6 and health["batches"] < 16, health
