"""Word alignments (modeling_attn/api/alignment.py), guided alignment training (modeling_attn/loss.py,
encoder_decoder.py, training/alignment.py), `attn translate --align`, and the dates task's true alignments.

Reference checks: subword-to-word merging, the Pharaoh format and AER against hand-computed values; the guided loss
against a hand computation and against the model's own cross-attention; the alignment of a translation (greedy and
beam search) equals that of the same tokens read teacher-forced; the command prints what the Python API returns;
every true link of the dates generator joins two words that write the same field. Slow: guided training with `attn
train --alignment_file` lowers the AER on held-out dates.
"""

from __future__ import annotations

import json
import math
import re
import shlex

import pytest
import torch
from modeling_attn.training.alignment import GuidedAlignmentCollator, read_alignment_file, subword_links
from modeling_attn.training.synthetic import (
    _MONTHS_DE,
    _MONTHS_EN,
    NUM_STYLES,
    build_dataset,
    generate_aligned_pairs,
    generate_pairs,
)
from modeling_attn.training.tokenizer import train_bpe_tokenizer
from runs import NO_EVAL
from tasks import one_thread
from tiny import spread_tiny_rnn, tiny_model

from modeling_attn import AttnTransformerConfig
from modeling_attn.api.alignment import (
    align_pairs,
    aligned_line,
    alignment_error_rate,
    encode_with_spans,
    format_pharaoh,
    hard_alignment,
    parse_pharaoh,
    split_words,
    token_words,
    translate_aligned,
    word_alignment,
    word_weights,
)
from modeling_attn.api.corpus import DataError
from modeling_attn.cli.main import main as cli
from modeling_attn.encoder_decoder import alignment_attention
from modeling_attn.loss import guided_alignment_loss


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def dates_tokenizer():
    """The recipe's joint BPE (digits split one by one) trained on dates, as `attn train` builds it."""
    return train_bpe_tokenizer([side for pair in generate_pairs(2000, seed=5) for side in pair], vocab_size=300)


# -- words and subwords -----------------------------------------------------------------------------------------


def test_split_words():
    text = "Tuesday, March 3rd, 1987"
    assert [text[a:b] for a, b in split_words(text)] == ["Tuesday,", "March", "3rd,", "1987"]
    assert [text[a:b] for a, b in split_words(text, "alnum")] == ["Tuesday,", "March", "3rd,", "1987"]
    iso = "1987-03-03"
    assert [iso[a:b] for a, b in split_words(iso)] == ["1987-03-03"]
    assert [iso[a:b] for a, b in split_words(iso, "alnum")] == ["1987-", "03-", "03"]
    assert [t[a:b] for t in ["don't ... (x)"] for a, b in split_words(t, "alnum")] == ["don'", "t", "...", "(x)"]
    with pytest.raises(ValueError, match="words must be one of"):
        split_words(text, "spaces")


def test_token_words_by_hand():
    word_spans = split_words("ab cd ef")  # (0, 2), (3, 5), (6, 8)
    spans = [(0, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 8), None]  # "ab", " ", "c", "d", " ", "ef", </s>
    assert token_words(spans, word_spans, 8) == [0, 1, 1, 1, 2, 2, None]
    # a whitespace-only token with no word after it belongs to the previous word
    assert token_words([(0, 2), (2, 3), None], split_words("ab "), 3) == [0, 0, None]


def test_encode_with_spans_of_a_date(dates_tokenizer):
    """The recipe's tokenizer: "▁" alone (before a digit) belongs to the next word, </s> to none."""
    ids, spans, text = encode_with_spans(dates_tokenizer, "3 March 1987")
    tokens = dates_tokenizer.convert_ids_to_tokens(ids)
    assert tokens == ["▁", "3", "▁March", "▁", "1", "9", "8", "7", "</s>"]
    assert token_words(spans, split_words(text), len(text)) == [0, 0, 1, 2, 2, 2, 2, 2, None]
    ids, spans, text = encode_with_spans(dates_tokenizer, "1987-03-03", target=True)
    assert token_words(spans, split_words(text, "alnum"), len(text)) == [0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, None]


