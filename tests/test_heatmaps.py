"""Attention pictures (modeling_attn/heatmaps.py) and `attn translate --attention-png`.

Reference checks: the attention gathered from generate() (greedy and beam search) equals the attention of a
teacher-forced forward pass over the returned sequence; on an RNN trained to reverse letter sequences the
alignment is the anti-diagonal; the figure's tick labels are the sentence's tokens.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from tasks import one_thread, reverse_task, train_rnn_reverser
from tiny import RNN_SIZES, tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from modeling_attn import AttnRNNConfig, AttnRNNForConditionalGeneration
from modeling_attn.api.heatmaps import (
    attention_from_generate,
    bertviz_data,
    plot_alignment,
    plot_self_attention,
    save_bertviz_json,
)
from modeling_attn.cli.translate import main as translate_main

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="attention pictures need the [plot] extra (matplotlib)"
)

LETTERS = "abcdefghijklm"  # token ids 3..15 of the reverse task


def letter_tokenizer() -> PreTrainedTokenizerFast:
    """A real word-level tokenizer for the reverse task: id 3 + i is letter i, sentences are letters and spaces."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{letter: 3 + i for i, letter in enumerate(LETTERS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def reverser() -> AttnRNNForConditionalGeneration:
    """Bahdanau's GRU model trained to reverse (`tasks.train_rnn_reverser`, ~15 s)."""
    model = train_rnn_reverser(rnn_type="gru", decoder_style="bahdanau", attention_score="additive")
    model.generation_config.update(max_new_tokens=10, num_beams=1)
    return model.eval()


@pytest.mark.parametrize("num_beams", [1, 3])
def test_reverser_alignment_is_the_anti_diagonal(reverser, num_beams):
    input_ids, attention_mask, _ = reverse_task(100, torch.Generator().manual_seed(123))
    with torch.no_grad():
        outputs = reverser.generate(
            input_ids,
            attention_mask=attention_mask,
            num_beams=num_beams,
            output_attentions=True,
            return_dict_in_generate=True,
        )
    aligned = rows = 0
    for index in range(len(input_ids)):
        attention = attention_from_generate(outputs, input_ids, attention_mask, index, letter_tokenizer())
        length = len(attention.source_tokens)
        assert attention.source_tokens == [LETTERS[i - 3] for i in input_ids[index, :length].tolist()]
        assert attention.target_tokens[-1] == "</s>"
        alignment = attention.alignment()  # (T, S); target token t is source token length - 1 - t, then EOS
        assert alignment.shape == (len(attention.target_tokens), length)
        assert torch.allclose(alignment.sum(-1), torch.ones(len(alignment)))
        predicted = alignment[:length].argmax(-1)
        aligned += (predicted == torch.arange(length - 1, -1, -1)[: len(predicted)]).sum().item()
        rows += length
    assert aligned / rows >= 0.9


