"""Scoring a given translation (modeling_attn/api/scoring.py, `engine.score`, `attn score`, `POST /score`).

Reference checks, on tiny random models with the letters' word-level tokenizer: the torch engine's per-token
log-probabilities, batched with padding, equal a hand-written log-softmax gather from the model's own logits for one
pair at a time, and their sum equals -loss x tokens of the model's forward with `labels` (no label smoothing), for
attn_transformer and attn_rnn; an ensemble's equal its members' distributions combined by hand (log-linear and
linear); CTranslate2's `score_batch` (ctranslate2 and auto) agrees with torch within 1e-4 per token, onnxruntime
(the torch model) exactly. `attn score` writes the API's numbers as JSON lines and TSV, from files and stdin pairs;
files of different line counts, a stdin line without its tab, an empty source and a target too long end in one line
with exit status 2; a real `attn serve` process answers POST /score with the API's numbers, and names the field of
a bad request.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from explain_models import letter_tokenizer, tiny_rnn, tiny_transformer
from tasks import one_thread

from modeling_attn.api.engines import TorchEngine, load_translator
from modeling_attn.api.ensemble import AttnEnsemble
from modeling_attn.api.scoring import PairError, Score
from modeling_attn.api.translation import TranslateError, load_model
from modeling_attn.cli.main import main as cli

SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
POSITIONS = 12  # the Transformer's position table: a target of 11 letters fits, 12 do not (the start token)
SOURCES = ["a b c", "d", "e f g h i j", "b a", "c c c c", "j i h"]
TARGETS = ["c b a", "", "j i h g f e", "a", "c", "h i j a b"]  # an empty target: the end token alone
TOLERANCE = 1e-4  # CTranslate2's kernels against torch's, per log-probability (tests/test_engines.py's n-best scores)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def tiny(model_type: str, seed: int = 0):
    """A tiny random model of `model_type` on the letters' vocabulary, its special tokens those of the tokenizer."""
    if model_type == "attn_transformer":
        model = tiny_transformer(seed=seed, max_position_embeddings=POSITIONS, **SPECIAL)
    else:
        model = tiny_rnn(seed=seed)
        model.config.update(SPECIAL)
    model.generation_config.update(**SPECIAL)
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("score-model")
    tiny("attn_transformer").save_pretrained(folder)
    letter_tokenizer().save_pretrained(folder)
    return folder


