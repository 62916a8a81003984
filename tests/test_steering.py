"""Steering a translation (issue 56): a target prefix, banned words and repetition limits per call, on every engine.

The references are independent of the code under test: transformers' own continuation of a decoder prompt
(`decoder_input_ids`) for the prefix, CTranslate2's own `target_prefix`, transformers' own generate() for the
repetition limits, hand-made score tensors for the `TargetPrefix` processor.
"""

from __future__ import annotations

import json

import pytest
import torch
from tasks import one_thread
from test_engines import SENTENCES

from modeling_attn.api.engines import EngineError, load_translator
from modeling_attn.api.translation import SentenceTooLong
from modeling_attn.cli.main import main as cli
from modeling_attn.generation import TargetPrefix

PREFIXES = [" ".join(sentence.split()[::-1][:2]) if i % 3 else "" for i, sentence in enumerate(SENTENCES)]


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def test_the_prefix_processor_leaves_one_token_at_its_own_score_while_the_prefix_lasts():
    scores = torch.log_softmax(torch.randn(4, 6), dim=-1)  # 2 sentences x 2 beams
    prefixes = torch.tensor([[3, 5], [-1, -1]])  # sentence 0: tokens 3 then 5; sentence 1: none
    processor = TargetPrefix(prefixes)
    low = torch.finfo(scores.dtype).min
    at_step = {1: 3, 2: 5}  # input length (start token + generated) -> sentence 0's forced token
    for length, token in at_step.items():
        found = processor(torch.zeros(4, length, dtype=torch.long), scores.clone())
        for row in (0, 1):
            expected = torch.full((6,), low)
            expected[token] = scores[row, token]
            assert torch.equal(found[row], expected)
        assert torch.equal(found[2:], scores[2:])  # no prefix: untouched
    assert torch.equal(processor(torch.zeros(4, 3, dtype=torch.long), scores.clone()), scores)  # past the prefix
    alone = processor.select(torch.tensor([1]))
    assert torch.equal(alone.prefixes, prefixes[1:])


@pytest.mark.parametrize("beams", [1, 3])
def test_a_prefixed_translation_starts_with_the_prefix_and_none_is_todays(torch_engine, beams):
    found = torch_engine.translate_batch(SENTENCES, num_beams=beams, target_prefix=PREFIXES)
    for translation, prefix in zip(found, PREFIXES, strict=True):
        assert translation.startswith(prefix)
    assert sum(prefix != "" and translation != prefix for translation, prefix in zip(found, PREFIXES, strict=True)) > 5
    unprefixed = torch_engine.translate_batch(SENTENCES, num_beams=beams)
    assert (
        torch_engine.translate_batch(SENTENCES, num_beams=beams, target_prefix=[None] * len(SENTENCES)) == unprefixed
    )
    assert [f for f, p in zip(found, PREFIXES, strict=True) if not p] == [
        u for u, p in zip(unprefixed, PREFIXES, strict=True) if not p
    ]
    nbest = torch_engine.translate_nbest(SENTENCES[:6], 3, num_beams=3, target_prefix=PREFIXES[:6])
    assert all(
        hypothesis.text.startswith(prefix)
        for block, prefix in zip(nbest, PREFIXES[:6], strict=True)
        for hypothesis in block
    )


def test_a_greedy_prefix_continues_as_transformers_continues_a_decoder_prompt(torch_engine):
    model, tokenizer = torch_engine.model, torch_engine.tokenizer
    for sentence, prefix in list(zip(SENTENCES, PREFIXES, strict=True))[:12]:
        if not prefix:
            continue
        encoded = tokenizer([sentence], return_tensors="pt", return_token_type_ids=False)
        prompt = [
            [model.generation_config.decoder_start_token_id, *tokenizer(prefix, add_special_tokens=False).input_ids]
        ]
        expected = model.generate(**encoded, decoder_input_ids=torch.tensor(prompt), num_beams=1, max_new_tokens=20)
        found = torch_engine.translate_batch([sentence], num_beams=1, max_new_tokens=20, target_prefix=[prefix])
        assert found == tokenizer.batch_decode(expected, skip_special_tokens=True)


def test_ctranslate2_continues_a_prefix_as_torch_with_the_same_scores(reverser_dir, torch_engine):
    pytest.importorskip("ctranslate2", reason="the ctranslate2 engine needs ctranslate2 (the interop extra)")
    engine = load_translator(str(reverser_dir), engine="ctranslate2", device="cpu")
    for beams in (1, 3):
        expected = torch_engine.translate_batch(SENTENCES, num_beams=beams, target_prefix=PREFIXES)
        found = engine.translate_batch(SENTENCES, num_beams=beams, target_prefix=PREFIXES)
        assert sum(a == b for a, b in zip(found, expected, strict=True)) >= len(SENTENCES) - (beams > 1)
    expected = torch_engine.translate_nbest(SENTENCES[:8], 2, num_beams=3, target_prefix=PREFIXES[:8])
    found = engine.translate_nbest(SENTENCES[:8], 2, num_beams=3, target_prefix=PREFIXES[:8])
    for block, reference in zip(found, expected, strict=True):
        if [h.text for h in block] == [h.text for h in reference]:  # the scores count the prefix on both
            assert [h.score for h in block] == pytest.approx([h.score for h in reference], abs=1e-4)


