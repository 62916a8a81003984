"""Sharing on the Hub (modeling_attn/hub.py, pipeline_translation.py, generation.py, loading.py).

A real Hub server on loopback (`olah`, tests/hub_server.py) serves git repositories holding exactly the files that
`attn push` uploads (written by `hub.save_for_hub`, the function `push_to_hub` uploads from). A fresh process with an
empty HF cache, `HF_ENDPOINT` at the server and `modeling_attn` not importable loads them with
`trust_remote_code=True` and must translate exactly as the original models do, through `generate()` and through the
translation pipeline; a second branch and a pinned code revision must load what they name.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest
import torch
from hub_server import commit_folder, olah_server
from huggingface_hub import EvalResult, ModelCard, ModelCardData, constants, get_token
from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results
from isolation import run_isolated
from runs import free_port
from test_translate import CORPUS, SENTENCES, save_tiny_model
from tiny import padded_batch, tiny_model
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from modeling_attn import AttnRNNForConditionalGeneration, AttnTransformerForConditionalGeneration
from modeling_attn.api.errors import HubUnreachableError, ResultsError
from modeling_attn.api.hub import (
    EMBEDDED_TASK,
    hub_id,
    language_codes,
    model_card,
    model_origin,
    paper_generation_config,
    push_to_hub,
    read_results,
    record_origin,
    save_for_hub,
)
from modeling_attn.api.translation import translate_batch
from modeling_attn.cli.main import main as attn
from modeling_attn.generation import SourceLengthLimit

REPOS = {"attn_transformer": "org/tiny-transformer", "attn_rnn": "org/tiny-rnn"}
CODE_MARKER = '\nCODE_REVISION_MARKER = "v2"\n'


def write_data(folder):
    """A data folder as `attn evaluate --data` reads it: the CORPUS pairs as train and test splits (en -> de)."""
    folder.mkdir()
    sources, targets = CORPUS[0::2], CORPUS[1::2]
    for split in ("train", "test"):
        (folder / f"{split}.en").write_text("\n".join(sources) + "\n")
        (folder / f"{split}.de").write_text("\n".join(targets) + "\n")
    return folder


def expected_translations(folder, sentences):
    """What the pushed model must produce: the local model with the paper's decoding, one sentence at a time."""
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    model.generation_config = paper_generation_config(model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [translate_batch(model, tokenizer, [sentence])[0][0] for sentence in sentences]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Models of both types saved for the Hub, committed to olah's mirror folder (plus a v2 branch, a pickle-only
    repository), and the server running on 127.0.0.1."""
    root = tmp_path_factory.mktemp("hub")
    data = write_data(root / "data")
    mirrors = root / "mirrors" / "models"
    info = {"folders": {}, "expected": {}, "results": {}}
    for model_type, repo in REPOS.items():
        model_dir = save_tiny_model(root / model_type, model_type)
        results = root / f"{model_type}-results.json"
        argv = [
            "evaluate",
            "--model",
            str(model_dir),
            "--data",
            str(data),
            "--source_lang",
            "en",
            "--num_beams",
            "4",
            "--length_penalty",
            "0.6",
        ]
        assert attn([*argv, "--target_lang", "de", "--split", "test", "--output", str(results)]) == 0
        folder = save_for_hub(model_dir, root / f"{model_type}-hub", repo, results)
        info["main_commit_" + model_type] = commit_folder(mirrors / repo, folder)
        info["folders"][model_type] = folder
        info["expected"][model_type] = expected_translations(folder, SENTENCES)
        info["results"][model_type] = json.loads(results.read_text())

    # Branch v2 of the Transformer repository: other weights, and a marker in its code.
    torch.manual_seed(1)
    other = AttnTransformerForConditionalGeneration(
        AutoModelForSeq2SeqLM.from_pretrained(info["folders"]["attn_transformer"]).config
    )
    other.save_pretrained(root / "v2-model")
    shutil.copy(info["folders"]["attn_transformer"] / "tokenizer.json", root / "v2-model")
    shutil.copy(info["folders"]["attn_transformer"] / "tokenizer_config.json", root / "v2-model")
    v2 = save_for_hub(root / "v2-model", root / "v2-hub", REPOS["attn_transformer"])
    with open(v2 / "modeling_transformer.py", "a") as code:
        code.write(CODE_MARKER)
    commit_folder(mirrors / REPOS["attn_transformer"], v2, branch="v2")
    subprocess.run(["git", "-C", str(mirrors / REPOS["attn_transformer"]), "checkout", "-q", "main"], check=True)
    info["expected"]["v2"] = expected_translations(v2, SENTENCES)

    # A repository whose weights are a pickle only.
    pickled = root / "pickled"
    shutil.copytree(info["folders"]["attn_transformer"], pickled)
    weights = AutoModelForSeq2SeqLM.from_pretrained(pickled).state_dict()
    torch.save(weights, pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    commit_folder(mirrors / "org/pickled", pickled)

    with olah_server(root / "mirrors", root, REPOS["attn_transformer"]) as url:
        info["url"] = url
        yield info


REMOTE_CODE = """
import json, torch
from huggingface_hub import ModelCard
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, pipeline

