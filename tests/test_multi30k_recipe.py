"""The Multi30k benchmark (bench/multi30k/): the multi-bleu.perl-style BLEU on lowercased Moses tokens against
hand-computed values, and the recipe end to end (attn train, beam search on test2016, the three scores) on a few
hundred sentences for a few steps."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from multi30k_data import MULTI30K, needs_multi30k

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    """bench/multi30k/NAME.py, the suite's module."""
    return importlib.import_module(f"bench.multi30k.{name}")


bleu = _load("bleu")


def test_multi_bleu_of_one_sentence_is_the_hand_computed_geometric_mean():
    # 1- to 4-gram matches 7/8, 5/7, 4/6, 3/5 ("red bike" and "bike ." miss); same length, so no brevity penalty.
    score, signature = bleu.multi_bleu(["a man is riding a red bike ."], ["a man is riding a red bicycle ."])
    expected = 100 * (7 / 8 * 5 / 7 * 4 / 6 * 3 / 5) ** 0.25
    assert score.score == pytest.approx(expected, abs=1e-9)
    assert expected == pytest.approx(70.7107, abs=1e-4)
    assert "tok:none" in signature and "smooth:none" in signature


def test_multi_bleu_sums_counts_over_the_corpus_and_applies_the_brevity_penalty():
    hypotheses = ["a dog runs on the grass", "two men are talking"]
    references = ["a dog runs on the green grass", "two men are talking"]
    # n-gram matches over both sentences: 1-grams 6+4 of 6+4, 2-grams 4+3 of 5+3, 3-grams 3+2 of 4+2,
    # 4-grams 2+1 of 3+1; hypothesis length c = 10, reference length r = 11: BP = exp(1 - 11/10).
    precisions = [10 / 10, 7 / 8, 5 / 6, 3 / 4]
    expected = 100 * math.exp(1 - 11 / 10) * math.prod(precisions) ** 0.25
    score, _ = bleu.multi_bleu(hypotheses, references)
    assert score.score == pytest.approx(expected, abs=1e-9)
    # Not the mean of the sentence scores (the second sentence alone is 100).
    sentence_scores = [bleu.multi_bleu([h], [r])[0].score for h, r in zip(hypotheses, references, strict=True)]
    assert sentence_scores[1] == pytest.approx(100.0) and score.score != pytest.approx(
        sum(sentence_scores) / 2, abs=0.1
    )


def test_multi_bleu_is_zero_without_smoothing_when_no_four_gram_matches():
    # 1-gram 2/4, 2-gram 1/3, 3-gram 0/2, 4-gram 0/1: multi-bleu.perl takes log(0) and prints 0.
    assert bleu.multi_bleu(["the small cat sat"], ["a small cat sits"])[0].score == 0.0
    # sacreBLEU's default (exp) smoothing would not: the reason for smooth_method="none".
    from sacrebleu.metrics import BLEU

    assert BLEU(tokenize="none").corpus_score(["the small cat sat"], [["a small cat sits"]]).score > 0


def test_lowercase_tokenize_reproduces_the_moses_pipeline():
    assert bleu.lowercase_tokenize(['A man\'s T-shirt, "red".'], "en") == [
        "a man &apos;s t-shirt , &quot; red . &quot;"  # English rule of normalize-punctuation: ". inside quotes
    ]
    assert bleu.lowercase_tokenize(["Ein Mann im „roten“ T-Shirt – 3,5 km."], "de") == [
        "ein mann im &quot; roten &quot; t-shirt - 3,5 km ."  # German quotes and the en dash normalized, no -a split
    ]


def test_lowercased_tokenized_bleu_scores_raw_text_on_lowercased_tokens():
    score, signature = bleu.lowercased_tokenized_bleu(
        ["A man is riding a red bike."], ["a man is riding a red bicycle ."], "en"
    )
    assert score.score == pytest.approx(100 * (7 / 8 * 5 / 7 * 4 / 6 * 3 / 5) ** 0.25, abs=1e-9)
    assert signature.startswith("lc+moses-norm+moses-tok(en")
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu.lowercased_tokenized_bleu(["a", "b"], ["a"], "en")


def test_escaping_changes_no_bleu():
    hypotheses = ['a man \'s dog is "happy" & fast']
    references = ['the man \'s dog is "happy" & quick']
    escaped = [line.replace("&", "&amp;").replace("'", "&apos;").replace('"', "&quot;") for line in references]
    escaped_hypotheses = [
        line.replace("&", "&amp;").replace("'", "&apos;").replace('"', "&quot;") for line in hypotheses
    ]
    assert bleu.multi_bleu(hypotheses, references)[0].score == bleu.multi_bleu(escaped_hypotheses, escaped)[0].score


