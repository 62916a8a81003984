"""The translation metrics as offline `evaluate` modules (modeling_attn/api/evaluate_modules/, modeling_attn/api/
metrics.py), evaluate's TranslationEvaluator over the translation pipeline, and the lines of docs/evaluate.md.

Reference checks: each module's scores and signature equal sacreBLEU called directly with the same settings (what
`attn evaluate` computed before the modules existed: today's numbers), as a module object and through
`evaluate.load(path)` in a fresh offline process; `attn evaluate`'s JSON equals the modules'; the Multi30k module
equals sacremoses + sacreBLEU run by hand; TranslationEvaluator on the pipeline gives exactly the BLEU `attn evaluate`
gives, on Multi30k test2016 lines with a model trained here and on a trained Marian model and its conversion; the
six lines of docs/evaluate.md run as written, offline, and print that BLEU too.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from marian_tiny import SENTENCES as MARIAN_SENTENCES
from marian_tiny import marian_tokenizer, random_marian
from multi30k_data import MULTI30K, needs_multi30k
from sacrebleu.metrics import BLEU, CHRF, TER
from sacremoses import MosesPunctNormalizer, MosesTokenizer
from tasks import one_thread
from tiny import two_layers
from transformers import pipeline

from modeling_attn import AttnTransformerConfig, AttnTransformerForConditionalGeneration
from modeling_attn.api.corpus import read_lines
from modeling_attn.api.metrics import MODULES, load_metric, module_path, translation_scores
from modeling_attn.cli.main import main as attn

ROOT = Path(__file__).resolve().parent.parent

HYPOTHESES = ["The cat sat on a mat .", "a big dog barked", "", "Zwei Hunde spielen im Schnee.", "Ein Mann fährt Rad"]
REFERENCES = [
    "the cat sat on the mat .",
    "a dog barked",
    "ein Hund",
    "Zwei Hunde spielen im Schnee .",
    "Ein Mann fährt ein rotes Rad.",
]
SECOND_REFERENCES = ["The cat is on the mat.", "A big dog barks.", "a dog", "Zwei Hunde im Schnee.", "Ein Mann."]


def corpus(metric, references: list[list[str]]) -> dict:
    """sacreBLEU itself, on reference streams (each holds every prediction's i-th reference)."""
    score = metric.corpus_score(HYPOTHESES, references)
    return {"score": score.score, "signature": str(metric.get_signature())}


# the module, its compute settings, and sacreBLEU's metric object with the same settings
CASES = [
    ("sacrebleu", {}, BLEU()),
    ("sacrebleu", {"lowercase": True}, BLEU(lowercase=True)),
    (
        "sacrebleu",
        {"tokenize": "intl", "smooth_method": "floor", "smooth_value": 0.2},
        BLEU(tokenize="intl", smooth_method="floor", smooth_value=0.2),
    ),
    ("sacrebleu", {"use_effective_order": True, "tokenize": "char"}, BLEU(effective_order=True, tokenize="char")),
    ("chrf", {}, CHRF()),
    ("chrf", {"word_order": 2, "lowercase": True}, CHRF(word_order=2, lowercase=True)),
    ("chrf", {"char_order": 4, "beta": 1, "eps_smoothing": True}, CHRF(char_order=4, beta=1, eps_smoothing=True)),
    ("ter", {}, TER()),  # case-insensitive, as the Hub's evaluate-metric/ter
    ("ter", {"case_sensitive": True}, TER(case_sensitive=True)),
    ("ter", {"normalized": True, "ignore_punct": True}, TER(normalized=True, no_punct=True)),
]


@pytest.mark.parametrize(("name", "settings", "reference"), CASES)
def test_modules_give_sacrebleus_scores_and_signatures(name, settings, reference):
    metric = load_metric(name)
    result = metric.compute(predictions=HYPOTHESES, references=REFERENCES, **settings)
    assert {key: result[key] for key in ("score", "signature")} == corpus(reference, [REFERENCES])
    several = [[first, second] for first, second in zip(REFERENCES, SECOND_REFERENCES, strict=True)]
    result = metric.compute(predictions=HYPOTHESES, references=several, **settings)
    assert {key: result[key] for key in ("score", "signature")} == corpus(reference, [REFERENCES, SECOND_REFERENCES])
    assert "nrefs:2" in result["signature"]


def test_result_keys_are_the_hub_modules_plus_the_signature():
    keys = {
        "sacrebleu": ["score", "counts", "totals", "precisions", "bp", "sys_len", "ref_len"],
        "chrf": ["score", "char_order", "word_order", "beta"],
        "ter": ["score", "num_edits", "ref_length"],
        "multi30k_bleu": ["score", "counts", "totals", "precisions", "bp", "sys_len", "ref_len"],
    }
    for name, expected in keys.items():
        extra = {"lang": "de"} if name == "multi30k_bleu" else {}
        result = load_metric(name).compute(predictions=HYPOTHESES, references=REFERENCES, **extra)
        assert list(result) == [*expected, "signature"], name
    bleu = BLEU().corpus_score(HYPOTHESES, [REFERENCES])
    result = load_metric("sacrebleu").compute(predictions=HYPOTHESES, references=REFERENCES)
    assert (result["counts"], result["totals"], result["bp"], result["sys_len"], result["ref_len"]) == (
        bleu.counts,
        bleu.totals,
        bleu.bp,
        bleu.sys_len,
        bleu.ref_len,
    )


def test_settings_given_at_load_are_defaults_and_bad_input_is_named():
    lowered = load_metric("sacrebleu", lowercase=True)  # what an evaluator, which passes no settings, then uses
    assert lowered.compute(predictions=HYPOTHESES, references=REFERENCES) == load_metric("sacrebleu").compute(
        predictions=HYPOTHESES, references=REFERENCES, lowercase=True
    )
    cased = lowered.compute(predictions=HYPOTHESES, references=REFERENCES, lowercase=False)  # the call wins
    assert cased["score"] == BLEU().corpus_score(HYPOTHESES, [REFERENCES]).score
    with pytest.raises(TypeError, match=r"Sacrebleu: unknown arguments \['lowercas'\]"):
        load_metric("sacrebleu", lowercas=True)
    with pytest.raises(ValueError, match="no metric module 'bleu'; the modules are sacrebleu, chrf, ter"):
        module_path("bleu")
    with pytest.raises(ValueError, match="chrf: no predictions to score"):
        load_metric("chrf").compute(predictions=[], references=[])
    with pytest.raises(ValueError, match=r"ter: every prediction needs the same number .* got \[1, 2\]"):
        load_metric("ter").compute(predictions=["a", "b"], references=[["a"], ["b", "c"]])
    with pytest.raises(ValueError, match="multi30k_bleu: give lang"):
        load_metric("multi30k_bleu").compute(predictions=["a"], references=["a"])


_LOAD_OFFLINE = """
import json, sys
import evaluate
from modeling_attn.api.metrics import MODULES, module_path
hypotheses, references = json.loads(sys.argv[1])
out = {}
for name in MODULES:
    metric = evaluate.load(module_path(name))
    extra = {"lang": "de"} if name == "multi30k_bleu" else {}
    out[name] = {"class": type(metric).__name__, "result": metric.compute(predictions=hypotheses,
                 references=references, **extra)}
lowered = evaluate.load(module_path("sacrebleu"), lowercase=True)
out["lowercase"] = lowered.compute(predictions=hypotheses, references=references)
try:
    evaluate.load("sacrebleu")
except Exception as error:  # what the Hub module gives with no network
    out["hub"] = type(error).__name__
print(json.dumps(out))
"""


@pytest.mark.slow
def test_evaluate_load_of_the_module_paths_works_offline(tmp_path):
    """`evaluate.load(module_path(name))` in a fresh process with an empty HF cache and every offline switch on,
    where `evaluate.load("sacrebleu")` fails: the same numbers as the module objects."""
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_OFFLINE": "1",
        "HF_EVALUATE_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    argv = [sys.executable, "-c", _LOAD_OFFLINE, json.dumps([HYPOTHESES, REFERENCES])]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for name, class_name in MODULES.items():
        extra = {"lang": "de"} if name == "multi30k_bleu" else {}
        expected = load_metric(name).compute(predictions=HYPOTHESES, references=REFERENCES, **extra)
        assert out[name] == {"class": class_name, "result": json.loads(json.dumps(expected))}, name
    assert out["lowercase"]["score"] == BLEU(lowercase=True).corpus_score(HYPOTHESES, [REFERENCES]).score
    assert out["hub"] in {"FileNotFoundError", "ConnectionError"}
    copied = {path.name for path in (tmp_path / "hf_home" / "modules").rglob("*.py")}
    assert {f"{name}.py" for name in MODULES} | {"_common.py"} <= copied  # evaluate's copies, in the given HF_HOME


def sacrebleu_today(hypotheses, references, lowercase: bool) -> dict:
    """What `translation_scores` computed before the modules: sacreBLEU's metric objects called directly."""
    bleu, chrf, ter = BLEU(lowercase=lowercase), CHRF(lowercase=lowercase), TER(case_sensitive=not lowercase)
    hypotheses, references = [h.strip() for h in hypotheses], [r.strip() for r in references]
    if lowercase:
        hypotheses, references = [h.lower() for h in hypotheses], [r.lower() for r in references]
    return {
        "bleu": bleu.corpus_score(hypotheses, [references]).score,
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "ter": ter.corpus_score(hypotheses, [references]).score,
        "exact_match": 100.0 * sum(h == r for h, r in zip(hypotheses, references, strict=True)) / len(references),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "ter_signature": str(ter.get_signature()),
    }


@pytest.mark.parametrize("lowercase", [False, True])
def test_attn_evaluate_gives_todays_numbers_through_the_modules(tmp_path, capsys, lowercase):
    hypotheses, references = [*HYPOTHESES, " Zwei  Hunde "], [*REFERENCES, "zwei Hunde"]
    (tmp_path / "hyp.txt").write_text("\n".join(hypotheses) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(references) + "\n")
    argv = ["evaluate", "--hypotheses_file", str(tmp_path / "hyp.txt"), "--references_file", str(tmp_path / "ref.txt")]
    assert attn(argv + (["--lowercase"] if lowercase else [])) == 0
    printed = json.loads(capsys.readouterr().out)
    today = sacrebleu_today(hypotheses, references, lowercase)
    assert {key: printed[key] for key in today} == today == translation_scores(hypotheses, references, lowercase)
    stripped = [h.strip() for h in hypotheses], [r.strip() for r in references]
    if lowercase:
        stripped = [h.lower() for h in stripped[0]], [r.lower() for r in stripped[1]]
    ter = load_metric("ter").compute(predictions=stripped[0], references=stripped[1], case_sensitive=not lowercase)
    assert (printed["ter"], printed["ter_signature"]) == (ter["score"], ter["signature"])


def test_translation_scores_builds_its_metrics_once_and_is_thread_safe():
    from modeling_attn.api import metrics

    assert metrics._scorers() is metrics._scorers()  # compute_metrics runs at every evaluation
    inputs = [([f"{h} {i}" for h in HYPOTHESES], [f"{r} {i}" for r in REFERENCES]) for i in range(6)]
    expected = [sacrebleu_today(h, r, lowercase=False) for h, r in inputs]
    results: list[dict | None] = [None] * len(inputs)

    def score(index: int) -> None:
        for _ in range(3):
            results[index] = translation_scores(*inputs[index])

    threads = [threading.Thread(target=score, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == expected


def moses_bleu(hypotheses, reference_streams, lang: str) -> float:
    """multi-bleu.perl on lowercased Moses tokens, by hand: sacremoses' normalizer and tokenizer, sacreBLEU's
    unsmoothed BLEU on whitespace tokens."""
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)

    def tokens(lines):
        return [
            tokenizer.tokenize(normalizer.normalize(line.strip().lower()), escape=True, return_str=True)
            for line in lines
        ]

    streams = [tokens(stream) for stream in reference_streams]
    return BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(tokens(hypotheses), streams).score


def test_multi30k_bleu_module_is_moses_lowercased_tokenized_bleu():
    result = load_metric("multi30k_bleu").compute(predictions=HYPOTHESES, references=REFERENCES, lang="de")
    assert result["score"] == moses_bleu(HYPOTHESES, [REFERENCES], "de") and 0 < result["score"] < 100
    assert result["signature"].startswith("lc+moses-norm+moses-tok(de,escape,no -a) [sacremoses]|nrefs:1|case:mixed")
    several = [[first, second] for first, second in zip(REFERENCES, SECOND_REFERENCES, strict=True)]
    result = load_metric("multi30k_bleu", lang="de").compute(predictions=HYPOTHESES, references=several)
    assert result["score"] == moses_bleu(HYPOTHESES, [REFERENCES, SECOND_REFERENCES], "de")


@needs_multi30k
def test_multi30k_bleu_module_on_test2016_lines():
    """On the raw Multi30k test2016 references, with hypotheses that drop every fifth word: the module, the bench
    command's function, and sacremoses + sacreBLEU by hand agree."""
    from bench.multi30k.bleu import lowercased_tokenized_bleu

    references = read_lines(MULTI30K / "test_2016_flickr.de.gz")[:300]
    hypotheses = [" ".join(w for i, w in enumerate(line.split()) if i % 5 != 4) for line in references]
    result = load_metric("multi30k_bleu").compute(predictions=hypotheses, references=references, lang="de")
    assert result["score"] == moses_bleu(hypotheses, [references], "de")
    assert result["score"] == lowercased_tokenized_bleu(hypotheses, references, "de")[0].score
    assert 20 < result["score"] < 90


# -- evaluate's TranslationEvaluator on the pipeline, against `attn evaluate` ------------------------------------


def train_multi30k_model(folder: Path, pairs: int = 2000, steps: int = 300) -> Path:
    """A small attn_transformer trained for `steps` Adam steps on the first `pairs` Multi30k en-de training pairs
    (read in place), with a BPE tokenizer learnt on them; saved with greedy decoding of at most 20 tokens."""
    from modeling_attn.training.tokenizer import train_bpe_tokenizer

    sources = read_lines(MULTI30K / "train.en.gz")[:pairs]
    targets = read_lines(MULTI30K / "train.de.gz")[:pairs]
    tokenizer = train_bpe_tokenizer(sources + targets, vocab_size=600)
    torch.manual_seed(0)
    config = AttnTransformerConfig(
        vocab_size=len(tokenizer),
        **two_layers(32),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    model = AttnTransformerForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    model.train()
    with one_thread():
        for _ in range(steps):
            rows = torch.randint(0, pairs, (32,), generator=generator).tolist()
            batch = tokenizer(
                [sources[r] for r in rows],
                text_target=[targets[r] for r in rows],
                padding=True,
                return_tensors="pt",
                return_token_type_ids=False,
            )
            batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
            loss = model(**batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval().generation_config.update(num_beams=1, max_new_tokens=20)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def multi30k_model(tmp_path_factory) -> Path:
    if not (MULTI30K / "train.en.gz").is_file():
        pytest.skip(needs_multi30k.kwargs["reason"])
    return train_multi30k_model(tmp_path_factory.mktemp("multi30k") / "m30k-en-de")


def attn_evaluate(capsys, *argv: str) -> dict:
    assert attn(["evaluate", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def multi30k_test(model: Path) -> list[str]:
    """The flags of `attn evaluate` that score `model` on the Multi30k en-de test split."""
    en_de_test = shlex.split("--source_lang en --target_lang de --split test")
    return ["--model", str(model), "--data", str(MULTI30K), *en_de_test]


def evaluator_bleu(
    model_or_pipeline, sources: list[str], references: list[str], task: str = "translation", **compute
) -> dict:
    """evaluate's TranslationEvaluator with our sacrebleu module: `evaluate.evaluator("translation")`, or one built
    for a task name `translation_XX_to_YY` (evaluate's factory knows only "translation")."""
    import evaluate
    from evaluate.evaluator import TranslationEvaluator

    data = Dataset.from_dict({"text": sources, "label": references})
    evaluator = evaluate.evaluator(task) if task == "translation" else TranslationEvaluator(task=task)
    return evaluator.compute(
        model_or_pipeline=model_or_pipeline, data=data, metric=load_metric("sacrebleu"), **compute
    )


@pytest.mark.slow
def test_translation_evaluator_gives_attn_evaluates_bleu_on_multi30k(multi30k_model, capsys):
    """100 test2016 pairs. One sentence per generate() call: the evaluator given the folder (task
    translation_en_to_de: for "translation", transformers wants trust_remote_code=True on a folder whose config names
    its pipeline, and the evaluator cannot pass it) or model objects, and `attn evaluate --batch_size 1`. 32 per
    call: an evaluator whose pipeline batches 32 sentences, and `attn evaluate`'s default batches. Same BLEU, same
    signature."""
    import evaluate
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    count = 100
    sources = read_lines(MULTI30K / "test_2016_flickr.en.gz")[:count]
    references = read_lines(MULTI30K / "test_2016_flickr.de.gz")[:count]
    argv = [*multi30k_test(multi30k_model), "--max_samples", str(count)]
    with one_thread():
        one_by_one = attn_evaluate(capsys, *argv, "--batch_size", "1")
        batched = attn_evaluate(capsys, *argv)
        assert one_by_one["sentences"] == count and 0 < batched["bleu"] < 50
        expected = {"score": one_by_one["bleu"], "signature": one_by_one["bleu_signature"]}
        from_folder = evaluator_bleu(str(multi30k_model), sources, references, task="translation_en_to_de")
        assert {key: from_folder[key] for key in expected} == expected
        model = AutoModelForSeq2SeqLM.from_pretrained(multi30k_model)
        tokenizer = AutoTokenizer.from_pretrained(multi30k_model)
        from_objects = evaluator_bleu(model, sources, references, tokenizer=tokenizer)
        assert {key: from_objects[key] for key in expected} == expected
        # evaluate 0.4.6 takes no pipeline object under transformers 5 (it reads transformers.TFPreTrainedModel):
        # batches come from the evaluator's own pipeline arguments, set on the instance (docs/evaluate.md).
        evaluator = evaluate.evaluator("translation")
        evaluator.PIPELINE_KWARGS = {"truncation": True, "batch_size": 32}
        data = Dataset.from_dict({"text": sources, "label": references})
        result = evaluator.compute(
            model_or_pipeline=model, tokenizer=tokenizer, data=data, metric=load_metric("sacrebleu")
        )
        assert result["score"] == batched["bleu"]
        assert evaluate.evaluator("translation").PIPELINE_KWARGS == {"truncation": True}  # the class's, unchanged
        hypotheses = [
            r["translation_text"] for r in pipeline("translation", model=model, tokenizer=tokenizer)(sources)
        ]
    assert len(set(hypotheses)) > count // 2  # the translations depend on the source


def train_marian_copier(folder: Path, steps: int = 120) -> Path:
    """The OPUS-MT-style tiny Marian model (marian_tiny.py: real SentencePiece MarianTokenizer) trained to copy
    marian_tiny.SENTENCES (about 100 steps learn it), saved as an OPUS-MT checkpoint is."""
    tokenizer = marian_tokenizer(folder.with_name(folder.name + "-spm"))
    model = random_marian(
        0,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        weight_std=0.02,
        d_model=32,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
    )
    batch = tokenizer(MARIAN_SENTENCES, text_target=MARIAN_SENTENCES, padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    with one_thread():
        for _ in range(steps):
            loss = model(**batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval().generation_config.update(num_beams=2, max_new_tokens=20)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_translation_evaluator_gives_attn_evaluates_bleu_on_a_converted_marian_model(tmp_path, capsys):
    """A trained MarianMTModel (transformers' class) and its `attn convert --from-marian` conversion
    (attn_transformer, same MarianTokenizer), scored on the trained sentences and on new word orders of them."""
    marian = train_marian_copier(tmp_path / "marian")
    assert attn(["convert", "--from-marian", str(marian), "--to", str(tmp_path / "converted")]) == 0
    capsys.readouterr()
    shuffled = [" ".join(reversed(sentence.split())) for sentence in MARIAN_SENTENCES]
    sources = [*MARIAN_SENTENCES, *shuffled]
    (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(sources) + "\n")
    files = ["--sources_file", str(tmp_path / "src.txt"), "--references_file", str(tmp_path / "ref.txt")]
    scores = set()
    with one_thread():
        for folder in (marian, tmp_path / "converted"):
            scores.add(score_both_ways(folder, marian, sources, files, capsys))
    (score,) = scores  # the conversion translates as Marian does
    assert 20 < score < 100


def score_both_ways(folder: Path, marian: Path, sources: list[str], files: list[str], capsys) -> float:
    """`attn evaluate` of the folder, and the evaluator under both task names (model objects where the folder names
    its own pipeline); asserts they agree and returns the BLEU."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    printed = attn_evaluate(capsys, "--model", str(folder), *files, "--batch_size", "1")
    for task in ("translation", "translation_en_to_de"):
        if task == "translation" and folder != marian:
            model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
            result = evaluator_bleu(model, sources, sources, tokenizer=tokenizer)
        else:
            result = evaluator_bleu(str(folder), sources, sources, task=task)
        assert (result["score"], result["signature"]) == (printed["bleu"], printed["bleu_signature"]), task
    return printed["bleu"]


# -- docs/evaluate.md ----------------------------------------------------------------------------------------


def documented_lines() -> str:
    """The fenced Python block of docs/evaluate.md that follows the marker line `<!-- six lines -->`."""
    page = (ROOT / "docs" / "evaluate.md").read_text()
    match = re.search(r"<!-- six lines -->\n```python\n(.*?)```", page, flags=re.DOTALL)
    assert match, "docs/evaluate.md: no ```python block after <!-- six lines -->"
    return match.group(1)


def test_the_documented_lines_are_six():
    lines = [line for line in documented_lines().splitlines() if line.strip()]  # ruff format's blank line apart
    assert len(lines) == 6 and not any(line.startswith("#") for line in lines)


@pytest.mark.slow
def test_the_documented_lines_run_offline_as_written(multi30k_model, tmp_path, capsys):
    """In a fresh offline process with an empty HF cache, in a folder holding `outputs/m30k-en-de` (the model
    trained here) and `multi30k` (the shared data, linked): the six lines print the BLEU of `attn evaluate` on the
    whole test2016 set."""
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "m30k-en-de").symlink_to(multi30k_model)
    (tmp_path / "multi30k").symlink_to(MULTI30K)
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_OFFLINE": "1",
        "HF_EVALUATE_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", documented_lines()], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = ast.literal_eval(result.stdout.strip().splitlines()[-1])  # the dict print() shows
    with one_thread():
        expected = attn_evaluate(capsys, *multi30k_test(multi30k_model))
    assert expected["sentences"] == 1000
    assert (printed["score"], printed["signature"]) == (expected["bleu"], expected["bleu_signature"])