sentences = json.load(open("sentences.json"))
main_commit = json.load(open("main_commit.json"))
out = {}

def translate(repo, **revisions):
    model = AutoModelForSeq2SeqLM.from_pretrained(repo, trust_remote_code=True, **revisions).eval()
    # trust_remote_code: AutoTokenizer reads config.json, whose class is code of the repository (else it prompts)
    tokenizer = AutoTokenizer.from_pretrained(repo, revision=revisions.get("revision"), trust_remote_code=True)
    texts = []
    for sentence in sentences:
        with torch.no_grad():
            ids = model.generate(**tokenizer([sentence], return_tensors="pt", return_token_type_ids=False))
        texts.append(tokenizer.decode(ids[0], skip_special_tokens=True))
    module = __import__(type(model).__module__, fromlist=["_"])
    return model, {"translations": texts, "class": type(model).__module__ + "." + type(model).__name__,
                   "code_marker": getattr(module, "CODE_REVISION_MARKER", None)}

for model_type, repo in {"attn_transformer": "org/tiny-transformer", "attn_rnn": "org/tiny-rnn"}.items():
    model, out[model_type] = translate(repo)
    generation = GenerationConfig.from_pretrained(repo)
    out[model_type]["generation"] = {k: getattr(generation, k, None) for k in
                                     ("num_beams", "length_penalty", "max_length_over_source", "early_stopping")}
    translator = pipeline("translation", model=repo, trust_remote_code=True)
    out[model_type]["pipeline"] = [r["translation_text"] for r in translator(sentences, batch_size=4)]
    out[model_type]["pipeline_single"] = translator(sentences[0])[0]["translation_text"]
    card = ModelCard.load(repo)
    out[model_type]["card_results"] = {r.metric_type: r.metric_value for r in card.data.eval_results}
    out[model_type]["class_of_model"] = type(model).__name__

_, out["v2"] = translate("org/tiny-transformer", revision="v2")
_, out["v2_pinned_code"] = translate("org/tiny-transformer", revision="v2", code_revision=main_commit)

try:
    AutoModelForSeq2SeqLM.from_pretrained("org/pickled", trust_remote_code=True)
    out["pickle_refused"] = None
except OSError as error:
    out["pickle_refused"] = str(error)
allowed = AutoModelForSeq2SeqLM.from_pretrained("org/pickled", trust_remote_code=True, use_safetensors=False)
out["pickle_allowed_class"] = type(allowed).__name__

rnn_class = type(AutoModelForSeq2SeqLM.from_pretrained("org/tiny-rnn", trust_remote_code=True))
try:
    rnn_class.from_pretrained("org/tiny-transformer")
    out["wrong_type"] = None
except ValueError as error:
    out["wrong_type"] = str(error)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def remote(hub, tmp_path_factory):
    """What a machine without modeling_attn gets from the server (one fresh process for all checks)."""
    work = tmp_path_factory.mktemp("remote")
    (work / "sentences.json").write_text(json.dumps(SENTENCES))
    (work / "main_commit.json").write_text(json.dumps(hub["main_commit_attn_transformer"]))
    env = {"HF_ENDPOINT": hub["url"], "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": ""}
    return run_isolated(REMOTE_CODE, cwd=work, env=env, timeout=600)