def test_word_weights_by_hand():
    """Columns of a source word summed, rows of a target word averaged, special tokens left out."""
    weights = torch.tensor([[0.1, 0.1, 0.4, 0.4], [0.5, 0.1, 0.2, 0.2], [0.0, 0.6, 0.3, 0.1]])
    merged = word_weights(
        weights, target_words=[0, 1, 1], source_words=[0, 0, 1, None], num_target_words=2, num_source_words=2
    )
    # target word 0 = row 0: [0.1 + 0.1, 0.4]; target word 1 = mean of rows 1 and 2: [(0.6 + 0.6) / 2, (0.2 + 0.3) / 2]
    torch.testing.assert_close(merged, torch.tensor([[0.2, 0.4], [0.6, 0.25]]))
    assert hard_alignment(merged) == [(1, 0), (0, 1)]
    assert hard_alignment(torch.tensor([[0.0, 0.0], [0.1, 0.2]])) == [(1, 1)]  # a word with no token: no link


def test_pharaoh_format():
    assert format_pharaoh([(1, 0), (0, 1), (2, 2)]) == "1-0 0-1 2-2"
    assert parse_pharaoh(" 1-0  0-1 2-2\n") == [(1, 0), (0, 1), (2, 2)]
    assert parse_pharaoh("") == []
    for bad in ("1-", "a-1", "1:2", "1-2-3", "-1-2"):
        with pytest.raises(ValueError, match="is not a Pharaoh pair"):
            parse_pharaoh(f"0-0 {bad}")


def test_alignment_error_rate_by_hand():
    predicted = [[(0, 0), (1, 1), (2, 1)], [(0, 0)]]
    sure = [[(0, 0), (1, 2)], [(0, 0)]]
    possible = [[(1, 1)], []]
    # sentence 1: |A&S| = 1, |A&P| = 2; sentence 2: 1 and 1; |A| = 4, |S| = 3: 1 - (2 + 3) / (4 + 3)
    assert alignment_error_rate(predicted, sure, possible) == pytest.approx(1 - 5 / 7)
    assert alignment_error_rate(predicted, sure) == pytest.approx(1 - 4 / 7)  # P = S: 1 - F1
    assert alignment_error_rate(sure, sure) == 0.0
    assert alignment_error_rate([[(5, 5)]], [[(0, 0)]]) == 1.0
    with pytest.raises(ValueError, match="2 predicted alignments for 1 reference"):
        alignment_error_rate(predicted, sure[:1])


# -- the guided loss --------------------------------------------------------------------------------------------


def test_guided_alignment_loss_by_hand():
    attention = torch.tensor([[[0.2, 0.5, 0.3], [0.6, 0.3, 0.1], [0.3, 0.3, 0.4]]])
    links = torch.zeros(1, 3, 3)
    links[0, 0, 1] = links[0, 1, 0] = links[0, 1, 2] = 1  # target 0 - source 1; target 1 - sources 0 and 2; 2: none
    labels = torch.tensor([[5, 6, 2]])
    expected = -(math.log(0.5) + 0.5 * math.log(0.6) + 0.5 * math.log(0.1)) / 3  # over the 3 labelled tokens
    assert guided_alignment_loss(attention, links, labels).item() == pytest.approx(expected)
    assert guided_alignment_loss(attention, links, labels, num_items_in_batch=6).item() == pytest.approx(expected / 2)
    with pytest.raises(ValueError, match="the reference alignment has shape"):
        guided_alignment_loss(attention, links[:, :2], labels)


