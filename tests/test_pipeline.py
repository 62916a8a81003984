"""The `translation` pipeline (modeling_attn/pipeline_translation.py) after `import modeling_attn`, for any seq2seq
model: our two model types, transformers' MarianMTModel and its conversion to attn_transformer (`attn convert`),
M2M100 (a tokenizer that takes languages) and T5 (a config with `task_specific_params`).

Reference checks: the pipeline's translations equal `model.generate()` run on one sentence at a time and decoded,
from model objects and from folders (and, slow, from Hub ids served by a real Hub server on loopback), for the task
names `translation` and `translation_en_to_de`, batched and streamed, with generation settings at init and at call.
What importing the package changes in transformers' task tables is read in a fresh process before and after the
import; the registration fails loudly on tables it does not expect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from marian_tiny import bart_sizes, marian_tokenizer, saved_marian
from tasks import one_thread
from test_translate import CORPUS, SENTENCES, save_tiny_model
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    GenerationConfig,
    M2M100Config,
    M2M100ForConditionalGeneration,
    M2M100Tokenizer,
    T5Config,
    T5ForConditionalGeneration,
    pipeline,
)
from transformers import pipelines as transformers_pipelines

import modeling_attn
from modeling_attn.cli.main import main as attn
from modeling_attn.pipeline_translation import TranslationPipeline, register_translation_pipeline

KINDS = ["attn_transformer", "attn_rnn", "marian", "marian_converted"]


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():  # tiny matrices: faster on one thread of the shared CPU
        yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Saved tiny models: ours (random, with a BPE tokenizer), a random OPUS-MT-style Marian model with a real
    SentencePiece MarianTokenizer, and that Marian model converted to attn_transformer by `attn convert`."""
    root = tmp_path_factory.mktemp("pipeline")
    found = {kind: save_tiny_model(root / kind, kind) for kind in ("attn_transformer", "attn_rnn")}
    saved_marian(root / "marian")
    generation = GenerationConfig.from_pretrained(root / "marian")
    generation.max_new_tokens = 8  # the random model seldom ends a sentence: keep the tests short
    generation.save_pretrained(root / "marian")
    found["marian"] = root / "marian"
    assert attn(["convert", "--from-marian", str(root / "marian"), "--to", str(root / "marian_converted")]) == 0
    found["marian_converted"] = root / "marian_converted"
    return found


def load(folder: Path):
    return AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def generated(model, tokenizer, sentences: list[str], **generate_kwargs) -> list[list[str]]:
    """model.generate on one sentence at a time, decoded: every returned sequence of each sentence."""
    outputs = []
    with torch.no_grad():
        for sentence in sentences:
            encoded = tokenizer([sentence], return_tensors="pt", return_token_type_ids=False)
            ids = model.generate(**encoded, **generate_kwargs)
            outputs.append(tokenizer.batch_decode(ids, skip_special_tokens=True))
    return outputs


def lists_the_pipeline(folder: Path) -> bool:
    """Whether the folder's config names our pipeline (saved by our models' save_pretrained): transformers then
    loads it from the folder, for the task name "translation", only with trust_remote_code=True."""
    return "translation" in json.loads((folder / "config.json").read_text()).get("custom_pipelines", {})


@pytest.mark.parametrize("kind", KINDS)
def test_pipeline_translates_as_generate(folders, kind):
    """From model objects and from the folder, under both task names."""
    model, tokenizer = load(folders[kind])
    expected = [texts[0] for texts in generated(model, tokenizer, SENTENCES)]
    assert len(set(expected)) > 1  # the outputs depend on the input: a mix-up of sentences would show
    for task in ("translation", "translation_en_to_de"):
        remote = task == "translation" and lists_the_pipeline(folders[kind])
        from_folder = pipeline(task, model=str(folders[kind]), trust_remote_code=True if remote else None)
        # the folder's copy of pipeline_translation.py (remote code), else the registered class
        assert type(from_folder).__name__ == "TranslationPipeline"
        assert (type(from_folder) is TranslationPipeline) is not remote
        from_objects = pipeline(task, model=model, tokenizer=tokenizer)
        assert type(from_objects) is TranslationPipeline
        for translator in (from_folder, from_objects):
            assert translator.task == task
            assert translator(SENTENCES, batch_size=4) == [{"translation_text": text} for text in expected]
            assert translator(SENTENCES[1]) == [{"translation_text": expected[1]}]
            streamed = translator((sentence for sentence in SENTENCES), batch_size=2)  # one list per sentence
            assert [result[0]["translation_text"] for result in streamed] == expected