def test_pushed_decoding_is_the_one_the_scores_were_measured_with():
    model = tiny_model()
    paper = paper_generation_config(model)
    assert (paper.num_beams, paper.length_penalty, paper.max_length_over_source) == (4, 0.6, 50)
    measured = paper_generation_config(model, {"num_beams": 5, "length_penalty": 1.5, "max_length": 99})
    assert (measured.num_beams, measured.length_penalty, measured.max_length_over_source) == (5, 1.5, 50)
    assert measured.early_stopping is True and measured.max_new_tokens is None
    unknown = paper_generation_config(model, {"num_beams": None, "length_penalty": None})
    assert (unknown.num_beams, unknown.length_penalty) == (4, 0.6)


@pytest.mark.parametrize(
    ("pair", "expected"),
    [
        (("en", "de"), ["en", "de"]),
        (("EN", "fr"), ["en", "fr"]),
        (("en_XX", "pt-BR"), ["en", "pt"]),  # mBART / BCP 47 tags: their ISO 639 language
        (("en", "haw"), ["en", "haw"]),  # ISO 639-3 where a language has no two-letter code
        (("deu", "eng"), None),  # not the Hub's (BCP 47) spelling of languages with a two-letter code: de, en
        (("en", "en"), ["en"]),
        (("date", "iso"), None),  # the embedded task: "iso" alone is a code (Isoko), "date" is none
        (("en", "english"), None),
        (("", "de"), None),
    ],
)
def test_card_languages_are_iso_639_codes_or_omitted(pair, expected):
    assert language_codes(*pair) == expected


def test_only_hub_ids_pass_for_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "m30k").mkdir(parents=True)
    assert [hub_id(name) for name in ("wmt/wmt14", "wmt14", "Helsinki-NLP/opus-mt-en-de")] == [
        "wmt/wmt14",
        "wmt14",
        "Helsinki-NLP/opus-mt-en-de",
    ]
    local = ["data/m30k", "./m30k", "~/m30k", str(tmp_path / "absent"), "a/b/c", "not an id", EMBEDDED_TASK, None]
    assert [hub_id(name) for name in local] == [None] * len(local)


def written_card(card: ModelCard, folder) -> ModelCard:
    """The card as the Hub reads it: written to README.md and loaded back with huggingface_hub."""
    folder.mkdir(exist_ok=True)
    card.save(folder / "README.md")
    return ModelCard.load(folder / "README.md")


def check_metadata(data: ModelCardData) -> None:
    """What huggingface_hub's own classes make of the metadata: the model-index parses into the same EvalResults
    and back, and ModelCardData reproduces the metadata (what the Hub's validator parses)."""
    name, results = model_index_to_eval_results(data.to_dict()["model-index"])
    assert eval_results_to_model_index(name, results) == data.to_dict()["model-index"]
    assert all(isinstance(result, EvalResult) for result in results) and results == data.eval_results
    assert ModelCardData(**data.to_dict()).to_dict() == data.to_dict()


def test_card_of_the_embedded_task_lists_no_languages_or_datasets(tmp_path):
    results = {
        "bleu": 97.123,
        "chrf": 98.5,
        "bleu_signature": "nrefs:1|case:mixed|tok:13a",
        "data": EMBEDDED_TASK,
        "dataset_id": None,
        "split": "test",
        "source_lang": "date",
        "target_lang": "iso",
        "sentences": 1000,
        "generation": {"num_beams": 4, "length_penalty": 0.6},
    }
    card = written_card(model_card(tiny_model(), "me/dates", results), tmp_path)
    data = card.data
    assert data.language is None and data.datasets is None and data.base_model is None
    assert "base_model_relation" not in data.to_dict()
    assert data.eval_results[0].dataset_name == EMBEDDED_TASK and data.eval_results[0].metric_value == 97.12
    assert data.eval_results[0].dataset_type == "embedded-dates-task"
    assert "the embedded dates task of modeling-attn (`training/synthetic.py`)" in card.text
    assert "(1000 sentences, date -> iso)" in card.text  # the pair, in words
    check_metadata(data)