@needs_matplotlib
def test_picture_of_the_reverser_has_the_sentence_tokens(reverser, tmp_path):
    tokenizer = letter_tokenizer()
    encoded = tokenizer(["a c e g i k m"], return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        outputs = reverser.generate(**encoded, output_attentions=True, return_dict_in_generate=True)
    attention = attention_from_generate(outputs, encoded["input_ids"], encoded["attention_mask"], 0, tokenizer)
    figure = plot_alignment(attention, path=tmp_path / "alignment.png")
    heatmap, colorbar = figure.axes  # one panel and its colour bar
    assert [label.get_text() for label in heatmap.get_xticklabels()] == list("acegikm")
    assert [label.get_text() for label in heatmap.get_yticklabels()] == [*"mkigeca", "</s>"]
    assert colorbar.get_ylabel() == "attention weight"
    assert (tmp_path / "alignment.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(plot_alignment(attention, mode="layers").axes) == 2  # the RNN has one "layer"


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
def test_generate_attention_equals_a_teacher_forced_forward(model_type, num_beams):
    if model_type == "attn_transformer":
        model = tiny_model("eager", vocab_size=16)
    else:
        torch.manual_seed(0)
        config = AttnRNNConfig(vocab_size=16, **dict.fromkeys(RNN_SIZES, 8))
        model = AttnRNNForConditionalGeneration(config).eval()
    input_ids, attention_mask, _ = reverse_task(4, torch.Generator().manual_seed(5))
    with torch.no_grad():
        outputs = model.generate(
            input_ids,
            attention_mask=attention_mask,
            num_beams=num_beams,
            max_new_tokens=6,
            output_attentions=True,
            return_dict_in_generate=True,
        )
    for index in range(len(input_ids)):
        attention = attention_from_generate(outputs, input_ids, attention_mask, index)
        steps, length = len(attention.target_tokens), len(attention.source_tokens)
        with torch.no_grad():
            reference = model(
                input_ids=input_ids[index : index + 1, :length],
                decoder_input_ids=outputs.sequences[index : index + 1, :steps],
                output_attentions=True,
            )
        cross = torch.stack([layer[0] for layer in reference.cross_attentions])
        cross = cross if cross.dim() == 4 else cross[:, None]  # the RNN: one "head"
        torch.testing.assert_close(attention.cross_attention, cross, atol=1e-5, rtol=1e-4)
        assert attention.target_tokens == [str(i) for i in outputs.sequences[index, 1 : steps + 1].tolist()]
        if model_type == "attn_transformer":
            encoder = torch.stack([layer[0] for layer in reference.encoder_attentions])
            decoder = torch.stack([layer[0] for layer in reference.decoder_attentions])
            torch.testing.assert_close(attention.encoder_attention, encoder, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(attention.decoder_attention, decoder, atol=1e-5, rtol=1e-4)
        else:
            assert attention.encoder_attention is None and attention.decoder_attention is None


def transformer_attention(num_layers: int = 2, num_heads: int = 4):
    model = tiny_model(
        "eager", vocab_size=16, encoder_layers=num_layers, decoder_layers=num_layers, num_heads=num_heads
    )
    tokenizer = letter_tokenizer()
    encoded = tokenizer(["a b c d e"], return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        outputs = model.generate(**encoded, max_new_tokens=4, output_attentions=True, return_dict_in_generate=True)
    return attention_from_generate(outputs, encoded["input_ids"], encoded["attention_mask"], 0, tokenizer)


@needs_matplotlib
@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_self_attention_grid_has_a_panel_per_layer_and_head(stack, tmp_path):
    attention = transformer_attention()
    figure = plot_self_attention(attention, stack, path=tmp_path / f"{stack}.png")
    panels = figure.axes[:-1]
    assert len(panels) == 2 * 4 and figure.axes[-1].get_ylabel() == "attention weight"
    labels = attention.source_tokens if stack == "encoder" else attention.decoder_input_tokens
    assert [label.get_text() for label in panels[0].get_yticklabels()] == labels  # left column
    assert [label.get_text() for label in panels[-1].get_xticklabels()] == labels  # bottom row
    assert not any(label.get_text() for label in panels[1].get_yticklabels())  # inner panels: no labels
    assert (tmp_path / f"{stack}.png").stat().st_size > 0
    layers = plot_alignment(attention, mode="layers")
    assert [axis.get_title() for axis in layers.axes[:-1]] == ["layer 1, mean over heads", "layer 2, mean over heads"]


def test_rnn_has_no_self_attention_to_plot(reverser):
    input_ids, attention_mask, _ = reverse_task(1, torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = reverser.generate(
            input_ids, attention_mask=attention_mask, output_attentions=True, return_dict_in_generate=True
        )
    with pytest.raises(ValueError, match="no encoder self-attention .* the RNN has none"):
        plot_self_attention(attention_from_generate(outputs, input_ids, attention_mask), "encoder")


def test_output_without_attentions_is_a_clear_error():
    model = tiny_model("eager", vocab_size=16)
    input_ids, attention_mask, _ = reverse_task(1, torch.Generator().manual_seed(0))
    outputs = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=3, return_dict_in_generate=True)
    with pytest.raises(ValueError, match=r"output_attentions=True, return_dict_in_generate=True"):
        attention_from_generate(outputs, input_ids, attention_mask)


def test_bertviz_export_has_the_head_view_layout(tmp_path):
    attention = transformer_attention()
    data = bertviz_data(attention)
    assert data["encoder_tokens"] == attention.source_tokens
    assert data["decoder_tokens"] == attention.decoder_input_tokens
    steps, length = len(attention.target_tokens), len(attention.source_tokens)
    assert [torch.tensor(layer).shape for layer in data["cross_attention"]] == [(1, 4, steps, length)] * 2
    assert [torch.tensor(layer).shape for layer in data["encoder_attention"]] == [(1, 4, length, length)] * 2
    assert [torch.tensor(layer).shape for layer in data["decoder_attention"]] == [(1, 4, steps, steps)] * 2
    assert json.loads(save_bertviz_json(attention, tmp_path / "view.json").read_text()) == data


def test_missing_matplotlib_is_a_clear_error(monkeypatch):
    attention = transformer_attention()
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # what an environment without the extra sees
    with pytest.raises(ImportError, match=r'pip install "modeling-attn\[plot\]"'):
        plot_alignment(attention)


def saved(reverser, folder: Path) -> Path:
    """The reverser saved with its letter tokenizer: a model folder for `attn translate`."""
    reverser.save_pretrained(folder)
    letter_tokenizer().save_pretrained(folder)
    return folder


def picture_flags(folder: Path) -> list[str]:
    """A picture of each sentence's attention and the JSON of the first, written to `folder`."""
    return ["--attention-png", str(folder / "align-{n}.png"), "--attention-json", str(folder / "first.json")]


@needs_matplotlib
def test_cli_writes_the_pictures_of_the_reverser(reverser, tmp_path, capsys):
    argv = ["--model", str(saved(reverser, tmp_path / "model")), "a b c d e f", "m l k j", *picture_flags(tmp_path)]
    capsys.readouterr()
    assert translate_main(argv) == 0
    assert capsys.readouterr().out.splitlines() == ["f e d c b a", "j k l m"]
    assert {path.name for path in tmp_path.iterdir()} == {
        "model",
        "align-0.png",
        "align-1.png",
        "first.json",
    }
    assert json.loads((tmp_path / "first.json").read_text())["encoder_tokens"] == list("abcdef")


@needs_matplotlib
def test_cli_pictures_the_first_non_empty_sentence(reverser, tmp_path, capsys):
    """An empty sentence has no attention: FILE pictures the first non-empty one, {n} skips it with a note."""
    argv = ["--model", str(saved(reverser, tmp_path / "model")), "", "a b c", *picture_flags(tmp_path)]
    capsys.readouterr()
    assert translate_main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["", "c b a"]
    assert "attn translate: sentence 0 is empty: no attention picture for it" in captured.err
    assert {path.name for path in tmp_path.iterdir()} == {"model", "align-1.png", "first.json"}
    assert json.loads((tmp_path / "first.json").read_text())["encoder_tokens"] == ["a", "b", "c"]

    argv = ["--model", str(tmp_path / "model"), "", "--attention-png", str(tmp_path / "none.png")]
    assert translate_main(argv) == 0
    assert "every sentence was empty: no attention picture written" in capsys.readouterr().err
    assert not (tmp_path / "none.png").exists()

    argv = ["--model", str(tmp_path / "model"), "a b", "--self-attention-png", str(tmp_path / "self.png")]
    assert translate_main(argv) == 2
    message = capsys.readouterr().err.splitlines()[-1]
    assert (
        message == f"attn translate: error: --self-attention-png: {tmp_path / 'model'} is an RNN model, with no "
        "self-attention to picture"
    )


@needs_matplotlib
def test_cli_pictures_never_replace_an_input_or_a_users_file_and_name_a_bad_format(reverser, tmp_path, capsys):
    """The picture flags write through api/outputs.py as --output does: checked before any work, written whole, a
    file attn wrote replaced on the next run, anything else only with --overwrite."""
    model = saved(reverser, tmp_path / "model")
    source, users = tmp_path / "in.txt", tmp_path / "mine.png"
    source.write_text("a b c\n")
    users.write_bytes(b"the user's picture")
    before = {path: path.read_bytes() for path in [source, users, *model.iterdir()]}
    for flags, expected in [
        (
            ["--input", str(source), "--attention-json", str(source)],
            f"--attention_json {source} is --input {source}: writing it would destroy the input",
        ),
        (
            ["--attention-png", str(model / "attention.png"), "a"],
            f"--attention_png {model / 'attention.png'} is inside --model {model}: write it somewhere else",
        ),
        (
            ["--attention-png", str(users), "a"],
            f"--attention_png {users} already exists; pass --overwrite to replace it",
        ),
        (
            ["--self-attention-png", str(tmp_path / "self.json"), "a"],
            f"--self_attention_png {tmp_path / 'self.json'}: json is not a picture format; end the name with one of ",
        ),
        (
            ["--attention-json", str(tmp_path / "missing" / "a.json"), "a"],
            f"--attention_json {tmp_path / 'missing' / 'a.json'}: the folder {tmp_path / 'missing'} does not exist",
        ),
    ]:
        capsys.readouterr()
        assert translate_main(["--model", str(model), *flags]) == 2
        assert f"attn translate: error: {expected}" in capsys.readouterr().err.splitlines()[-1]
    assert {path: path.read_bytes() for path in before} == before
    picture = tmp_path / "cross.png"
    for _ in range(2):  # the second run replaces the picture the first wrote, without --overwrite
        assert translate_main(["--model", str(model), "--attention-png", str(picture), "a b"]) == 0
        assert picture.read_bytes().startswith(b"\x89PNG")
    assert translate_main(["--model", str(model), "--attention-png", str(users), "--overwrite", "true", "a b"]) == 0
    assert users.read_bytes().startswith(b"\x89PNG")


def test_cli_nbest_scores_of_translations_that_end(reverser, tmp_path, capsys):
    """The reverser ends its translations with </s>: the n-best scores count the tokens up to it, as generate()'s
    sequences_scores do, for sentences of different lengths in one batch."""
    reverser.save_pretrained(tmp_path / "model")
    letter_tokenizer().save_pretrained(tmp_path / "model")
    sentences = ["a b c d e f", "m l k", "b d f h j l"]
    argv = [
        "--model",
        str(tmp_path / "model"),
        "--num_return_sequences",
        "3",
        "--num_beams",
        "3",
        "--length_penalty",
        "0.6",
        "--no_progress",
        *sentences,
    ]
    capsys.readouterr()
    assert translate_main(argv) == 0
    rows = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    encoded = letter_tokenizer()(sentences, padding=True, return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        outputs = reverser.generate(
            **encoded,
            num_beams=3,
            num_return_sequences=3,
            length_penalty=0.6,
            output_scores=True,
            return_dict_in_generate=True,
        )
    assert (outputs.sequences == 2).any(dim=1).all()  # every hypothesis ends with </s>
    assert rows[0][1] == "f e d c b a" and rows[3][1] == "k l m"
    assert [row[1] for row in rows] == letter_tokenizer().batch_decode(outputs.sequences, skip_special_tokens=True)
    assert [float(row[2]) for row in rows] == pytest.approx(outputs.sequences_scores.tolist(), abs=1e-4)


@needs_matplotlib
def test_cli_writes_transformer_self_attention_grids(tmp_path, capsys):
    folder = tmp_path / "model"
    tiny_model("sdpa", vocab_size=16).save_pretrained(folder)  # the command switches to eager attention itself
    letter_tokenizer().save_pretrained(folder)
    argv = [
        "--model",
        str(folder),
        "a b c",
        "--max_new_tokens",
        "3",
        "--self-attention-png",
        str(tmp_path / "self.png"),
        "--attention-png",
        str(tmp_path / "cross.png"),
        "--attention-mode",
        "layers",
    ]
    assert translate_main(argv) == 0
    written = {"model", "self.encoder.png", "self.decoder.png", "cross.png"}
    assert {path.name for path in tmp_path.iterdir()} == written


@pytest.mark.slow
def test_transformer_reverser_alignment_is_the_anti_diagonal():
    """The Transformer reverser of test_learning (~35 s to train): its cross-attention, averaged over layers and
    heads, is the anti-diagonal (measured: 98% of rows; the last layer alone 99%, the first 39%)."""
    from test_learning import train_reverser

    with one_thread():
        model = train_reverser()
    model.set_attn_implementation("eager")
    input_ids, attention_mask, _ = reverse_task(100, torch.Generator().manual_seed(123))
    with torch.no_grad():
        outputs = model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=10,
            output_attentions=True,
            return_dict_in_generate=True,
        )
    aligned = rows = 0
    for index in range(len(input_ids)):
        attention = attention_from_generate(outputs, input_ids, attention_mask, index, eos_token_id=2)
        length = len(attention.source_tokens)
        predicted = attention.alignment()[:length].argmax(-1)
        aligned += (predicted == torch.arange(length - 1, -1, -1)[: len(predicted)]).sum().item()
        rows += length
    assert aligned / rows >= 0.9
