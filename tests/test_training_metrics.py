"""Tests of training/metrics.py: sacreBLEU BLEU / chrF / TER with signatures, from generated ids."""

from __future__ import annotations

import numpy as np
import pytest
import sacrebleu
from modeling_attn.training.metrics import TranslationMetrics
from modeling_attn.training.tokenizer import train_bpe_tokenizer
from sacrebleu.metrics import BLEU
from transformers import EvalPrediction

from modeling_attn.api.metrics import translation_scores, writes_lowercase


def test_scores_and_signature():
    scores = translation_scores(["the cat sat on the mat", "a dog"], ["the cat sat on the mat", "a dog"])
    assert scores["bleu"] == pytest.approx(100) and scores["chrf"] == pytest.approx(100) and scores["ter"] == 0
    assert scores["exact_match"] == 100
    assert "tok:13a" in scores["bleu_signature"] and "nrefs:1" in scores["bleu_signature"]
    hypotheses, references = ["the cat sat on a mat", "a big dog"], ["the cat sat on the mat", "a dog"]
    expected = BLEU().corpus_score(hypotheses, [references]).score
    assert translation_scores(hypotheses, references)["bleu"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        translation_scores(hypotheses, references[:1])


@pytest.mark.parametrize("lowercase", [False, True])
def test_scores_equal_sacrebleus_corpus_functions(lowercase):
    hypotheses = ["The cat sat on a mat .", "a big dog barked", "", "Zwei Hunde spielen im Schnee."]
    references = ["the cat sat on the mat .", "a dog barked", "ein Hund", "Zwei Hunde spielen im Schnee ."]
    scores = translation_scores(hypotheses, references, lowercase=lowercase)
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references], lowercase=lowercase).score
    assert scores["chrf"] == sacrebleu.metrics.CHRF(lowercase=lowercase).corpus_score(hypotheses, [references]).score
    assert scores["ter"] == sacrebleu.corpus_ter(hypotheses, [references], case_sensitive=not lowercase).score
    assert 0 < scores["ter"] < 100  # an edit rate: 0 is a perfect match
    case = "lc" if lowercase else "mixed"
    assert (
        scores["ter_signature"]
        == f"nrefs:1|case:{case}|tok:tercom|norm:no|punct:yes|asian:no|version:{sacrebleu.__version__}"
    )
    assert scores["bleu_signature"].startswith(f"nrefs:1|case:{case}|eff:no|tok:13a")
    assert scores["chrf_signature"].startswith(f"nrefs:1|case:{case}|eff:yes|nc:6|nw:0")


def test_compute_metrics_decodes_generated_ids():
    tokenizer = train_bpe_tokenizer(["1987-03-03 a cat", "2001-12-31 a dog"] * 10, vocab_size=100)
    ids = tokenizer(["1987-03-03", "2001-12-31"], padding=True, return_tensors="np")["input_ids"]
    padded = np.concatenate([ids, np.full((2, 2), -100)], axis=1)  # -100 from gathering across processes
    metrics = TranslationMetrics(tokenizer)
    assert metrics(EvalPrediction(predictions=padded, label_ids=padded))["exact_match"] == 100
    metrics.references = ["1987-03-03", "2001-12-30"]
    assert metrics(EvalPrediction(predictions=padded, label_ids=padded))["exact_match"] == 50


def test_lowercasing_tokenizer_is_scored_case_insensitively():
    hypotheses, references = ["ein mann fährt rad .", "zwei hunde"], ["Ein Mann fährt Rad .", "Zwei Hunde"]
    cased = translation_scores(hypotheses, references)
    assert cased["exact_match"] == 0 and cased["bleu"] < 50 and "case:mixed" in cased["bleu_signature"]
    lowered = translation_scores(hypotheses, references, lowercase=True)
    assert lowered["bleu"] == pytest.approx(100) and lowered["chrf"] == pytest.approx(100)
    assert lowered["exact_match"] == 100 and "case:lc" in lowered["bleu_signature"]

    corpus = ["Ein Mann fährt Rad.", "Zwei Hunde spielen."] * 10
    lowercasing = train_bpe_tokenizer(corpus, vocab_size=100, lowercase=True)
    assert writes_lowercase(lowercasing) and not writes_lowercase(train_bpe_tokenizer(corpus, vocab_size=100))
    ids = lowercasing(["Zwei Hunde spielen."], return_tensors="np")["input_ids"]
    metrics = TranslationMetrics(lowercasing)
    metrics.references = ["Zwei Hunde spielen."]  # raw, cased: the model's "zwei hunde spielen." matches it
    assert metrics(EvalPrediction(predictions=ids, label_ids=ids))["exact_match"] == 100