def test_card_of_a_fine_tuned_model_on_hub_data(tmp_path):
    results = {
        "bleu": 31.0,
        "chrf": 58.25,
        "bleu_signature": "sig",
        "data": "wmt/wmt14",
        "split": "test",
        "source_lang": "de",
        "target_lang": "en",
        "sentences": 3003,
    }
    model = tiny_model()
    model.generation_config = paper_generation_config(model)
    card = model_card(model, "me/m", results, base_model="me/base", origin="fine-tuned from [me/base](x)")
    data = written_card(card, tmp_path).data
    assert (data.language, data.datasets, data.base_model) == (["de", "en"], ["wmt/wmt14"], "me/base")
    assert data.to_dict()["base_model_relation"] == "finetune"
    assert {result.dataset_type for result in data.eval_results} == {"wmt/wmt14"}
    text = ModelCard.load(tmp_path / "README.md").text
    assert "- Base model: fine-tuned from [me/base](x)" in text
    assert "[wmt/wmt14](https://huggingface.co/datasets/wmt/wmt14) (de -> en)" in text
    # The card states the decoding that generation_config.json holds.
    assert "beam search with 4 beams, length penalty 0.6, at most source length + 50 tokens per sentence" in text
    check_metadata(data)


def test_base_model_follows_local_folders_to_the_hub_model_they_came_from(tmp_path):
    """A converted OPUS-MT folder, a model fine-tuned from it (both local): the card's base_model is the Marian
    model's Hub id; a local source with no recorded origin gives none, and its name only in the text."""
    converted, finetuned, scratch = (tmp_path / name for name in ("en-de", "en-de-ft", "scratch"))
    for folder in (converted, finetuned, scratch):
        folder.mkdir()
    record_origin(converted, "Helsinki-NLP/opus-mt-en-de", "converted from the Marian model")
    record_origin(finetuned, converted, "fine-tuned from")
    assert json.loads((finetuned / "origin.json").read_text())["source"] == str(converted.resolve())
    assert model_origin(converted) == (
        "Helsinki-NLP/opus-mt-en-de",
        "converted from the Marian model "
        "[Helsinki-NLP/opus-mt-en-de](https://huggingface.co/Helsinki-NLP/opus-mt-en-de)",
    )
    base, text = model_origin(finetuned)
    assert base == "Helsinki-NLP/opus-mt-en-de"
    assert text == "fine-tuned from en-de (a local folder), which was " + model_origin(converted)[1]
    (tmp_path / "scratch-ft").mkdir()
    record_origin(tmp_path / "scratch-ft", scratch, "fine-tuned from")
    assert model_origin(tmp_path / "scratch-ft") == (None, "fine-tuned from scratch (a local folder)")
    assert model_origin(scratch) == (None, None)


def test_pushed_card_of_a_converted_model_names_its_base_model(tmp_path):
    """save_for_hub (what `attn push` uploads) of a folder with origin.json: base_model in the card's metadata."""
    folder = save_tiny_model(tmp_path / "model", "attn_transformer")
    record_origin(folder, "Helsinki-NLP/opus-mt-en-de", "converted from the Marian model")
    card = ModelCard.load(save_for_hub(folder, tmp_path / "hub", "me/converted") / "README.md")
    assert card.data.base_model == "Helsinki-NLP/opus-mt-en-de"
    assert card.data.to_dict()["base_model_relation"] == "finetune"
    assert "- Base model: converted from the Marian model [Helsinki-NLP/opus-mt-en-de]" in card.text


@pytest.mark.slow
def test_pushed_files_are_what_a_hub_user_needs(hub):
    for model_type, folder in hub["folders"].items():
        names = {path.name for path in folder.iterdir()}
        code = {"modeling_transformer.py"} if model_type == "attn_transformer" else {"modeling_rnn.py"}
        assert {
            "model.safetensors",
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "README.md",
            "pipeline_translation.py",
            "generation.py",
            "loading.py",
            *code,
        } <= names
        assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in names)
        config = json.loads((folder / "config.json").read_text())
        assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
        assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_translation.TranslationPipeline"
        assert config["custom_pipelines"]["translation"]["pt"] == ["AutoModelForSeq2SeqLM"]
        generation = json.loads((folder / "generation_config.json").read_text())
        # the decoding the card's scores were measured with (`attn evaluate --num_beams 4 --length_penalty 0.6` of a
        # model whose generation config had max_new_tokens 6): a fixed limit of 7 in place of the paper's source + 50
        assert (
            generation["num_beams"],
            generation["length_penalty"],
            generation["max_length_over_source"],
            generation["max_length"],
            generation["early_stopping"],
        ) == (4, 0.6, None, 7, True)
        assert "max_new_tokens" not in generation