@pytest.mark.parametrize("kind", KINDS)
def test_generation_settings_at_init_and_at_call(folders, kind):
    model, tokenizer = load(folders[kind])
    translator = pipeline("translation", model=model, tokenizer=tokenizer, max_new_tokens=2)
    short = [texts[0] for texts in generated(model, tokenizer, SENTENCES, max_new_tokens=2)]
    assert [r["translation_text"] for r in translator(SENTENCES, batch_size=3)] == short
    longer = [texts[0] for texts in generated(model, tokenizer, SENTENCES, max_new_tokens=4)]
    assert [r["translation_text"] for r in translator(SENTENCES, max_new_tokens=4)] == longer  # the call wins
    several = translator(SENTENCES, batch_size=4, num_beams=3, num_return_sequences=2, max_new_tokens=5)
    expected = generated(model, tokenizer, SENTENCES, num_beams=3, num_return_sequences=2, max_new_tokens=5)
    assert [[r["translation_text"] for r in results] for results in several] == expected


def test_token_ids_text_and_bad_calls(folders):
    model, tokenizer = load(folders["marian"])
    translator = pipeline("translation_en_to_de", model=model, tokenizer=tokenizer)
    with torch.no_grad():
        ids = model.generate(**tokenizer([SENTENCES[0]], return_tensors="pt"))[0]
    (only_ids,) = translator(SENTENCES[0], return_tensors=True)  # transformers 4: tensors instead of text
    assert set(only_ids) == {"translation_token_ids"} and torch.equal(only_ids["translation_token_ids"], ids)
    (both,) = translator(SENTENCES[0], return_tensors=True, return_text=True)
    assert both["translation_text"] == tokenizer.decode(ids, skip_special_tokens=True)
    with pytest.raises(ValueError, match="nothing to return"):
        translator(SENTENCES[0], return_text=False)
    with pytest.raises(TypeError, match="expected a string, got int"):
        translator(42)
    with pytest.raises(ValueError, match="return_dict_in_generate is not supported"):
        translator(SENTENCES[0], return_dict_in_generate=True)