def by_hand(model, tokenizer, source: str, target: str) -> tuple[list[str], list[float], float]:
    """One pair alone, no padding: the tokens (the end token last), each one's log-probability gathered from the
    log-softmax of the model's logits, and -loss x tokens of the model's forward with those labels."""
    input_ids = torch.tensor([tokenizer(source)["input_ids"]])
    labels = torch.tensor([[*tokenizer(target)["input_ids"], 2]])
    decoder_input_ids = torch.cat([torch.tensor([[1]]), labels[:, :-1]], dim=1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits
        loss = model(input_ids=input_ids, labels=labels).loss
    log_probs = torch.log_softmax(logits.double(), dim=-1)[0, torch.arange(labels.shape[1]), labels[0]]
    return tokenizer.convert_ids_to_tokens(labels[0].tolist()), log_probs.tolist(), -loss.item() * labels.shape[1]


@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
def test_torch_scores_are_the_model_s_log_softmax_and_its_loss(model_type):
    model, tokenizer = tiny(model_type), letter_tokenizer()
    found = TorchEngine(model, tokenizer).score(SOURCES, TARGETS, batch_size=4)  # padded batches of 4 and 2
    assert len(found) == len(SOURCES)
    for score, source, target in zip(found, SOURCES, TARGETS, strict=True):
        tokens, log_probs, minus_loss_sum = by_hand(model, tokenizer, source, target)
        assert score.tokens == tokens and score.tokens[-1] == "</s>"
        assert score.log_probs == pytest.approx(log_probs, abs=1e-5)
        assert score.total == pytest.approx(minus_loss_sum, abs=1e-4)
        assert score.mean == pytest.approx(score.total / len(tokens))
        assert len(set(log_probs)) > 1 or len(log_probs) == 1  # a real distribution, not a constant
    assert found[1].tokens == ["</s>"]  # the empty target: the end token alone


@pytest.mark.parametrize("combine", ["log_linear", "linear"])
def test_an_ensemble_scores_its_members_distributions_combined(combine):
    members = [tiny("attn_transformer", seed=1), tiny("attn_rnn", seed=2)]
    weights = [0.75, 0.25]
    tokenizer = letter_tokenizer()
    found = TorchEngine(AttnEnsemble(members, weights, combine), tokenizer).score(SOURCES, TARGETS)
    for score, source, target in zip(found, SOURCES, TARGETS, strict=True):
        each = torch.tensor([by_hand(member, tokenizer, source, target)[1] for member in members])  # (2, T)
        weight = torch.tensor(weights, dtype=torch.float64)[:, None]
        if combine == "linear":  # log sum_i w_i p_i
            expected = torch.logsumexp(each + weight.log(), dim=0)
        else:  # sum_i w_i log p_i, renormalised over the vocabulary: recomputed from the full distributions
            expected = log_linear_by_hand(members, weights, tokenizer, source, target)
        assert score.log_probs == pytest.approx(expected.tolist(), abs=1e-5)


def log_linear_by_hand(members, weights, tokenizer, source: str, target: str) -> torch.Tensor:
    input_ids = torch.tensor([tokenizer(source)["input_ids"]])
    labels = torch.tensor([*tokenizer(target)["input_ids"], 2])
    decoder_input_ids = torch.tensor([[1, *labels[:-1].tolist()]])
    with torch.no_grad():
        mixed = sum(
            weight * torch.log_softmax(member(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits, -1)
            for member, weight in zip(members, weights, strict=True)
        )[0]
    return torch.log_softmax(mixed.double(), dim=-1)[torch.arange(len(labels)), labels]


def test_a_one_member_ensemble_scores_as_its_model():
    model, tokenizer = tiny("attn_transformer"), letter_tokenizer()
    alone = TorchEngine(model, tokenizer).score(SOURCES, TARGETS)
    ensemble = TorchEngine(AttnEnsemble([model]), tokenizer).score(SOURCES, TARGETS)
    for one, other in zip(alone, ensemble, strict=True):
        assert one.tokens == other.tokens and one.log_probs == pytest.approx(other.log_probs, abs=1e-6)


@pytest.mark.parametrize("engine", ["ctranslate2", "auto", "onnxruntime"])
def test_every_engine_gives_torch_s_scores(model_dir, engine):
    pytest.importorskip("ctranslate2", reason="the ctranslate2 engine needs ctranslate2 (the interop extra)")
    if engine == "onnxruntime":
        pytest.importorskip("onnxruntime", reason="the onnxruntime engine needs the onnx extra")
        pytest.importorskip("onnxscript", reason="the ONNX export needs onnxscript (the onnx extra)")
    expected = load_translator(str(model_dir), engine="torch", device="cpu").score(SOURCES, TARGETS)
    opened = load_translator(str(model_dir), engine=engine, device="cpu")
    assert (opened.fast.name if engine == "auto" else opened.name) == engine.replace("auto", "ctranslate2")
    found = opened.score(SOURCES, TARGETS, batch_size=4)
    for score, reference in zip(found, expected, strict=True):
        assert score.tokens == reference.tokens
        tolerance = 0 if engine == "onnxruntime" else TOLERANCE  # onnxruntime scores with the torch model
        assert score.log_probs == pytest.approx(reference.log_probs, abs=tolerance)
    with pytest.raises(PairError, match=r"pair 4: the target \('a b c d e f g h i j a b'\) has 12 tokens"):
        opened.score([*SOURCES[:4], "a"], [*TARGETS[:4], "a b c d e f g h i j a b"], batch_size=3)


def test_bad_pairs_are_refused_naming_the_pair():
    engine = TorchEngine(tiny("attn_transformer"), letter_tokenizer())
    with pytest.raises(TranslateError, match="^2 targets for 3 sources; give one target per source$"):
        engine.score(["a", "b", "c"], ["a", "b"])
    with pytest.raises(PairError, match=r"^pair 3: the source is empty; a target is scored given a source"):
        engine.score(["a", "b", "c", " "], ["a", "b", "c", "d"], batch_size=2)
    too_long = " ".join("abcdefghijklm")  # 13 tokens: more than the 12 positions
    with pytest.raises(PairError, match=r"^pair 1: the source \('a b c d e f g h i j k l m'\) has 13 tokens, more"):
        engine.score(["a", too_long], ["a", "b"])
    with pytest.raises(TypeError, match="targets: give a list of sentences, not one str"):
        engine.score(["a"], "a")
    assert engine.score([], []) == []
    rnn = TorchEngine(tiny("attn_rnn"), letter_tokenizer())  # no position table: any length
    assert len(rnn.score([too_long], [too_long])[0].tokens) == 14


def test_a_score_s_json_and_totals():
    score = Score(["a", "</s>"], [-1.0, -0.5])
    assert (score.total, score.mean) == (-1.5, -0.75)
    assert score.as_dict() == {"total": -1.5, "mean": -0.75, "length": 2}
    assert score.as_dict(tokens=True)["tokens"] == ["a", "</s>"]


# -- attn score ------------------------------------------------------------------------------------------------


def attn_score(argv: list[str], capsys, monkeypatch, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    status = cli(["score", "--no_progress", "--engine", "torch", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def same(found: list[dict], expected: list[Score], tokens: bool = False) -> bool:
    """`found` (JSON objects) are `expected`'s, computed in other batches: a pair padded to another length gets its
    numbers from other float32 sums (the same to 1e-6)."""
    for entry, score in zip(found, expected, strict=True):
        reference = score.as_dict(tokens)
        if entry.keys() != reference.keys() or entry.get("tokens") != reference.get("tokens"):
            return False
        if entry.pop("log_probs", []) != pytest.approx(reference.pop("log_probs", []), abs=1e-5):
            return False
        if {**entry, "tokens": None} != pytest.approx({**reference, "tokens": None}, abs=1e-5):
            return False
    return len(found) == len(expected)


def write_pairs(folder: Path, sources: list[str], targets: list[str]) -> tuple[str, str]:
    (folder / "src.txt").write_text("".join(f"{line}\n" for line in sources), encoding="utf-8")
    (folder / "tgt.txt").write_text("".join(f"{line}\n" for line in targets), encoding="utf-8")
    return str(folder / "src.txt"), str(folder / "tgt.txt")


def test_attn_score_writes_the_api_s_scores_as_json_lines_and_tsv(model_dir, tmp_path, capsys, monkeypatch):
    model, tokenizer = load_model(str(model_dir), "cpu")
    expected = TorchEngine(model, tokenizer).score(SOURCES, TARGETS)
    source, target = write_pairs(tmp_path, SOURCES, TARGETS)
    model_flags = ["--model", str(model_dir)]
    status, out, _ = attn_score([*model_flags, "--source", source, "--target", target], capsys, monkeypatch)
    assert status == 0
    assert [json.loads(line) for line in out.splitlines()] == [score.as_dict() for score in expected]
    stdin = "".join(f"{s}\t{t}\n" for s, t in zip(SOURCES, TARGETS, strict=True))
    status, out, _ = attn_score([*model_flags, "--tokens", "--batch_size", "4"], capsys, monkeypatch, stdin=stdin)
    assert same([json.loads(line) for line in out.splitlines()], expected, tokens=True)
    argv = [*model_flags, "--source", source, "--target", target, "--format", "tsv", "--tokens"]
    status, out, _ = attn_score(argv, capsys, monkeypatch)
    rows = [line.split("\t") for line in out.splitlines()]
    assert [float(row[0]) for row in rows] == [score.total for score in expected]
    assert [float(row[1]) for row in rows] == [score.mean for score in expected]
    assert [int(row[2]) for row in rows] == [len(score.tokens) for score in expected]
    assert [row[3].split(" ") for row in rows] == [score.tokens for score in expected]
    assert [list(map(float, row[4].split(" "))) for row in rows] == [score.log_probs for score in expected]
    output = tmp_path / "scores.jsonl"
    status, out, _ = attn_score([*model_flags, "--output", str(output)], capsys, monkeypatch, stdin=stdin)
    assert (status, out) == (0, "")
    assert [json.loads(line)["total"] for line in output.read_text().splitlines()] == [s.total for s in expected]


def test_attn_score_refuses_bad_input_in_one_line_with_exit_status_2(model_dir, tmp_path, capsys, monkeypatch):
    model_flags = ["--model", str(model_dir)]
    source, target = write_pairs(tmp_path, SOURCES, TARGETS[:-1])
    status, out, err = attn_score([*model_flags, "--source", source, "--target", target], capsys, monkeypatch)
    assert (status, out) == (2, "")
    assert err.splitlines()[-1] == (
        f"attn score: error: --target {target} has 5 lines and --source {source} has 6 lines; give one "
        "translation a line for each source line"
    )
    status, _, err = attn_score(model_flags, capsys, monkeypatch, stdin="a\tb\nc d\n")
    assert status == 2
    assert err.splitlines()[-1] == (
        "attn score: error: stdin:2: 0 tabs; give one source<TAB>target pair a line (or --source and --target files)"
    )
    source, target = write_pairs(tmp_path, ["a", "b", "c"], ["a", "b", " ".join("abcdefghijkl")])
    status, _, err = attn_score([*model_flags, "--source", source, "--target", target], capsys, monkeypatch)
    assert status == 2
    assert err.splitlines()[-1].startswith(f"attn score: error: {target}:3: the target ('a b c d e f g h i j k l')")
    status, _, err = attn_score(model_flags, capsys, monkeypatch, stdin="a\tb\n\tb\n")
    assert status == 2 and err.splitlines()[-1].startswith("attn score: error: stdin:2: the source is empty")
    status, _, err = attn_score([*model_flags, "--source", source], capsys, monkeypatch)
    assert status == 2 and "--source and --target go together" in err.splitlines()[-1]


# -- POST /score -----------------------------------------------------------------------------------------------


def test_post_score_on_a_real_server_gives_the_api_s_scores(model_dir, tmp_path):
    httpx = pytest.importorskip("httpx", reason="the server tests' client is httpx (the test extra)")
    pytest.importorskip("uvicorn", reason="the serve extra's uvicorn is not installed")
    model, tokenizer = load_model(str(model_dir), "cpu")
    expected = TorchEngine(model, tokenizer).score(SOURCES, TARGETS)
    log = tmp_path / "serve.log"
    port = free_port()
    command = [sys.executable, "-m", "modeling_attn.cli.main", "serve", "--model", str(model_dir), "--port", str(port)]
    with open(log, "w") as handle:
        process = subprocess.Popen([*command, "--engine", "torch", "--threads", "1"], stdout=handle, stderr=handle)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url, process, log)
        answer = httpx.post(f"{url}/score", json={"source": SOURCES, "target": TARGETS, "tokens": True}, timeout=60)
        assert answer.status_code == 200
        assert answer.json() == {"scores": [score.as_dict(tokens=True) for score in expected]}
        plain = httpx.post(f"{url}/score", json={"source": SOURCES[:2], "target": TARGETS[:2]}, timeout=60).json()
        assert same(plain["scores"], expected[:2])
        for body, message in (
            ({"source": ["a", "b"], "target": ["a"]}, "target: 1 sentences for 2 in source; give one translation"),
            ({"source": ["a", " "], "target": ["a", "b"]}, "source[1]: is empty; a target is scored given a source"),
            ({"source": ["a"], "target": [" ".join("abcdefghijkl")]}, "target[0]: ('a b c d e f g h i j k l') has"),
            ({"source": ["a"]}, "target: Field required"),
        ):
            refused = httpx.post(f"{url}/score", json=body, timeout=60)
            assert refused.status_code == 422 and refused.json()["error"].startswith(message), refused.json()
    finally:
        process.terminate()
        process.wait(timeout=60)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, log: Path) -> None:
    """Until `attn serve` answers GET /health (its log in the failure if it ends first)."""
    import httpx

    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, log.read_text()
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