@pytest.mark.slow
def test_remote_code_loads_and_translates_like_the_original(hub, remote):
    for model_type in REPOS:
        got, expected = remote[model_type], hub["expected"][model_type]
        assert got["class"].startswith("transformers_modules.")  # the repository's code, not an installed package
        assert got["translations"] == expected
        assert got["pipeline"] == expected
        assert got["pipeline_single"] == expected[0]
        assert got["generation"] == {  # as measured (see test_pushed_files_are_what_a_hub_user_needs)
            "num_beams": 4,
            "length_penalty": 0.6,
            "max_length_over_source": None,
            "early_stopping": True,
        }
    assert len(set(hub["expected"]["attn_transformer"])) > 1  # the random model does not translate all alike


@pytest.mark.slow
def test_revision_and_code_revision_load_what_they_name(hub, remote):
    assert hub["expected"]["v2"] != hub["expected"]["attn_transformer"]  # other weights translate differently
    assert remote["v2"]["translations"] == hub["expected"]["v2"]
    assert remote["v2"]["code_marker"] == "v2"  # the code of branch v2
    assert remote["v2_pinned_code"]["translations"] == hub["expected"]["v2"]  # weights of v2 ...
    assert remote["v2_pinned_code"]["code_marker"] is None  # ... with the code of the pinned main commit


@pytest.mark.slow
def test_pickle_weights_are_refused_unless_allowed(remote):
    message = remote["pickle_refused"]
    assert message is not None and "org/pickled" in message
    assert "pytorch_model.bin" in message and "use_safetensors=False" in message
    assert remote["pickle_allowed_class"] == "AttnTransformerForConditionalGeneration"


@pytest.mark.slow
def test_config_of_another_model_type_is_a_clear_error(hub, remote):
    assert "model_type 'attn_transformer'" in remote["wrong_type"] and "'attn_rnn'" in remote["wrong_type"]
    folder = hub["folders"]["attn_transformer"]
    with pytest.raises(ValueError, match=r"model_type 'attn_transformer', but AttnRNNConfig reads 'attn_rnn'"):
        AttnRNNForConditionalGeneration.from_pretrained(folder)
    bin_only = folder.parent / "bin-only"
    shutil.copytree(folder, bin_only, ignore=shutil.ignore_patterns("model.safetensors"))
    torch.save(AutoModelForSeq2SeqLM.from_pretrained(folder).state_dict(), bin_only / "pytorch_model.bin")
    with pytest.raises(OSError, match="use_safetensors=False"):
        AttnTransformerForConditionalGeneration.from_pretrained(bin_only)


@pytest.mark.slow
def test_model_card_metadata_holds_the_evaluation(hub, remote):
    for model_type, folder in hub["folders"].items():
        card = ModelCard.load(folder / "README.md")
        data = card.data
        assert data.library_name == "transformers" and data.pipeline_tag == "translation"
        assert data.license == "apache-2.0" and data.language == ["en", "de"]
        assert model_type in data.tags and "translation" in data.tags
        assert data.metrics == ["bleu", "chrf"] and data.datasets is None  # a local folder is no Hub dataset
        results = hub["results"][model_type]
        expected = {"bleu": round(results["bleu"], 2), "chrf": round(results["chrf"], 2)}
        assert {r.metric_type: r.metric_value for r in data.eval_results} == expected
        assert remote[model_type]["card_results"] == expected  # the same card, read from the server
        # The metadata survives a round trip through ModelCardData (what the Hub's validator parses).
        assert ModelCardData(**data.to_dict()).to_dict() == data.to_dict()
        assert "More Information Needed" not in card.text.split("## Limitations")[0]
        assert f"{results['bleu']:.2f}" in card.text and results["bleu_signature"] in card.text
        assert (
            read_results(hub["folders"][model_type].parent / f"{model_type}-results.json")["bleu"] == results["bleu"]
        )


