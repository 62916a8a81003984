"""Tests of training/tokenizer.py: a joint BPE vocabulary saved as a transformers tokenizer."""

from __future__ import annotations

import pytest
from modeling_attn.training.tokenizer import splits_punctuation, train_bpe_tokenizer
from transformers import AutoTokenizer

import modeling_attn  # noqa: F401
from modeling_attn.api.presets import load_preset

SENTENCES = [
    "A man rides a bike.",
    "Ein Mann fährt Fahrrad.",
    "Two dogs play in the snow on 03.03.1987.",
    "Zwei Hunde spielen im Schnee.",
] * 20


def test_special_tokens_and_round_trip():
    tokenizer = train_bpe_tokenizer(SENTENCES, vocab_size=200)
    assert [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id] == [
        0,
        1,
        2,
        3,
    ]
    assert len(tokenizer) <= 200
    encoded = tokenizer(["A man rides a bike."], text_target=["Ein Mann fährt Fahrrad."])
    assert encoded["input_ids"][0][-1] == tokenizer.eos_token_id and encoded["labels"][0][-1] == tokenizer.eos_token_id
    assert tokenizer.bos_token_id not in encoded["labels"][0]  # the model prepends the decoder start token itself
    for sentence in SENTENCES[:4]:
        assert tokenizer.decode(tokenizer(sentence)["input_ids"], skip_special_tokens=True) == sentence
    assert tokenizer.tokenize("1987") == ["▁", "1", "9", "8", "7"]  # digits split one by one


def test_auto_tokenizer_loads_it_from_a_model_folder(tmp_path):
    tokenizer = train_bpe_tokenizer(SENTENCES, vocab_size=200)
    tokenizer.save_pretrained(tmp_path)
    load_preset("tiny", vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded("Two dogs.")["input_ids"] == tokenizer("Two dogs.")["input_ids"]
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token, loaded.unk_token) == (
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
    )


def test_lowercase_and_split_punctuation():
    tokenizer = train_bpe_tokenizer(SENTENCES, vocab_size=200, lowercase=True, split_punctuation=True)
    assert tokenizer.decode(tokenizer("Ein Mann fährt Fahrrad.")["input_ids"], skip_special_tokens=True) == (
        "ein mann fährt fahrrad."
    )
    assert tokenizer("EIN MANN")["input_ids"] == tokenizer("ein mann")["input_ids"]
    # Punctuation is a token of its own, never merged into a word, and the spacing still comes back exactly.
    tokens = tokenizer.tokenize("zwei hunde spielen im schnee.")
    assert tokens[-1] == "." and all("." not in token for token in tokens[:-1])
    for sentence in ["two dogs.play on 03.03.1987.", "zwei  hunde ...", ". ein mann"]:
        assert tokenizer.decode(tokenizer(sentence)["input_ids"], skip_special_tokens=True) == sentence
    # Without the option, BPE learns word+punctuation merges from these sentences (the default keeps its behaviour).
    default = train_bpe_tokenizer(SENTENCES, vocab_size=200)
    assert any("." in token and token != "." for token in default.get_vocab())
    assert default.decode(default("Ein Mann")["input_ids"], skip_special_tokens=True) == "Ein Mann"


def test_reused_tokenizer_must_match_the_vocabulary_flags(tmp_path):
    from modeling_attn.training.train import TrainingRun

    from modeling_attn.cli.train import parse_args

    plain, lowercasing = tmp_path / "plain", tmp_path / "lowercasing"
    train_bpe_tokenizer(SENTENCES, vocab_size=200).save_pretrained(plain)
    train_bpe_tokenizer(SENTENCES, vocab_size=200, lowercase=True, split_punctuation=True).save_pretrained(lowercasing)
    flags = ["--lowercase", "true", "--split_punctuation", "true"]

    def build(tokenizer, *extra):
        recipe, args = parse_args(
            ["--output_dir", str(tmp_path / "out"), "--tokenizer_name_or_path", str(tokenizer), *extra]
        )
        training = TrainingRun(recipe, args)
        training.build_tokenizer()  # a reused tokenizer: no data needed
        return training.tokenizer

    assert splits_punctuation(build(lowercasing, *flags)) and not splits_punctuation(build(plain))
    with pytest.raises(ValueError, match=f"--lowercase and --split_punctuation: the reused tokenizer of {plain} "):
        build(plain, *flags)
    with pytest.raises(ValueError, match="^--split_punctuation: the reused"):
        build(plain, "--split_punctuation", "true")