def tiny_m2m100(folder: Path) -> tuple[M2M100ForConditionalGeneration, M2M100Tokenizer]:
    """A random M2M100 model with a real M2M100Tokenizer (SentencePiece pieces, then 100 language tokens)."""
    marian_tokenizer(folder)  # trains folder/spm.model on marian_tiny.SENTENCES
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece in json.loads((folder / "vocab.json").read_text()):
        vocab.setdefault(piece, len(vocab))
    (folder / "m2m_vocab.json").write_text(json.dumps(vocab))
    tokenizer = M2M100Tokenizer(str(folder / "m2m_vocab.json"), str(folder / "spm.model"), src_lang="en")
    torch.manual_seed(0)
    vocab_size = max(tokenizer.lang_code_to_id.values()) + 1  # the language tokens come after the pieces
    config = M2M100Config(
        vocab_size=vocab_size,
        **bart_sizes(1, 2),
        max_position_embeddings=64,
        dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(std=0.5)
    model.generation_config.max_new_tokens = 6
    return model, tokenizer


def test_languages_of_a_multilingual_tokenizer(tmp_path):
    """src_lang / tgt_lang, from the task name or the call, reach a tokenizer that takes languages (M2M100: the
    source language token, and the target language as generate's forced_bos_token_id), as in transformers 4."""
    model, tokenizer = tiny_m2m100(tmp_path)

    def expected(source: str, target: str) -> list[str]:
        tokenizer.src_lang = source
        forced = tokenizer.get_lang_id(target)
        return [texts[0] for texts in generated(model, tokenizer, SENTENCES, forced_bos_token_id=forced)]

    to_german, from_german_to_french = expected("en", "de"), expected("de", "fr")
    assert to_german != from_german_to_french
    by_name = pipeline("translation_en_to_de", model=model, tokenizer=tokenizer)
    assert [r["translation_text"] for r in by_name(SENTENCES, batch_size=4)] == to_german
    generic = pipeline("translation", model=model, tokenizer=tokenizer)
    results = generic(SENTENCES, src_lang="de", tgt_lang="fr", batch_size=3, return_tensors=True, return_text=True)
    assert [r["translation_text"] for r in results] == from_german_to_french
    assert {int(r["translation_token_ids"][1]) for r in results} == {tokenizer.get_lang_id("fr")}
    assert [r["translation_text"] for r in by_name(SENTENCES, src_lang="de", tgt_lang="fr")] == from_german_to_french
    with pytest.raises(ValueError, match="requires a `src_lang` and a `tgt_lang`"):
        generic(SENTENCES[0])


def test_task_specific_prefix_and_settings_of_a_t5_config():
    """A T5-style config's `task_specific_params` entry for the task gives the prefix and generation defaults
    (for "translation": the first translation_* entry), as transformers 4's pipelines did."""
    from modeling_attn.training.tokenizer import train_bpe_tokenizer

    prefix = "translate English to German: "
    tokenizer = train_bpe_tokenizer([*CORPUS, prefix] * 3, vocab_size=120, min_frequency=1)
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=16,
        d_kv=4,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
        task_specific_params={"translation_en_to_de": {"prefix": prefix, "max_new_tokens": 5, "num_beams": 2}},
    )
    model = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(std=0.5)
    prefixed = [prefix + sentence for sentence in SENTENCES]
    expected = [texts[0] for texts in generated(model, tokenizer, prefixed, max_new_tokens=5, num_beams=2)]
    assert expected != [texts[0] for texts in generated(model, tokenizer, SENTENCES, max_new_tokens=5, num_beams=2)]
    for task in ("translation_en_to_de", "translation"):
        translator = pipeline(task, model=model, tokenizer=tokenizer)
        assert [r["translation_text"] for r in translator(SENTENCES, batch_size=3)] == expected
    beam_three = [texts[0] for texts in generated(model, tokenizer, prefixed, max_new_tokens=5, num_beams=3)]
    assert [r["translation_text"] for r in translator(SENTENCES, num_beams=3)] == beam_three
    assert model.config.task_specific_params["translation_en_to_de"]["prefix"] == prefix  # the config is unchanged


# -- what importing modeling_attn changes in transformers ---------------------------------------------------

_TABLES = """
import json, sys
from transformers import pipelines
def tables():
    return {"removed": sorted(pipelines.REMOVED_TASKS), "supported": sorted(pipelines.SUPPORTED_TASKS),
            "aliases": sorted(pipelines.TASK_ALIASES.items()),
            "check_task": pipelines.PIPELINE_REGISTRY.check_task.__qualname__}
def refusal(task):
    try:
        pipelines.check_task(task)
    except KeyError as error:
        return str(error)
before = tables()
refused = [refusal(task) for task in ("translation", "translation_en_to_de")]
import modeling_attn
print(json.dumps({"before": before, "after": tables(), "refused": refused}))
"""