@pytest.mark.slow
def test_translation_pipeline_locally_batched(hub):
    folder = hub["folders"]["attn_rnn"]
    translator = pipeline("translation", model=str(folder), trust_remote_code=True)
    expected = hub["expected"]["attn_rnn"]
    # A list gives a flat list (one translation each, as transformers 4); an iterable streams one list per sentence.
    assert [r["translation_text"] for r in translator(SENTENCES, batch_size=3)] == expected
    assert [r[0]["translation_text"] for r in translator((s for s in SENTENCES), batch_size=2)] == expected
    several = translator(SENTENCES[:2], num_beams=3, num_return_sequences=2)
    assert [len(r) for r in several] == [2, 2]
    with pytest.raises(TypeError, match="expected a string"):
        translator(42)
    with pytest.raises(ValueError, match="return_dict_in_generate is not supported"):
        translator(SENTENCES[0], return_dict_in_generate=True)


@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
def test_translation_pipeline_on_any_saved_folder(model_type, tmp_path):
    """`save_pretrained` alone (what `attn train` writes) carries the pipeline: transformers 5 refuses the task
    name "translation" unless the folder's config lists a pipeline for it."""
    folder = save_tiny_model(tmp_path / model_type, model_type)
    config = json.loads((folder / "config.json").read_text())
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_translation.TranslationPipeline"
    assert (folder / "pipeline_translation.py").is_file()
    translator = pipeline("translation", model=str(folder), trust_remote_code=True)
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    expected = translate_batch(model, tokenizer, SENTENCES)[0]
    assert [r["translation_text"] for r in translator(SENTENCES, batch_size=2)] == expected
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("translation", model=str(folder))


def test_translations_stop_at_source_length_plus_offset():
    limit = SourceLengthLimit(torch.tensor([3, 5]), eos_token_id=2)
    scores = torch.zeros(4, 6)  # 2 sentences x 2 beams, vocabulary of 6
    # 2 tokens generated after the start token: the first sentence (limit 3) must end now, the second need not.
    forced = limit(torch.ones(4, 3, dtype=torch.long), scores)
    assert torch.equal(forced[:2].argmax(-1), torch.tensor([2, 2])) and (forced[:2, [0, 1, 3, 4, 5]] < -1e30).all()
    assert torch.equal(forced[2:], scores[2:])


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_limits_each_sentence_to_its_source_length_plus_offset(num_beams):
    model = tiny_model()
    model.generation_config.update(num_beams=num_beams, eos_token_id=2, pad_token_id=0)
    model.generation_config.max_length_over_source = 3  # not a GenerationConfig field: `update` would ignore it
    input_ids, attention_mask, _ = padded_batch(batch=3, source_length=7)
    with torch.no_grad():
        batched = model.generate(input_ids=input_ids, attention_mask=attention_mask)
        alone = [model.generate(input_ids=input_ids[r : r + 1, : int(attention_mask[r].sum())]) for r in range(3)]
    at_limit = 0
    for row, length in enumerate(attention_mask.sum(-1).tolist()):
        tokens = batched[row, 1:].tolist()
        tokens = tokens[: tokens.index(2) + 1] if 2 in tokens else tokens  # up to the end token (then filler)
        assert 1 <= len(tokens) <= length + 3
        assert tokens[-1] == 2  # ended by the end token, forced at the limit if not before
        assert alone[row][0, 1:].tolist()[: len(tokens)] == tokens  # the limit is per sentence, not per batch
        at_limit += len(tokens) == length + 3
    assert at_limit > 0  # the untrained model runs on: the limit, not the model, ended some sentences
    # An explicit max_new_tokens takes precedence over the per-sentence limit.
    with torch.no_grad():
        assert model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=2).shape[1] <= 3


@pytest.mark.parametrize("num_beams", [1, 3])
def test_the_source_relative_limit_stops_at_the_end_of_the_position_table(num_beams):
    """Source length + 50 would run the decoder past a 12-position table (a ValueError mid-generation); the limit is
    capped at the table instead, and an untrained model that never ends on its own is stopped there."""
    model = tiny_model(max_position_embeddings=12)
    model.generation_config.update(num_beams=num_beams, eos_token_id=2, pad_token_id=0)
    model.generation_config.max_length_over_source = 50
    input_ids, attention_mask, _ = padded_batch(batch=3, source_length=7)
    with torch.no_grad():
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask)
    assert output.shape[1] <= 12 + 1  # the decoder start token and at most 12 tokens
    lengths = [row[1:].tolist().index(2) + 1 for row in output]  # every translation ends with the end token
    assert max(lengths) == 12  # ... and the cap, not the model, ended at least one
    with torch.no_grad(), pytest.raises(ValueError, match="exceeds max_position_embeddings=12"):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=13, min_new_tokens=13)


