"""The engines behind one translating API (modeling_attn.api.engines) and the export cache they keep.

Reference checks: every export engine gives the torch engine's translations (generate()'s, token for token) and
n-best scores on a trained model with a real tokenizer, batched, greedy and beam search, with generate()'s
per-sentence length limit; `auto` picks the fastest installed engine and torch for what it cannot do; a named engine
refuses what it cannot do in one line naming itself and the setting. The export cache is reused, re-made after a
weights change (new translations), re-made when corrupt, left whole by two processes exporting at once, and never
writes over a folder attn did not write.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest
import torch
from explain_models import LETTERS, letter_tokenizer
from tasks import one_thread, train_transformer_reverser
from tiny import spread_tiny_rnn
from transformers import GenerationConfig

from modeling_attn.api import engines, export_cache
from modeling_attn.api.engines import EngineError, load_translator, open_engine
from modeling_attn.api.export_cache import ExportCacheError, cache_root
from modeling_attn.api.translation import load_model
from modeling_attn.cli.main import main as cli

pytest.importorskip("ctranslate2", reason="the ctranslate2 engine needs ctranslate2 (the interop extra)")

# Letter sentences of 2-9 words: the reverser's task, with lengths that end at different steps.
SENTENCES = [" ".join(LETTERS[(i * 7 + j * 3) % len(LETTERS)] for j in range(2 + i % 8)) for i in range(24)]
SETTINGS = [{}, {"num_beams": 4}, {"num_beams": 4, "length_penalty": 2.0}, {"num_beams": 1}, {"max_new_tokens": 3}]


def agree(found: list, expected: list, beams: bool) -> bool:
    """Greedy: the same for every sentence. Beam search on CTranslate2: the same but for at most one sentence in 24
    (as tests/test_export_ctranslate2.py states, >= 96%): CTranslate2 stops once `num_beams` hypotheses have ended,
    generate() goes on while a longer one may still score better, which on this barely trained model's close
    decisions can pick another translation on another CPU's kernels."""
    same = sum(a == b for a, b in zip(found, expected, strict=True))
    return same >= len(expected) - (1 if beams else 0)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def save_reverser(folder: Path, source_offset: int | None = None) -> Path:
    """The reverser of tests/tasks.py (trained, 5 s) with the letters' tokenizer, saved as a model folder; its
    generation config searches with 2 beams, and `source_offset` sets the per-sentence limit (source + offset)."""
    model = train_transformer_reverser(steps=150, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model.config.decoder_start_token_id = 1
    settings = dict(decoder_start_token_id=1, eos_token_id=2, pad_token_id=0, num_beams=2, max_length=20)
    if source_offset is not None:
        settings["max_length_over_source"] = source_offset
    model.generation_config = GenerationConfig(**settings)  # saved as given (one made from the config is not)
    model.save_pretrained(folder)
    letter_tokenizer().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", ["ctranslate2", "onnxruntime"])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda settings: ",".join(map(str, settings.items())) or "config")
def test_each_engine_translates_as_torch_batched(reverser_dir, torch_engine, name, settings):
    if name == "onnxruntime":
        pytest.importorskip("onnxruntime", reason="the onnxruntime engine needs the onnx extra")
        pytest.importorskip("onnxscript", reason="the ONNX export needs onnxscript (the onnx extra)")
    engine = load_translator(str(reverser_dir), engine=name, device="cpu")
    assert engine.name == name
    expected = torch_engine.translate_batch(SENTENCES, **settings)
    assert len(set(expected)) > 10, "the reverser should translate different sentences differently"
    found = engine.translate_batch(SENTENCES, **settings)
    assert engine.translate_batch(SENTENCES[5:6], **settings) == found[5:6]  # batch 1
    assert agree(found, expected, beams=settings.get("num_beams", 2) > 1 and name == "ctranslate2")


@pytest.mark.parametrize("name", ["ctranslate2", "onnxruntime"])
def test_nbest_lists_and_scores_equal_torch(reverser_dir, torch_engine, name):
    if name == "onnxruntime":
        pytest.importorskip("onnxscript", reason="the ONNX export needs onnxscript (the onnx extra)")
    engine = load_translator(str(reverser_dir), engine=name, device="cpu")
    for settings in ({"num_beams": 4}, {"num_beams": 4, "length_penalty": 0.6}, {"num_beams": 3, "max_new_tokens": 4}):
        expected = torch_engine.translate_nbest(SENTENCES[:8], 3, **settings)
        found = engine.translate_nbest(SENTENCES[:8], 3, **settings)
        same = [
            [h.text for h in block] == [h.text for h in reference]
            and [h.score for h in block] == pytest.approx([h.score for h in reference], abs=1e-4)
            for block, reference in zip(found, expected, strict=True)
        ]
        assert agree(same, [True] * len(same), beams=name == "ctranslate2")


def test_ctranslate2_keeps_generate_s_per_sentence_limit_in_a_batch(tmp_path):
    """source length + 2 tokens: each sentence of a batch stops at its own limit, as generate() stops it (greedy.
    A beam that reaches the limit is scored with the end token generate() forces there, which CTranslate2 cannot
    force: with beams, sentences that reach their limit may differ; at the default limit, source + 50, few do)."""
    folder = save_reverser(tmp_path / "model", source_offset=2)
    torch_engine = load_translator(str(folder), engine="torch", device="cpu")
    fast = load_translator(str(folder), engine="ctranslate2", device="cpu")
    for settings in ({"num_beams": 1},):
        # torch one sentence at a time: this barely trained model's close decisions move with a batch's padding
        # (CTranslate2 pads nothing)
        expected = [torch_engine.translate_batch([sentence], **settings)[0] for sentence in SENTENCES]
        assert fast.translate_batch(SENTENCES, **settings) == expected
        # scores too: a translation cut at its limit counts the end token generate() forces there
        found = fast.translate_nbest(SENTENCES, 1, **settings)
        for sentence, (hypothesis,) in zip(SENTENCES, found, strict=True):
            (reference,) = torch_engine.translate_nbest([sentence], 1, **settings)[0]
            assert (hypothesis.text, hypothesis.score) == (reference.text, pytest.approx(reference.score, abs=1e-4))
        lengths = [len(text.split()) for text in expected]
        sources = [len(sentence.split()) for sentence in SENTENCES]
        assert any(length < source for length, source in zip(lengths, sources, strict=True)), "no limit was reached"


def test_empty_sentences_and_too_long_ones_as_on_torch(reverser_dir, torch_engine):
    fast = load_translator(str(reverser_dir), engine="ctranslate2", device="cpu")
    batch = ["a b c", "", "  ", "d e f g"]
    assert fast.translate_batch(batch) == torch_engine.translate_batch(batch)
    assert fast.translate_batch(["", ""]) == ["", ""]
    too_long = " ".join(["a"] * 40)  # the reverser's position table has 32 positions
    with pytest.raises(Exception) as on_torch:
        torch_engine.translate_batch(["a b", too_long])
    with pytest.raises(type(on_torch.value)) as on_fast:
        fast.translate_batch(["a b", too_long])
    assert str(on_fast.value) == str(on_torch.value)


def test_ctranslate2_int8_is_ctranslate2_s_own_int8(reverser_dir, tmp_path):
    """--quantize int8 on ctranslate2 is CTranslate2's int8 (compute_type int8 on the float32 export): the same
    translations as CTranslate2 loaded that way by hand. (How close int8 comes to float32 depends on the CPU's int8
    kernels: see tests/test_export_ctranslate2.py's int8 test.)"""
    from modeling_attn.api.export_ctranslate2 import CTranslate2Translator

    fast = load_translator(str(reverser_dir), engine="ctranslate2", device="cpu", quantize="int8")
    assert fast.describe()["compute_type"] == "int8"
    by_hand = CTranslate2Translator(fast.export, compute_type="int8", intra_threads=1)
    tokenizer = letter_tokenizer()
    expected = tokenizer.batch_decode(
        by_hand.translate_ids(tokenizer(SENTENCES)["input_ids"], beam_size=2), skip_special_tokens=True
    )
    assert fast.translate_batch(SENTENCES) == expected


@pytest.mark.parametrize("settings", [{"num_beams": 1}, {"num_beams": 4}, {"num_beams": 2, "max_new_tokens": 3}])
def test_ctranslate2_aligns_words_as_torch(reverser_dir, torch_engine, settings):
    """Word alignments from CTranslate2's attention (the export's alignment layer and heads) against the torch
    engine's (generate()'s eager attention, the same layer and heads): the same links, weights equal to 1e-5, on
    one-best and n-best translations, with their scores; a translation cut at max_new_tokens aligns alike."""
    fast = load_translator(str(reverser_dir), engine="ctranslate2", device="cpu")
    sentences = [*SENTENCES[:8], "", "m"]  # an empty sentence is not translated; one word
    found, expected = (
        fast.translate_aligned(sentences, **settings),
        torch_engine.translate_aligned(sentences, **settings),
    )
    for ours, theirs in zip(found, expected, strict=True):
        assert ours.text == theirs.text and ours.alignment.pairs == theirs.alignment.pairs
        assert ours.alignment.source_words == theirs.alignment.source_words
        assert torch.allclose(ours.alignment.weights, theirs.alignment.weights, atol=1e-5)
    assert found[0].alignment.pairs, "a translation of letters links its words"
    n = min(2, settings["num_beams"])
    nbest = fast.translate_aligned_nbest(SENTENCES[:4], n, words="alnum", **settings)
    reference = torch_engine.translate_aligned_nbest(SENTENCES[:4], n, words="alnum", **settings)
    for ours, theirs in zip(nbest, reference, strict=True):
        assert [item.text for item in ours] == [item.text for item in theirs]
        assert [item.alignment.pairs for item in ours] == [item.alignment.pairs for item in theirs]
        assert [item.score for item in ours] == pytest.approx([item.score for item in theirs], abs=1e-4)


def test_ctranslate2_sampling_repeats_with_a_seed(reverser_dir):
    fast = load_translator(str(reverser_dir), engine="ctranslate2", device="cpu")
    sampling = {"do_sample": True, "num_beams": 1, "temperature": 5.0}
    runs = []
    for _ in range(2):
        fast.seed(7)
        runs.append(fast.translate_nbest(SENTENCES[:6], 3, **sampling))
    assert runs[0] == runs[1]
    texts = {h.text for block in runs[0] for h in block}
    assert len(texts) > 6, "samples at temperature 5 should differ"
    onnx = load_translator(str(reverser_dir), engine="onnxruntime", device="cpu")
    with pytest.raises(EngineError, match=r"--engine onnxruntime: onnxruntime has no sampling \(--do_sample\)"):
        onnx.translate_batch(SENTENCES[:2], **sampling)


def test_auto_picks_ctranslate2_and_torch_for_what_it_lacks(reverser_dir, torch_engine):
    said = []
    model, tokenizer = load_model(str(reverser_dir), "cpu", eager=True)
    auto = open_engine(model, tokenizer, str(reverser_dir), "auto", say=said.append)
    assert auto.describe()["engine"] == "ctranslate2" and auto.describe()["chosen_by"] == "auto"
    assert any("engine: ctranslate2" in line for line in said)
    assert agree(auto.translate_batch(SENTENCES), torch_engine.translate_batch(SENTENCES), beams=True)
    aligned = auto.translate_aligned(SENTENCES[:3], num_beams=1)  # word alignments: ctranslate2's attention
    expected = torch_engine.translate_aligned(SENTENCES[:3], num_beams=1)
    assert [item.alignment.pairs for item in aligned] == [item.alignment.pairs for item in expected]
    sampled = auto.translate_aligned(SENTENCES[:2], do_sample=True, num_beams=1)  # sampling: on torch
    assert all(item.attention is not None for item in sampled)  # torch's alignments carry their attention
    on_torch = open_engine(model, tokenizer, str(reverser_dir), "auto", torch_only="--attention-png")
    assert on_torch.name == "torch"


def test_auto_runs_an_rnn_an_ensemble_and_a_missing_engine_on_torch(reverser_dir, tmp_path, monkeypatch):
    rnn = spread_tiny_rnn(vocab_size=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    assert open_engine(rnn, letter_tokenizer(), "x", "auto").name == "torch"
    model, tokenizer = load_model(str(reverser_dir), "cpu")
    assert open_engine(model, tokenizer, None, "auto").name == "torch"  # an ensemble has no single folder
    monkeypatch.setattr(engines.importlib.util, "find_spec", lambda name: None)
    assert open_engine(model, tokenizer, str(reverser_dir), "auto").name == "torch"


def test_a_named_engine_refuses_what_it_cannot_do_by_name(reverser_dir, monkeypatch):
    model, tokenizer = load_model(str(reverser_dir), "cpu")
    rnn = spread_tiny_rnn(vocab_size=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    cases = [
        (dict(model=rnn, engine="ctranslate2"), "--engine ctranslate2: ctranslate2 has no attn_rnn models"),
        (dict(engine="ctranslate2", quantize="int8_rowwise"), "ctranslate2 has no --quantize int8_rowwise"),
        (dict(engine="onnxruntime", quantize="int8"), "onnxruntime has no --quantize int8 here"),
        (
            dict(engine="ctranslate2", torch_only="--attention-png"),
            "ctranslate2 has no --attention-png; use --engine torch",
        ),
        (dict(engine="ctranslate2", int8_engine="onednn", quantize="int8"), "ctranslate2 has no --int8_engine"),
        (dict(engine="fast"), "--engine fast: not an engine"),
    ]
    for arguments, message in cases:
        arguments = {"model": model, "tokenizer": tokenizer, "model_name_or_path": str(reverser_dir), **arguments}
        with pytest.raises(EngineError, match=message.replace("(", r"\(").replace(")", r"\)")):
            open_engine(**arguments)
    onnx = open_engine(model, tokenizer, str(reverser_dir), "onnxruntime")
    with pytest.raises(EngineError, match=r"onnxruntime has no word alignments \(--align\)"):
        onnx.translate_aligned(["a b"])
    monkeypatch.setattr(engines.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EngineError, match=r"ctranslate2 is not installed \(pip install \"modeling-attn\[fast\]\""):
        open_engine(model, tokenizer, str(reverser_dir), "ctranslate2")


# -- the export cache -------------------------------------------------------------------------------------------


def entries(engine: str = "ctranslate2") -> list[Path]:
    return sorted(cache_root().glob(f"{engine}-*"))


def test_the_export_is_made_once_and_remade_when_the_weights_change(tmp_path):
    folder = save_reverser(tmp_path / "model", source_offset=7)  # a config of its own: not in the cache yet
    said = []
    model, tokenizer = load_model(str(folder), "cpu")
    first = open_engine(model, tokenizer, str(folder), "ctranslate2", say=said.append)
    assert sum("exporting" in line for line in said) == 1
    again = open_engine(model, tokenizer, str(folder), "ctranslate2", say=said.append)
    assert sum("exporting" in line for line in said) == 1 and again.export == first.export  # reused
    with torch.no_grad():  # new weights in the same folder
        model.model.decoder.layers[0].fc1.weight.mul_(-1.5)
    model.save_pretrained(folder)
    changed = open_engine(model, tokenizer, str(folder), "ctranslate2", say=said.append)
    assert sum("exporting" in line for line in said) == 2 and changed.export != first.export
    on_torch = load_translator(str(folder), engine="torch", device="cpu")
    # greedy, unpadded (as CTranslate2): the changed model runs to the length limit, where beams may part
    expected = [on_torch.translate_batch([sentence], num_beams=1)[0] for sentence in SENTENCES]
    assert changed.translate_batch(SENTENCES, num_beams=1) == expected
    assert expected != first.translate_batch(SENTENCES, num_beams=1)


def test_a_corrupt_export_is_remade_not_loaded(reverser_dir):
    model, tokenizer = load_model(str(reverser_dir), "cpu")
    fast = open_engine(model, tokenizer, str(reverser_dir), "ctranslate2")
    weights = fast.export / "model.bin"
    del fast
    with open(weights, "r+b") as handle:  # half-written: cut short
        handle.truncate(weights.stat().st_size // 2)
    said = []
    remade = open_engine(model, tokenizer, str(reverser_dir), "ctranslate2", say=said.append)
    assert any("model.bin has" in line and "exporting again" in line for line in said)
    assert export_cache.check_entry(remade.export.parent) is None
    manifest = json.loads((remade.export.parent / export_cache.MANIFEST_FILE).read_text())
    assert manifest["engine"] == "ctranslate2" and manifest["model"] == str(reverser_dir)


def test_a_folder_attn_did_not_write_is_never_touched(reverser_dir):
    model, tokenizer = load_model(str(reverser_dir), "cpu")
    entry = open_engine(model, tokenizer, str(reverser_dir), "ctranslate2").export.parent
    for path in sorted(entry.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (entry / "notes.txt").write_text("mine\n")  # the user's folder, by the entry's name
    with pytest.raises(ExportCacheError, match="attn did not write") as refused:
        open_engine(model, tokenizer, str(reverser_dir), "ctranslate2")
    assert str(entry) in str(refused.value)
    assert sorted(p.name for p in entry.iterdir()) == ["notes.txt"]
    said = []
    auto = open_engine(model, tokenizer, str(reverser_dir), "auto", say=said.append)  # auto goes on, on torch
    assert auto.name == "torch" and any("attn did not write" in line for line in said)
    assert "attn did not write" in auto.describe()["why"]  # the reason goes with the engine, for the JSON
    (entry / "notes.txt").unlink()
    entry.rmdir()


def _open_in_a_process(folder: str, cache: str, start, results) -> None:
    os.environ[export_cache.CACHE_ENV] = cache
    start.wait()
    engine = load_translator(folder, engine="ctranslate2", device="cpu", threads=1)
    results.put((str(engine.export), engine.translate_batch(SENTENCES[:4])))


def test_two_processes_exporting_at_once_leave_one_whole_export(tmp_path):
    folder = save_reverser(tmp_path / "model")
    cache = tmp_path / "cache"
    context = multiprocessing.get_context("spawn")
    start, results = context.Event(), context.Queue()
    processes = [
        context.Process(target=_open_in_a_process, args=(str(folder), str(cache), start, results)) for _ in "ab"
    ]
    for process in processes:
        process.start()
    start.set()
    found = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert found[0] == found[1]
    made = sorted(path.name for path in (cache / "exports").iterdir() if path.name != export_cache.HASHES_FILE)
    assert len(made) == 1 and made[0].startswith("ctranslate2-"), made  # no staging folder left
    assert export_cache.check_entry(cache / "exports" / made[0]) is None


# -- the commands -----------------------------------------------------------------------------------------------


def test_translate_and_evaluate_say_which_engine(reverser_dir, torch_engine, tmp_path, capsys):
    sources, references = tmp_path / "src.txt", tmp_path / "ref.txt"
    sources.write_text("\n".join(SENTENCES[:6]) + "\n")
    greedy = torch_engine.translate_batch(SENTENCES[:6], num_beams=1)  # greedy: the same on every engine
    references.write_text("\n".join(greedy) + "\n")
    assert cli(["translate", "--model", str(reverser_dir), "--input", str(sources), "--num_beams", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == greedy
    assert "translating with ctranslate2 (auto)" in err  # the progress bar
    flags = ["--sources_file", str(sources), "--references_file", str(references), "--no_progress", "--num_beams", "1"]
    assert cli(["evaluate", "--model", str(reverser_dir), *flags]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["engine"]["engine"] == "ctranslate2" and result["exact_match"] == 100.0
    assert cli(["evaluate", "--model", str(reverser_dir), "--engine", "torch", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["engine"] == {"engine": "torch"}


@pytest.mark.parametrize("align_format", ["hard", "soft"])
def test_translate_align_runs_on_ctranslate2_as_on_torch(reverser_dir, tmp_path, capsys, align_format):
    """`attn translate --align` under auto decodes and aligns on ctranslate2 (no longer sent to torch), with the
    torch engine's lines: the same links; soft weights (printed to 5 digits) within 2e-5, as the two engines' kernels
    round them (a weight printed 0.34675 by one, 0.34674 by the other was seen on an AVX2 EPYC)."""
    sources = tmp_path / "src.txt"
    sources.write_text("\n".join(SENTENCES[:6]) + "\n")
    lines = {}
    for engine in ("auto", "torch"):
        argv = ["translate", "--model", str(reverser_dir), "--input", str(sources), "--engine", engine, "--align"]
        assert cli([*argv, "--align_format", align_format]) == 0
        lines[engine], err = capsys.readouterr()
        assert ("translating with ctranslate2 (auto)" in err) == (engine == "auto")
    assert len(lines["auto"].splitlines()) == len(lines["torch"].splitlines()) == 6
    if align_format == "hard":
        assert lines["auto"] == lines["torch"]
        return
    for found, expected in zip(lines["auto"].splitlines(), lines["torch"].splitlines(), strict=True):
        found, expected = json.loads(found), json.loads(expected)
        weights = found.pop("weights"), expected.pop("weights")
        assert found == expected
        assert [len(row) for row in weights[0]] == [len(row) for row in weights[1]]
        assert [w for row in weights[0] for w in row] == pytest.approx(
            [w for row in weights[1] for w in row], abs=2e-5
        )


def test_a_refusal_is_one_line_with_exit_status_2(reverser_dir, capsys):
    argv = ["translate", "--model", str(reverser_dir), "--engine", "onnxruntime", "--do_sample", "a b"]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "attn translate: error: --engine onnxruntime: onnxruntime has no sampling (--do_sample); use --engine torch "
        "(or auto)"
    )


def test_serve_answers_on_its_engine_and_refuses_what_a_named_one_lacks(reverser_dir, torch_engine):
    """`create_app` on an engine (what `attn serve --engine` runs): auto answers with the torch engine's hypotheses
    and scores, aligns, and GET /model names the engine; a named onnxruntime refuses alignments by field."""
    pytest.importorskip("fastapi", reason="create_app needs the serve extra")
    from fastapi.testclient import TestClient

    from modeling_attn.api.server import create_app

    model, tokenizer = load_model(str(reverser_dir), "cpu")
    expected = torch_engine.translate_nbest(SENTENCES[:5], 1, num_beams=1)  # greedy: the same on every engine
    with TestClient(create_app(open_engine(model, tokenizer, str(reverser_dir), "auto"))) as client:
        answer = client.post("/translate", json={"text": SENTENCES[:5], "num_beams": 1}).json()["translations"]
        assert [entry["text"] for entry in answer] == [block[0].text for block in expected]
        assert [entry["score"] for entry in answer] == pytest.approx([block[0].score for block in expected], abs=1e-4)
        engine = client.get("/model").json()["engine"]
        assert engine["engine"] == "ctranslate2" and engine["chosen_by"] == "auto"
        aligned = client.post("/translate", json={"text": SENTENCES[:2], "alignment": "hard"})
        assert aligned.status_code == 200 and "alignment" in aligned.json()["translations"][0]
    with TestClient(create_app(open_engine(model, tokenizer, str(reverser_dir), "onnxruntime"))) as client:
        refused = client.post("/translate", json={"text": SENTENCES[:2], "alignment": "hard"})
        assert refused.status_code == 422
        assert refused.json()["error"] == (
            "alignment: the server's engine onnxruntime has no word alignments (--align); start attn serve with "
            "--engine torch"
        )


def test_default_threads_share_a_call_between_ctranslate2_workers(reverser_dir):
    """No threads named: one CTranslate2 worker of one thread per thread torch may use, a call's sentences split
    between them (`threads.ctranslate2_threads`); the translations and n-best scores are those of one worker taking
    the call whole, which is what a number given (`threads=1`) opens."""
    torch.set_num_threads(2)  # the autouse fixture restores one thread's setting
    shared = load_translator(str(reverser_dir), engine="ctranslate2", device="cpu")
    whole = load_translator(str(reverser_dir), engine="ctranslate2", device="cpu", threads=1)
    assert (shared.workers, shared.translator.translator.num_translators) == (2, 2)
    assert (whole.workers, whole.translator.translator.num_translators) == (1, 1)
    # CTranslate2 sets the opening thread's OpenMP threads to its intra_threads: torch's setting is kept
    assert torch.get_num_threads() == 2
    assert load_translator(str(reverser_dir), engine="ctranslate2", device="cpu").workers == 2
    assert (shared._split(24), shared._split(1), whole._split(24)) == (12, 1, 0)
    for settings in ({"num_beams": 1}, {"num_beams": 4}):
        found, expected = shared.translate_batch(SENTENCES, **settings), whole.translate_batch(SENTENCES, **settings)
        assert agree(found, expected, beams=settings["num_beams"] > 1)
    found = shared.translate_nbest(SENTENCES[:8], 3, num_beams=4)
    expected = whole.translate_nbest(SENTENCES[:8], 3, num_beams=4)
    for block, reference in zip(found, expected, strict=True):
        assert [h.text for h in block] == [h.text for h in reference]
        assert [h.score for h in block] == pytest.approx([h.score for h in reference], abs=1e-4)


def test_the_torch_engine_takes_threads_by_the_size_of_each_call():
    """No threads named: one intra-op thread per 64 decoder rows (sentences x beams), at least one, at most torch's
    own setting, set for the call and restored after it; a number given is used for every call. Seen from inside the
    model's forward (an RNN's encoder, which every decoding path calls)."""
    rnn = spread_tiny_rnn(vocab_size=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    seen = []
    rnn.model.encoder.register_forward_pre_hook(lambda module, inputs: seen.append(torch.get_num_threads()))
    torch.set_num_threads(2)
    one, many = SENTENCES[:1], SENTENCES[:16]  # 4 and 64 rows at beam 4, 128 rows at 8 beams
    calls = [
        (engines.TorchEngine(rnn, letter_tokenizer()), one, 4, 1),
        (engines.TorchEngine(rnn, letter_tokenizer()), many, 4, 1),
        (engines.TorchEngine(rnn, letter_tokenizer()), many, 8, 2),
        (engines.TorchEngine(rnn, letter_tokenizer(), threads=2), one, 4, 2),
        (engines.TorchEngine(rnn, letter_tokenizer(), threads=1), many, 8, 1),
    ]
    for engine, sentences, beams, expected in calls:
        seen.clear()
        engine.translate_batch(sentences, num_beams=beams, max_new_tokens=3)
        assert set(seen) == {expected}, (len(sentences), beams)
        assert torch.get_num_threads() == 2
    torch.set_num_threads(1)  # torch's own setting is the most the rule takes
    seen.clear()
    engines.TorchEngine(rnn, letter_tokenizer()).translate_nbest(many, 2, num_beams=8, max_new_tokens=3)
    assert set(seen) == {1}


def sampling_copy(reverser_dir: Path, folder: Path) -> Path:
    """The reverser saved with a generation config that samples: every request that sets nothing samples."""
    shutil.copytree(reverser_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "do_sample": True, "num_beams": 1}))
    return folder


def test_the_bar_and_the_json_name_the_engine_that_ran_the_request(reverser_dir, tmp_path, capsys):
    """Under auto a request that samples runs on torch: the progress bar, `attn evaluate`'s JSON and `attn serve`'s
    `GET /model` (for a model whose requests sample unless told not to) say torch and why, not the fast engine auto
    opened; a request that does not sample still names ctranslate2."""
    sources, references = tmp_path / "src.txt", tmp_path / "ref.txt"
    sources.write_text("\n".join(SENTENCES[:4]) + "\n")
    references.write_text("\n".join(SENTENCES[:4]) + "\n")
    argv = ["translate", "--model", str(reverser_dir), "--input", str(sources), "--do_sample", "--seed", "3"]
    assert cli(argv) == 0
    err = capsys.readouterr().err
    assert "translating with torch (auto)" in err and "ctranslate2" not in err
    sampling = sampling_copy(reverser_dir, tmp_path / "sampling")
    flags = ["--sources_file", str(sources), "--references_file", str(references)]
    assert cli(["evaluate", "--model", str(sampling), *flags]) == 0
    out, err = capsys.readouterr()
    assert "translating with torch (auto)" in err and "ctranslate2" not in err
    engine = json.loads(out)["engine"]
    assert engine == {
        "engine": "torch",
        "chosen_by": "auto",
        "why": "sampling runs on torch (the same seed gives the same samples whatever is installed)",
        "otherwise": "ctranslate2",
    }
    assert cli(["evaluate", "--model", str(reverser_dir), *flags]) == 0
    out, err = capsys.readouterr()
    assert "translating with ctranslate2 (auto)" in err and json.loads(out)["engine"]["engine"] == "ctranslate2"
    pytest.importorskip("fastapi", reason="create_app needs the serve extra")
    from fastapi.testclient import TestClient

    from modeling_attn.api.server import create_app

    model, tokenizer = load_model(str(sampling), "cpu")
    with TestClient(create_app(open_engine(model, tokenizer, str(sampling), "auto"))) as client:
        assert client.get("/model").json()["engine"] == engine  # what a request that sets nothing runs on


def attn_lines(err: str) -> list[str]:
    """attn's own lines on stderr (transformers' weight-loading bar left out)."""
    return [line for line in err.splitlines() if line.startswith("attn")]


def test_auto_s_fallback_is_one_stderr_line_off_a_terminal_and_in_the_json(
    reverser_dir, tmp_path, capsys, monkeypatch
):
    """An export cache that cannot be written: auto decodes on torch, and says why in one line on stderr though
    stderr is no terminal (captured here, as in a script or a log), in `attn evaluate`'s JSON beside "engine", and
    in what `attn serve`'s `GET /model` answers (`create_app` on the engine)."""
    (tmp_path / "a-file").write_text("not a folder\n")
    cache = tmp_path / "a-file" / "cache"  # no folder can be made under a file, whoever runs this
    monkeypatch.setenv(export_cache.CACHE_ENV, str(cache))
    why = (
        f"ctranslate2 cannot be used: {cache / 'exports'}: the export cache cannot be written (Not a directory); set "
        f"{export_cache.CACHE_ENV} to a folder this user can write, or use --engine torch"
    )
    sources, references = tmp_path / "src.txt", tmp_path / "ref.txt"
    sources.write_text("\n".join(SENTENCES[:4]) + "\n")
    references.write_text("\n".join(SENTENCES[:4]) + "\n")
    assert cli(["translate", "--model", str(reverser_dir), "--input", str(sources), "--no_progress"]) == 0
    assert attn_lines(capsys.readouterr().err) == [f"attn: engine: torch (auto: {why})"]
    flags = ["--sources_file", str(sources), "--references_file", str(references), "--no_progress"]
    assert cli(["evaluate", "--model", str(reverser_dir), *flags]) == 0
    out, err = capsys.readouterr()
    assert attn_lines(err) == [f"attn: engine: torch (auto: {why})"]
    assert json.loads(out)["engine"] == {"engine": "torch", "chosen_by": "auto", "why": why}
    pytest.importorskip("fastapi", reason="create_app needs the serve extra")
    from fastapi.testclient import TestClient

    from modeling_attn.api.server import create_app

    model, tokenizer = load_model(str(reverser_dir), "cpu")
    with TestClient(create_app(open_engine(model, tokenizer, str(reverser_dir), "auto"))) as client:
        assert client.get("/model").json()["engine"] == {"engine": "torch", "chosen_by": "auto", "why": why}