def test_auto_keeps_ctranslate2_for_prefixes_and_greedy_limits_and_takes_torch_for_limited_beams(reverser_dir):
    pytest.importorskip("ctranslate2", reason="the ctranslate2 engine needs ctranslate2 (the interop extra)")
    engine = load_translator(str(reverser_dir), engine="auto", device="cpu")
    assert engine.describe({"target_prefix": ["a"]})["engine"] == "ctranslate2"
    assert engine.describe({"num_beams": 1, "bad_words": ("a",), "repetition_penalty": 1.5})["engine"] == "ctranslate2"
    limited = engine.describe({"num_beams": 3, "no_repeat_ngram_size": 2})
    assert limited["engine"] == "torch" and "renormalizes" in limited["why"]


@pytest.mark.parametrize(
    "options",
    [{"no_repeat_ngram_size": 1}, {"repetition_penalty": 3.0}, {"min_new_tokens": 6}, {"bad_words": ("a", "b c")}],
    ids=lambda options: next(iter(options)),
)
@pytest.mark.parametrize("beams", [1, 3])
def test_the_limits_on_torch_are_generate_s_own(torch_engine, options, beams):
    model, tokenizer = torch_engine.model, torch_engine.tokenizer
    encoded = tokenizer(SENTENCES, return_tensors="pt", padding=True, return_token_type_ids=False)
    arguments = dict(options)
    if "bad_words" in arguments:
        arguments["bad_words_ids"] = tokenizer(list(arguments.pop("bad_words")), add_special_tokens=False).input_ids
    expected = tokenizer.batch_decode(
        model.generate(**encoded, num_beams=beams, **arguments), skip_special_tokens=True
    )
    found = torch_engine.translate_batch(SENTENCES, num_beams=beams, **options)
    assert found == expected
    assert found != torch_engine.translate_batch(SENTENCES, num_beams=beams)  # the limit changed something
    if "bad_words" in options:
        assert not any(" a" in f" {text}" or "b c" in text for text in found)
    if "min_new_tokens" in options:
        assert all(len(text.split()) >= 6 for text, sentence in zip(found, SENTENCES, strict=True) if sentence.strip())


def test_a_prefix_without_room_for_the_end_token_is_refused_naming_its_sentence(torch_engine):
    with pytest.raises(SentenceTooLong, match="target prefix of 5 tokens") as caught:
        torch_engine.translate_batch(["a b", "c d"], max_new_tokens=5, target_prefix=["", "a b c d e"])
    assert caught.value.row == 1


def test_onnxruntime_refuses_a_prefix_and_limits_naming_the_flag(reverser_dir):
    pytest.importorskip("onnxruntime", reason="the onnxruntime engine needs the onnx extra")
    pytest.importorskip("onnxscript", reason="the ONNX export needs onnxscript (the onnx extra)")
    engine = load_translator(str(reverser_dir), engine="onnxruntime", device="cpu")
    with pytest.raises(EngineError, match=r"onnxruntime has no target prefixes \(--prefix, --prefix_file\)"):
        engine.translate_batch(["a b"], target_prefix=["b"])
    with pytest.raises(EngineError, match=r"has no banned words \(--bad_words\)"):
        engine.translate_batch(["a b"], bad_words=("b",))


def test_attn_translate_prefix_file_and_bad_words(reverser_dir, tmp_path, capsys, torch_engine):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SENTENCES[:6]) + "\n")
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("\n".join(PREFIXES[:6]) + "\n")
    banned = tmp_path / "bad.txt"
    banned.write_text("a\n")
    common = ["translate", "--model", str(reverser_dir), "--input", str(source), "--engine", "torch", "--no_progress"]
    assert cli([*common, "--prefix_file", str(prefixes), "--bad_words", str(banned)]) == 0
    expected = torch_engine.translate_batch(SENTENCES[:6], target_prefix=PREFIXES[:6], bad_words=("a",))
    assert capsys.readouterr().out.splitlines() == expected
    prefixes.write_text("\n".join(PREFIXES[:5]) + "\n")
    assert cli([*common, "--prefix_file", str(prefixes)]) == 2
    assert f"--prefix_file {prefixes} has 5 line(s), the input 6 lines in {source}" in capsys.readouterr().err
    banned.write_text("a\n\nb\n")
    assert cli([*common, "--bad_words", str(banned)]) == 2
    assert f"--bad_words {banned}:2: an empty line" in capsys.readouterr().err
    assert cli([*common, "--prefix", "a", "--prefix_file", str(prefixes)]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert cli([*common, "--prefix", "a b c d e f g h i j k l m a b c d e f g h i j", "--max_new_tokens", "8"]) == 2
    assert f"{source}:1: the sentence has a target prefix of 23 tokens" in capsys.readouterr().err


def test_the_server_takes_a_prefix_per_sentence_and_the_limits(torch_engine):
    from fastapi.testclient import TestClient

    from modeling_attn.api.server import create_app

    with TestClient(create_app(torch_engine)) as client:
        body = {"text": SENTENCES[:6], "prefix": PREFIXES[:6], "num_beams": 3, "bad_words": ["a"]}
        answer = client.post("/translate", json=body).json()
        expected = torch_engine.translate_nbest(
            SENTENCES[:6], 1, num_beams=3, target_prefix=PREFIXES[:6], bad_words=("a",)
        )
        assert [t["text"] for t in answer["translations"]] == [block[0].text for block in expected]
        refused = client.post("/translate", json={"text": ["a b"], "prefix": ["a", "b"]})
        assert refused.status_code == 422 and "prefix: 2 prefixes for 1 sentences" in json.dumps(refused.json())
        refused = client.post("/translate", json={"text": ["a b"], "prefix": ["a b c d e"], "max_new_tokens": 3})
        assert refused.status_code == 422 and refused.json()["error"].startswith("prefix[0]: the sentence has")