def test_a_missing_shard_is_not_reported_as_missing_safetensors(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    shards[-1].unlink()
    with pytest.raises(OSError) as error:
        AttnTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert shards[-1].name in str(error.value) and "use_safetensors=False" not in str(error.value)


@pytest.mark.slow
@pytest.mark.skipif(
    get_token() is None,
    reason="no Hub token configured (HF_TOKEN or `hf auth login`): the upload to the real Hub is opt-in",
)
def test_push_to_the_real_hub(hub, tmp_path):
    from huggingface_hub import HfApi

    api = HfApi()
    repo_id = f"{api.whoami()['name']}/modeling-attn-test-{tmp_path.name[-8:]}"
    try:
        url = push_to_hub(hub["folders"]["attn_rnn"], repo_id, private=True)
        assert repo_id in url
        assert {"model.safetensors", "README.md", "pipeline_translation.py"} <= set(api.list_repo_files(repo_id))
    finally:
        api.delete_repo(repo_id, missing_ok=True)


def test_a_results_file_that_is_not_a_json_object_of_scores_is_named(tmp_path):
    """`attn push --results FILE`: a file that is not UTF-8, not JSON or not an object is named.

    The message says what it should be.
    """
    cases = {
        "binary.json": (b"\x92\xff\x00", r"binary\.json: the evaluation results .* is not UTF-8 text"),
        "table.tsv": (
            b"a\tb\n",
            r"table\.tsv: the evaluation results .* is not valid JSON \(Expecting value at line 1, column 1\)",
        ),
        "list.json": (
            b"[1, 2]",
            r"list\.json: a JSON list, not an object of scores; expected the JSON of `attn evaluate",
        ),
        "empty.json": (b"{}", r"empty\.json: no 'bleu' or 'test_bleu' score"),
        "partial.json": (b'{"bleu_lc_tok": 40.1}', r"partial\.json: cannot read its scores \(KeyError: 'direction'\)"),
        "words.json": (b'{"bleu": "high"}', r"words\.json: cannot read its scores \(ValueError: could not convert"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ResultsError, match=message):  # a UserError, and a ValueError for Python callers
            read_results(tmp_path / name)


def test_attn_push_with_a_results_file_that_is_not_json_is_one_line(tmp_path, capsys):
    save_tiny_model(tmp_path / "model", "attn_transformer")
    (tmp_path / "results.json").write_text("BLEU = 40.1")
    results = tmp_path / "results.json"
    argv = ["push", "--model", str(tmp_path / "model"), "--repo-id", "me/m", "--results", str(results)]
    assert attn([*argv, "--save-to", str(tmp_path / "card")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"attn push: error: {results}: the evaluation results (the JSON of `attn evaluate --output`) is not valid "
        "JSON (Expecting value at line 1, column 1)"
    )


@pytest.mark.parametrize("offline", [False, True], ids=["no-network", "HF_HUB_OFFLINE"])
def test_push_to_hub_with_no_hub_is_one_user_error_line_at_once(offline, tmp_path, monkeypatch):
    """The README's Python `push_to_hub` on a machine with no network (`HF_ENDPOINT` at a closed loopback port) or
    with the Hub switched off: one `UserError` in one line that names the Hub and the way out, as `attn push` says
    it, within seconds, with no HTTP client's traceback chained to it."""
    save_tiny_model(tmp_path / "model", "attn_transformer")
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    started = time.monotonic()
    with pytest.raises(HubUnreachableError) as raised:  # a UserError, and a ConnectionError for Python callers
        push_to_hub(tmp_path / "model", "me/dates", token="hf_unused")
    assert time.monotonic() - started < 15
    expected = (
        r"the Hub is switched off \(HF_HUB_OFFLINE\) \(.*\)"
        if offline
        else rf"the Hub \({endpoint}\) could not be reached: .+; check the network or HF_ENDPOINT"
    )
    assert re.fullmatch(expected, str(raised.value)), str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