@pytest.mark.slow
def test_what_importing_the_package_changes_in_transformers():
    """Exactly: the entry "translation" leaves REMOVED_TASKS, the task "translation" joins the registry, and the
    registry's check_task resolves translation_XX_to_YY; nothing else in the task tables."""
    result = subprocess.run([sys.executable, "-c", _TABLES], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    tables = json.loads(result.stdout.strip().splitlines()[-1])
    before, after = tables["before"], tables["after"]
    assert all("has been removed from transformers" in message for message in tables["refused"])
    assert set(before["removed"]) - set(after["removed"]) == {"translation"}
    assert set(after["removed"]) <= set(before["removed"])
    assert set(after["supported"]) - set(before["supported"]) == {"translation"}
    assert set(before["supported"]) <= set(after["supported"]) and after["aliases"] == before["aliases"]
    assert before["check_task"] == "PipelineRegistry.check_task"
    assert after["check_task"].startswith("_check_task_with_pairs")


def test_task_names_resolve_to_the_pipeline():
    for task in ("translation", "translation_en_to_de", "translation_de_to_fr"):
        normalized, targeted, options = transformers_pipelines.check_task(task)
        assert (normalized, targeted["impl"]) == ("translation", TranslationPipeline)
        assert options == (None if task == "translation" else tuple(task.split("_")[1::2]))
    for bad in ("translation_en_de", "translation_en_to_de_to_fr", "translationen"):
        with pytest.raises(KeyError, match="Unknown task"):
            transformers_pipelines.check_task(bad)
    with pytest.raises(KeyError, match="has been removed"):  # the other removed tasks stay removed
        transformers_pipelines.check_task("summarization")


def test_registration_is_idempotent_and_fails_loudly(monkeypatch):
    registry = transformers_pipelines.PIPELINE_REGISTRY
    check_task = registry.check_task
    register_translation_pipeline()  # again, as an importlib.reload(modeling_attn) would
    assert registry.check_task is check_task and modeling_attn.TranslationPipeline is TranslationPipeline
    assert transformers_pipelines.check_task("translation_en_to_de")[1]["impl"] is TranslationPipeline

    # A transformers whose table no longer lists "translation" (and whose check_task is not ours): not silently on.
    monkeypatch.setattr(transformers_pipelines, "REMOVED_TASKS", {"summarization": "gone"})
    monkeypatch.setattr(registry, "check_task", check_task.__wrapped__)
    with pytest.raises(ImportError, match=r"expects 'translation' in transformers.pipelines.REMOVED_TASKS"):
        register_translation_pipeline()
    monkeypatch.delattr(transformers_pipelines, "_resolve_deprecated_task")
    with pytest.raises(ImportError, match=r"transformers 5\.\d+.*REMOVED_TASKS and _resolve_deprecated_task"):
        register_translation_pipeline()


def test_evaluate_finds_the_translation_task():
    """evaluate 0.4.6's `evaluator("translation")` checks the task with transformers' check_task: it raises a
    KeyError under transformers 5 (huggingface/evaluate #741) and works once the package is imported."""
    import evaluate
    from evaluate.evaluator import TranslationEvaluator

    assert type(evaluate.evaluator("translation")) is TranslationEvaluator


# -- Hub ids -------------------------------------------------------------------------------------------------

_FROM_THE_HUB = """
import json, sys
import modeling_attn  # registers the translation pipeline
from transformers import pipeline
sentences = json.loads(sys.argv[1])
out = {}
for repo, task, trust in json.loads(sys.argv[2]):
    translator = pipeline(task, model=repo, trust_remote_code=trust)
    out[f"{repo} {task}"] = {"texts": [r["translation_text"] for r in translator(sentences, batch_size=4)],
                             "class": type(translator).__module__ + "." + type(translator).__name__}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_pipeline_from_hub_ids(folders, tmp_path):
    """A Hub id, served by olah on 127.0.0.1 (tests/hub_server.py) to a fresh process with an empty HF cache."""
    from hub_server import commit_folder, olah_server

    repos = {
        "org/tiny-marian": folders["marian"],
        "org/tiny-transformer": folders["attn_transformer"],
        "org/tiny-rnn": folders["attn_rnn"],
    }
    for repo, folder in repos.items():
        commit_folder(tmp_path / "mirrors" / "models" / repo, folder)
    calls = [
        ("org/tiny-marian", "translation", None),
        ("org/tiny-marian", "translation_en_to_de", None),
        ("org/tiny-transformer", "translation_en_to_de", None),
        ("org/tiny-rnn", "translation", True),
    ]
    with olah_server(tmp_path / "mirrors", tmp_path, "org/tiny-marian") as url:
        env = {**os.environ, "HF_ENDPOINT": url, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_XET": "1"}
        env.pop("HF_HUB_OFFLINE", None)
        result = subprocess.run(
            [sys.executable, "-c", _FROM_THE_HUB, json.dumps(SENTENCES), json.dumps(calls)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=600,
        )
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for repo, task, trust in calls:
        expected = [texts[0] for texts in generated(*load(repos[repo]), SENTENCES)]
        assert out[f"{repo} {task}"]["texts"] == expected, (repo, task)
        registered = "modeling_attn.pipeline_translation.TranslationPipeline"
        assert (out[f"{repo} {task}"]["class"] == registered) is not bool(trust)