def _links(batch: int, target: int, source: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    links = (torch.rand(batch, target, source, generator=generator) < 0.3).float()
    links[:, -1] = 0  # the end token: no link
    return links


@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
def test_forward_adds_the_guided_loss(model_type):
    """forward(alignment=...) = the translation loss + weight * the loss of the supervised attention: the config's
    layer and first heads (Transformer), alpha (RNN), read from output_attentions by hand."""
    if model_type == "attn_transformer":
        model = tiny_model(decoder_layers=3, alignment_layer=1, alignment_heads=2)
    else:
        model = spread_tiny_rnn()
    input_ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    attention_mask = (input_ids != 0).long()
    labels = torch.tensor([[11, 12, 13, 2], [14, 2, -100, -100]])
    links = _links(2, 4, 5, seed=1) * attention_mask[:, None, :] * (labels != -100)[:, :, None]
    plain = model(input_ids, attention_mask=attention_mask, labels=labels, output_attentions=True)
    if model_type == "attn_transformer":
        attention = plain.cross_attentions[1][:, :2].mean(dim=1)
    else:
        attention = plain.cross_attentions[0]
    reference = links / links.sum(-1, keepdim=True).clamp(min=1)
    by_hand = -(reference * attention.log().nan_to_num(neginf=0.0)).sum() / 6  # 6 labelled tokens
    guided = model(input_ids, attention_mask=attention_mask, labels=labels, alignment=links, alignment_weight=0.3)
    torch.testing.assert_close(guided.loss, plain.loss + 0.3 * by_hand)
    skipped = model(
        input_ids,
        attention_mask=attention_mask,
        labels=labels,
        alignment=links,
        alignment_weight=0.3,
        skip_logits=True,
    )
    torch.testing.assert_close(skipped.loss, guided.loss)
    guided.loss.backward()
    assert all(parameter.grad is not None for parameter in model.parameters() if parameter.requires_grad)


def test_guided_loss_needs_eager_attention_and_labels():
    model = tiny_model(attn_implementation="sdpa")
    input_ids, labels = torch.tensor([[5, 6, 2]]), torch.tensor([[7, 2]])
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        model(input_ids, labels=labels, alignment=torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="needs labels"):
        tiny_model()(input_ids, decoder_input_ids=labels, alignment=torch.zeros(1, 2, 3))


def test_alignment_attention_selects_layer_and_heads():
    layers = tuple(torch.rand(2, 4, 3, 5) for _ in range(3))
    config = AttnTransformerConfig(decoder_layers=3, num_heads=4, d_model=16, alignment_layer=-1, alignment_heads=0)
    torch.testing.assert_close(alignment_attention(layers, config), layers[2].mean(dim=1))
    config = AttnTransformerConfig(decoder_layers=3, num_heads=4, d_model=16, alignment_layer=0, alignment_heads=1)
    torch.testing.assert_close(alignment_attention(layers, config), layers[0][:, 0])


def test_config_alignment_fields():
    assert AttnTransformerConfig().alignment_layer == 4  # the paper's 6 decoder layers: the penultimate (Garg et al.)
    assert AttnTransformerConfig(decoder_layers=1).alignment_layer == 0
    assert AttnTransformerConfig(decoder_layers=3).alignment_heads == 0
    for bad, message in [
        (dict(alignment_layer=6), "alignment_layer must be a decoder layer index"),
        (dict(alignment_layer=-7), "alignment_layer must be a decoder layer index"),
        (dict(alignment_heads=9), "alignment_heads must be 0"),
        (dict(alignment_heads=-1), "alignment_heads must be 0"),
    ]:
        with pytest.raises(Exception, match=message):
            AttnTransformerConfig(**bad)


# -- the recipe's part ------------------------------------------------------------------------------------------


def test_subword_links_by_hand(dates_tokenizer):
    """Every subword of the source word with every subword of the target word (tokens: test_encode_with_spans_...).
    source "3 March 1987": word 0 = tokens 0-1, word 1 = 2, word 2 = 3-7; target "1987-03-03": word 0 = 0-5,
    word 1 = 6-8, word 2 = 9-10."""
    pairs = parse_pharaoh("0-2 1-1 2-0")
    flat = subword_links(dates_tokenizer, "3 March 1987", "1987-03-03", pairs, "alnum", (9, 12))
    expected = [(t, s) for t in range(6) for s in range(3, 8)] + [(t, 2) for t in range(6, 9)]
    expected += [(t, s) for t in (9, 10) for s in (0, 1)]
    assert sorted(zip(flat[::2], flat[1::2], strict=True)) == sorted(expected)
    # rows cut by --max_*_length (the end token kept): source 5 = 4 tokens + </s>, target 4 = 3 tokens + </s>
    cut = subword_links(dates_tokenizer, "3 March 1987", "1987-03-03", pairs, "alnum", (5, 4))
    assert sorted(zip(cut[::2], cut[1::2], strict=True)) == [(t, 3) for t in range(3)]


def test_collator_builds_the_link_matrix(dates_tokenizer):
    from transformers import DataCollatorForSeq2Seq

    features = [
        {"input_ids": [5, 6, 2], "attention_mask": [1, 1, 1], "labels": [7, 2], "alignment": [0, 1, 1, 0]},
        {"input_ids": [5, 2], "attention_mask": [1, 1], "labels": [7, 8, 2], "alignment": []},
    ]
    batch = GuidedAlignmentCollator(DataCollatorForSeq2Seq(dates_tokenizer), 0.25)(features)
    expected = torch.zeros(2, 3, 3)
    expected[0, 0, 1] = expected[0, 1, 0] = 1
    torch.testing.assert_close(batch["alignment"], expected)
    assert batch["alignment_weight"] == 0.25 and batch["labels"].shape == (2, 3)
    plain = GuidedAlignmentCollator(DataCollatorForSeq2Seq(dates_tokenizer), 0.25)(
        [{"input_ids": [5, 2], "attention_mask": [1, 1], "labels": [7, 2]}]
    )
    assert "alignment" not in plain and "alignment_weight" not in plain


def test_read_alignment_file_names_file_and_line(tmp_path):
    sources, targets = ["3 March 1987", "a b"], ["1987-03-03", "x"]
    path = tmp_path / "train.align"
    path.write_text("0-2 1-1 2-0\n\n")
    assert read_alignment_file(path, sources, targets, "alnum") == [[(0, 2), (1, 1), (2, 0)], []]
    cases = {
        "0-2 1-1 2-0\n0-0\n1-0\n": "train.align:3: more alignment lines than the 2 training pairs",
        "0-2\n": "1 alignment lines for 2 training pairs",
        "0-2\n0:0\n": "train.align:2: '0:0' is not a Pharaoh pair",
        "0-3\n0-0\n": "train.align:1: link 0-3 is outside training pair 1, which has 3 source and 3 target",
        "0-0\n2-0\n": "train.align:2: link 2-0 is outside training pair 2",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(DataError, match=re.escape(message)):
            read_alignment_file(path, sources, targets, "alnum")
    path.write_text("0-2\n0-0\n1-0\n")  # --max_train_samples: the first pairs of a longer file
    assert read_alignment_file(path, sources[:1], targets[:1], "alnum", complete=False) == [[(0, 2)]]
    path.write_bytes(b"0-0\n\xff\n")
    with pytest.raises(DataError, match="train.align:2: not valid UTF-8"):
        read_alignment_file(path, sources, targets, "alnum")


# -- the dates task ---------------------------------------------------------------------------------------------


def test_dates_pairs_unchanged_and_true_alignments_join_the_same_field():
    """The aligned generator gives the pairs of `generate_pairs`; each true link joins a source word and a target
    word that write the same field (year digits, day number, month number or name), and every target word has one."""
    triples = generate_aligned_pairs(600, seed=3)
    assert [(source, target) for source, target, _ in triples] == generate_pairs(600, seed=3)
    assert len({style for style in range(NUM_STYLES)}) == NUM_STYLES
    for source, target, line in triples:
        source_words = [source[a:b] for a, b in split_words(source, "alnum")]
        target_words = [target[a:b].rstrip("-") for a, b in split_words(target, "alnum")]
        links = parse_pharaoh(line)
        assert sorted(j for _, j in links) == [0, 1, 2], (source, line)
        for i, j in links:
            word, value = source_words[i], int(target_words[j])
            digits = re.sub(r"\D", "", word)
            if j == 1 and not digits:  # a month name
                names = [name.lower() for name in _MONTHS_EN[value - 1 : value] + _MONTHS_DE[value - 1 : value]]
                assert any(name.startswith(word.strip(".,").lower()) for name in names), (source, line)
            else:
                assert int(digits) == value, (source, line)
    splits = build_dataset({"train": 50, "validation": 5, "test": 5}, alignments=True)
    assert splits["train"].column_names == ["source", "target", "alignment"]
    assert build_dataset({"train": 50, "validation": 5, "test": 5})["train"].column_names == ["source", "target"]


# -- translations ---------------------------------------------------------------------------------------------


def _models(dates_tokenizer):
    vocab = len(dates_tokenizer)
    return {
        "attn_transformer": tiny_model(vocab_size=vocab, decoder_layers=3, dropout=0.0),
        "attn_rnn": spread_tiny_rnn(vocab_size=vocab),
    }


@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_translation_alignment_equals_teacher_forced(dates_tokenizer, model_type, num_beams):
    """The alignment of a generated translation is that of its tokens read teacher-forced (the attention generate
    recorded step by step, beams followed back, equals one forward pass over the chosen hypothesis)."""
    model = _models(dates_tokenizer)[model_type]
    sentences = ["3 March 1987", "", "Tuesday, March 3rd, 1987", "12/1/2001"]
    aligned = translate_aligned(
        model, dates_tokenizer, sentences, words="alnum", num_beams=num_beams, max_new_tokens=7
    )
    assert aligned[1].text == "" and aligned[1].alignment.pairs == [] and aligned[1].attention is None
    for sentence, result in zip(sentences, aligned, strict=True):
        if not sentence:
            continue
        source_ids, source_spans, _ = encode_with_spans(dates_tokenizer, sentence)
        target_ids = dates_tokenizer.convert_tokens_to_ids(result.attention.target_tokens)
        decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, *target_ids[:-1]]])
        with torch.no_grad():
            outputs = model(torch.tensor([source_ids]), decoder_input_ids=decoder_input_ids, output_attentions=True)
        weights = alignment_attention(outputs.cross_attentions, model.config)[0]
        from modeling_attn.api.alignment import decoded_spans

        expected = word_alignment(
            weights,
            (sentence, source_spans),
            (result.text, decoded_spans(dates_tokenizer, target_ids, result.text)),
            "alnum",
        )
        assert result.text == dates_tokenizer.decode(target_ids, skip_special_tokens=True)
        torch.testing.assert_close(result.alignment.weights, expected.weights, rtol=1e-4, atol=1e-5)
        assert result.alignment.pairs == expected.pairs
        assert result.alignment.source_words == [sentence[a:b] for a, b in split_words(sentence, "alnum")]
        assert len(result.alignment.pairs) == len(result.alignment.target_words)