def test_bleu_command_line_reads_gzipped_references(tmp_path, capsys):
    references = tmp_path / "ref.de.gz"
    with gzip.open(references, "wt", encoding="utf-8") as file:
        file.write("Ein Mann fährt ein rotes Fahrrad.\n")
    hypotheses = tmp_path / "hyp.de"
    hypotheses.write_text("ein Mann fährt ein rotes Fahrrad .\n", encoding="utf-8")
    result = bleu.main([str(hypotheses), str(references), "--lang", "de"])
    assert json.loads(capsys.readouterr().out) == result and result["bleu_lc_tok"] == 100.0
    hypotheses.write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_status:
        bleu.main([str(hypotheses), str(references), "--lang", "de"])
    assert exit_status.value.code == 2 and "2 lines" in capsys.readouterr().err


@needs_multi30k
@pytest.mark.slow  # ~75 s of CPU each (loading Multi30k, BPE, 4 steps, beam search with an untrained model)
@pytest.mark.parametrize(
    ("model_type", "source_lang", "target_lang"), [("attn_transformer", "en", "de"), ("attn_rnn", "de", "en")]
)
def test_recipe_runs_end_to_end_on_a_few_hundred_sentences(tmp_path, model_type, source_lang, target_lang):
    recipe = _load("recipe")
    output_dir = tmp_path / "run"
    argv = [
        "--source_lang",
        source_lang,
        "--target_lang",
        target_lang,
        "--model_type",
        model_type,
        "--data",
        str(MULTI30K),
        "--output_dir",
        str(output_dir),
        "--num_beams",
        "2",
        "--max_test_samples",
        "12",
        # attn train flags over the recipe's:
        "--max_train_samples",
        "300",
        "--vocab_size",
        "400",
        "--max_steps",
        "4",
        "--save_steps",
        "2",
        "--warmup_steps",
        "2",
        "--max_tokens_per_batch",
        "1024",
    ]
    assert recipe.main(argv)["command"].startswith("python -m bench multi30k ")

    results = json.loads((output_dir / "multi30k_results.json").read_text())
    args = results["attn_train_args"]
    # The recipe's YAML flags reached attn train, then ours overrode them (argparse keeps the last value).
    preset = "multi30k-transformer" if model_type == "attn_transformer" else "multi30k-rnn"
    assert args[args.index("--preset") + 1] == preset
    assert args[len(args) - 1 - args[::-1].index("--max_steps") + 1] == "4"
    config = json.loads((output_dir / "config.json").read_text())
    assert config["model_type"] == model_type
    if model_type == "attn_transformer":
        assert (config["d_model"], config["encoder_layers"], config["decoder_layers"]) == (128, 4, 4)
    # Training averaged its two checkpoints (steps 2 and 4) into the evaluated model.
    assert sorted(p.name for p in output_dir.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    # test2016 (test_2016_flickr) was translated, and the score is the one bleu.py gives for those lines.
    hypotheses = (output_dir / f"test2016.hyp.{target_lang}").read_text(encoding="utf-8").splitlines()
    assert results["test_sentences"] == len(hypotheses) == 12
    references = bleu.read_lines(MULTI30K / f"test_2016_flickr.{target_lang}.gz")[:12]
    expected, _ = bleu.lowercased_tokenized_bleu(hypotheses, references, target_lang)
    assert results["bleu_lc_tok"] == round(expected.score, 2)
    # The Transformer recipe lowercases (its tokenizer writes lowercase): sacreBLEU and chrF are case-insensitive.
    case = "lc" if model_type == "attn_transformer" else "mixed"
    assert all(h == h.lower() for h in hypotheses) or case == "mixed"
    assert results["sacrebleu_signature"].startswith(f"nrefs:1|case:{case}|eff:no|tok:13a")
    assert results["chrf_signature"].startswith(f"nrefs:1|case:{case}|eff:yes|nc:6|nw:0")
    assert results["num_beams"] == 2 and results["direction"] == f"{source_lang}-{target_lang}"
    # The length penalty was chosen on validation (bleu.py's score of each), saved in the generation config.
    by_penalty = results["validation_bleu_lc_tok_by_length_penalty"]
    assert list(by_penalty) == ["0.6", "1.0", "1.5", "2.0"]
    assert results["length_penalty"] == float(max(by_penalty, key=by_penalty.get))
    assert (
        json.loads((output_dir / "generation_config.json").read_text())["length_penalty"] == results["length_penalty"]
    )
    # ... and `attn push` of the folder with these results uploads that same decoding (issue 25: one owner).
    from modeling_attn.api.hub import save_for_hub

    save_for_hub(output_dir, tmp_path / "hub", "me/m30k", output_dir / "multi30k_results.json")
    pushed, saved = (
        json.loads((folder / "generation_config.json").read_text()) for folder in (tmp_path / "hub", output_dir)
    )
    assert {**pushed, "transformers_version": None} == {**saved, "transformers_version": None}

    # --evaluate_only scores the saved model again, keeping the training record; a train flag there is an error.
    assert recipe.main([*argv[:14], "--evaluate_only"])["bleu_lc_tok"] >= 0
    again = json.loads((output_dir / "multi30k_results.json").read_text())
    assert again["attn_train_args"] == args and again["bleu_lc_tok"] == results["bleu_lc_tok"]
    with pytest.raises(SystemExit, match="takes no attn train flags"):
        recipe.main([*argv, "--evaluate_only"])

    # bench/multi30k/ensemble.py on the run twice: the run's model scores as the recipe scored it, the "seed
    # ensemble" of two copies of it as the model, and the checkpoint ensemble's members are the run's checkpoints.
    ensemble = _load("ensemble")
    flags = ["--runs", str(output_dir), str(output_dir), "--last_checkpoints", "2", "--num_beams", "2"]
    assert ensemble.main([*argv[:4], *argv[6:8], *argv[12:14], *flags, "--output", str(tmp_path / "ensemble")])
    table = json.loads((tmp_path / "ensemble.json").read_text())["systems"]
    assert table["run 1"]["bleu_lc_tok"] == table["seed ensemble of 2"]["bleu_lc_tok"] == results["bleu_lc_tok"]
    assert table["run 1"]["length_penalty"] == results["length_penalty"]
    assert table["checkpoints of run 1"]["members"] == [
        str(output_dir / "checkpoint-2"),
        str(output_dir / "checkpoint-4"),
    ]
    assert "| seed ensemble of 2 | 2 |" in (tmp_path / "ensemble.md").read_text()


def test_model_card_of_a_multi30k_run_reports_both_bleu_scores(tmp_path):
    """`attn push --results multi30k_results.json`: sacreBLEU, chrF and the lowercased tokenized BLEU in the card."""
    from tiny import tiny_model

    from modeling_attn.api.hub import model_card, read_results

    recipe_json = {
        "direction": "en-de",
        "test_sentences": 1000,
        "num_beams": 5,
        "length_penalty": 0.6,
        "bleu_lc_tok": 40.123,
        "bleu_lc_tok_signature": "lc+moses-norm+moses-tok(de,escape,no -a)|tok:none",
        "sacrebleu": 39.5,
        "sacrebleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
        "chrf": 65.4,
        "chrf_signature": "nrefs:1|nc:6",
    }
    path = tmp_path / "multi30k_results.json"
    path.write_text(json.dumps(recipe_json))
    results = read_results(path)
    assert (results["bleu"], results["bleu_lc_tok"], results["source_lang"], results["target_lang"]) == (
        39.5,
        40.123,
        "en",
        "de",
    )
    card = model_card(tiny_model(), "user/m30k", results)
    scores = {(r.metric_type, r.metric_name): r.metric_value for r in card.data.eval_results}
    assert scores == {
        ("bleu", "BLEU"): 39.5,
        ("chrf", "chrF"): 65.4,
        ("bleu", "BLEU, lowercased and Moses-tokenized (multi-bleu)"): 40.12,
    }
    # The recipe reads Multi30k's files from a local folder: no Hub dataset id to list.
    assert card.data.language == ["en", "de"] and card.data.datasets is None
    assert "| BLEU, lowercased and Moses-tokenized (multi-bleu) | 40.12 |" in card.text
    assert "test2016 split of multi30k (1000 sentences, en -> de)" in card.text
    assert "num_beams 5, length_penalty 0.6" in card.text
    assert recipe_json["bleu_lc_tok_signature"] in card.text


def test_model_card_names_case_insensitive_scores():
    """A lowercasing model's sacreBLEU / chrF are case-insensitive (signature case:lc): the card's names say so."""
    from tiny import tiny_model

    from modeling_attn.api.hub import model_card

    results = {
        "bleu": 38.5,
        "chrf": 60.1,
        "bleu_signature": "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0",
        "data": "multi30k",
        "split": "test2016",
        "source_lang": "en",
        "target_lang": "de",
        "sentences": 1000,
    }
    card = model_card(tiny_model(), "user/m30k", results)
    names = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert names == {"BLEU (case-insensitive)": 38.5, "chrF (case-insensitive)": 60.1}
    assert "| BLEU (case-insensitive) | 38.50 |" in card.text


def test_the_recipe_without_the_data_says_where_to_get_it_in_one_line(tmp_path):
    """On a machine without Multi30k (no ../shared): one line naming the folder and docs/multi30k.md, exit 2, and no
    output folder made."""
    command = [sys.executable, "-m", "bench", "multi30k", "--source_lang", "en", "--target_lang", "de"]
    out = tmp_path / "out"
    done = subprocess.run(
        [*command, "--output_dir", str(out), "--data", str(tmp_path)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"python -m bench multi30k: error: no Multi30k training file train.en[.gz] in {tmp_path}; get the data as "
        "docs/multi30k.md ('Get the data') says and pass its folder with --data\n"
    )
    assert not out.exists()