def test_align_pairs_batched_equals_one_by_one(dates_tokenizer):
    model = _models(dates_tokenizer)["attn_transformer"]
    sources, targets = ["3 March 1987", "Tuesday, March 3rd, 1987", "1/2/2003"], ["1987-03-03", "1987-03-03", "x"]
    batched = align_pairs(model, dates_tokenizer, sources, targets, words="alnum", batch_size=3)
    for source, target, found in zip(sources, targets, batched, strict=True):
        (alone,) = align_pairs(model, dates_tokenizer, [source], [target], words="alnum")
        torch.testing.assert_close(found.weights, alone.weights, rtol=1e-4, atol=1e-6)
        assert found.pairs == alone.pairs
    with pytest.raises(Exception, match="eager"):
        align_pairs(tiny_model(attn_implementation="sdpa"), dates_tokenizer, sources, targets)


def test_cli_align(dates_tokenizer, tmp_path, capsys):
    model = _models(dates_tokenizer)["attn_transformer"]
    model.generation_config.update(max_new_tokens=6, num_beams=1)
    model.save_pretrained(tmp_path / "model")
    dates_tokenizer.save_pretrained(tmp_path / "model")
    sentences = ["3 March 1987", "", "Tuesday, March 3rd, 1987"]
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    loaded = type(model).from_pretrained(tmp_path / "model", attn_implementation="eager").eval()
    expected = translate_aligned(loaded, dates_tokenizer, sentences, words="alnum")
    common = [
        "translate",
        "--model",
        str(tmp_path / "model"),
        "--input",
        str(tmp_path / "in.txt"),
        "--no_progress",
        "--align_words",
        "alnum",
    ]
    assert cli([*common, "--align"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{item.text} ||| {item.alignment.pharaoh()}" for item in expected]
    assert lines[1] == " ||| " and all(
        re.fullmatch(r"\d+-\d+( \d+-\d+)*", line.split(" ||| ")[1]) for line in (lines[0], lines[2])
    )
    assert cli([*common, "--align", "--align_format", "soft"]) == 0
    soft_output = capsys.readouterr().out
    soft = [json.loads(line) for line in soft_output.splitlines()]
    assert [record["translation"] for record in soft] == [item.text for item in expected]
    for record, item in zip(soft, expected, strict=True):
        assert record["source_words"] == item.alignment.source_words
        torch.testing.assert_close(
            torch.tensor(record["weights"]).reshape(item.alignment.weights.shape),
            item.alignment.weights,
            atol=1e-5,
            rtol=0,
        )
        assert json.loads(aligned_line(item, "soft")) == record
    # the old spelling, --align soft, keeps working, with a deprecation message
    assert cli([*common, "--align", "soft"]) == 0
    captured = capsys.readouterr()
    assert captured.out == soft_output
    assert captured.err.startswith("attn translate: --align soft is deprecated; write --align --align_format soft\n")
    # --align before the sentences: a plain flag, the sentence stays a sentence
    model_flags = ["translate", "--model", str(tmp_path / "model"), "--align_words", "alnum"]
    assert cli([*model_flags, "--align", sentences[0]]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{expected[0].text} ||| {expected[0].alignment.pharaoh()}"]
    assert cli([*common, "--align", "--num_return_sequences", "2", "--num_beams", "2"]) == 2
    assert "--align aligns one translation per sentence" in capsys.readouterr().err


# -- slow: guided training lowers the alignment error rate ------------------------------------------------------


@pytest.mark.slow
def test_guided_training_lowers_aer_on_dates(tmp_path):
    """`attn train` on the embedded dates task, plain and with `--alignment_file` (the true alignments), the same
    seed and steps: the guided Transformer's forced alignments of held-out dates have a much lower AER (measured
    under load: 40% plain, 7% guided after 150 steps of the small preset, 1.5 min each; bench/alignment.py trains
    longer)."""
    dataset = build_dataset(alignments=True)
    (tmp_path / "train.align").write_text("\n".join(dataset["train"]["alignment"]) + "\n")
    test = dataset["test"].select(range(200))
    rates = {}
    for guided in (False, True):
        folder = tmp_path / ("guided" if guided else "plain")
        flags = [
            "train",
            "--preset",
            "small",
            "--output_dir",
            str(folder),
            "--max_steps",
            "150",
            "--max_train_samples",
            "4000",
            "--max_tokens_per_batch",
            "1024",
            *NO_EVAL,
            *shlex.split("--save_strategy no --report_to none --disable_tqdm true"),
        ]
        if guided:
            flags += ["--alignment_file", str(tmp_path / "train.align"), "--alignment_words", "alnum"]
        assert cli(flags) == 0
        saved = json.loads((folder / "config.json").read_text())
        assert saved["alignment_heads"] == (1 if guided else 0)  # the supervised head, recorded
        from modeling_attn.api.translation import load_model

        model, tokenizer = load_model(str(folder), "cpu", eager=True)
        found = align_pairs(model, tokenizer, test["source"], test["target"], words="alnum")
        rates[guided] = alignment_error_rate([a.pairs for a in found], [parse_pharaoh(x) for x in test["alignment"]])
    assert rates[True] < 0.5 * rates[False], rates


# -- flags, conversions, card -----------------------------------------------------------------------------------


def test_train_flags_are_checked_before_any_work(tmp_path, capsys):
    from modeling_attn.cli.main import main as attn

    align = tmp_path / "train.align"
    align.write_text("0-0\n")
    out = ["--output_dir", str(tmp_path / "out")]
    cases = [
        (["--alignment_file", str(tmp_path / "missing.align")], "--alignment_file .*missing.align: no such file"),
        (["--alignment_file", str(align), "--bpe_dropout", "0.1"], "--alignment_file with --bpe_dropout"),
        (["--alignment_file", str(align), "--streaming"], "--alignment_file with --streaming"),
        (["--alignment_file", str(align), "--drop_empty_pairs"], "--alignment_file with --drop_empty_pairs"),
        (
            ["--alignment_file", str(align), "--guided_alignment_weight", "0"],
            "argument --guided_alignment_weight: must be a finite number above 0, got 0.0",
        ),
        (["--guided_alignment_weight", "0.5"], "--guided_alignment_weight: only used with --alignment_file"),
        (["--alignment_words", "alnum"], "--alignment_words: only used with --alignment_file"),
    ]
    for flags, message in cases:
        try:  # a value out of its declared range ends in the parser (SystemExit), a combination in `validate`
            status = attn(["train", *out, *flags])
        except SystemExit as exit_info:
            status = exit_info.code
        assert status == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(message, err), err


def _sentencepiece_words(tokens: list[str]) -> list[int | None]:
    """Marian's rule for SentencePiece tokens: a piece starting with "▁" starts a word (the first piece always
    does); </s> belongs to none."""
    words, current = [], -1
    for index, token in enumerate(tokens):
        if token == "</s>":
            words.append(None)
            continue
        current += index == 0 or token.startswith("▁")
        words.append(current)
    return words


def test_converted_marian_keeps_marians_alignment_setting(tmp_path):
    """transformers' MarianConfig has no alignment field: a converted model gets Marian's (last layer, first head).
    Through its slow SentencePiece tokenizer (no offsets: the characters of each token come from decoding prefixes)
    the words are those of Marian's "▁" rule."""
    pytest.importorskip("sentencepiece", reason="MarianTokenizer needs sentencepiece (the interop extra)")
    from marian_tiny import SENTENCES, saved_marian

    from modeling_attn.api.alignment import selected_attention
    from modeling_attn.api.convert_marian import marian_to_attn

    marian, tokenizer = saved_marian(tmp_path / "marian", seed=3)
    model = marian_to_attn(marian).eval()
    assert (model.config.alignment_layer, model.config.alignment_heads) == (-1, 1)
    model.set_attn_implementation("eager")
    for result, sentence in zip(
        translate_aligned(model, tokenizer, SENTENCES[:3], num_beams=1, max_new_tokens=6), SENTENCES[:3], strict=True
    ):
        assert result.alignment.source_words == sentence.split()
        source_words = _sentencepiece_words(tokenizer.convert_ids_to_tokens(tokenizer(sentence)["input_ids"]))
        target_words = _sentencepiece_words(result.attention.target_tokens)
        weights = selected_attention(result.attention, model.config)
        torch.testing.assert_close(weights, result.attention.cross_attention[-1, 0])  # the last layer's first head
        expected = word_weights(
            weights,
            target_words,
            source_words,
            max(w for w in target_words if w is not None) + 1,
            len(sentence.split()),
        )
        torch.testing.assert_close(result.alignment.weights, expected)


def test_card_names_the_alignment_attention():
    from modeling_attn.api.hub import model_card

    card = str(model_card(tiny_model(decoder_layers=3, alignment_layer=1, alignment_heads=1), "user/model"))
    assert (
        "Word alignments (`attn translate --align`): the cross-attention of decoder layer 2 of 3, the mean of its "
        "first 1 head(s)" in card
    )
    assert "the RNN's alignment weights alpha" in str(model_card(spread_tiny_rnn(), "user/model"))
