"""`attn translate` and `attn evaluate` (modeling_attn/app/translate.py, modeling_attn/translation.py) on tiny saved models of both types, each with a
real BPE tokenizer trained by the recipe's `train_bpe_tokenizer`.

Reference checks: the command's output equals `model.generate` run in Python one sentence at a time, for stdin,
a file and arguments, for every batch size; `attn evaluate`'s BLEU equals sacreBLEU run directly.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import sacrebleu
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from modeling_attn import AttnRNNConfig, AttnRNNForConditionalGeneration, AttnTransformerConfig
from modeling_attn import AttnTransformerForConditionalGeneration as Transformer
from modeling_attn.app.evaluate import evaluate_main
from modeling_attn.app.translate import translate_main
from modeling_attn.translation import load_model, translate
from training.tokenizer import train_bpe_tokenizer

CORPUS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "die Katze saß auf der Matte",
    "ein Hund lief im Park",
    "Tuesday, March 3rd, 1987",
    "1987-03-03",
    "the 4th of July 1776",
    "1776-07-04",
]
SENTENCES = ["the cat sat", "a dog ran in the park on Tuesday", "1987", "der Hund", "the 4th of March 1987", "park"]


def save_tiny_model(folder, model_type: str):
    """A randomly initialised tiny model with a BPE tokenizer trained on CORPUS, saved to `folder`."""
    tokenizer = train_bpe_tokenizer(CORPUS, vocab_size=100, min_frequency=1)
    special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    torch.manual_seed(0)
    if model_type == "attn_transformer":
        config = AttnTransformerConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=2, decoder_layers=2,
                                       num_heads=4, d_ff=32, dropout=0.0, **special)  # fmt: skip
        model = Transformer(config)
    else:
        config = AttnRNNConfig(vocab_size=len(tokenizer), embedding_size=16, encoder_hidden_size=16,
                               decoder_hidden_size=16, attention_size=16, readout_size=16, **special)  # fmt: skip
        model = AttnRNNForConditionalGeneration(config)
        with torch.no_grad():  # Luong's uniform [-0.1, 0.1] start translates every sentence alike
            for parameter in model.parameters():
                parameter.uniform_(-1.0, 1.0)
    model.generation_config.update(max_new_tokens=6, num_beams=2)  # beam search unless the command overrides it
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["attn_transformer", "attn_rnn"])
def model_dir(request, tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


def reference_translations(folder, sentences, **generate_kwargs) -> list[str]:
    """model.generate on one sentence at a time, decoded: what the command must print."""
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    outputs = []
    with torch.no_grad():
        for sentence in sentences:
            encoded = tokenizer([sentence], return_tensors="pt", return_token_type_ids=False)
            generated = model.generate(**encoded, **generate_kwargs)
            outputs.append(tokenizer.decode(generated[0], skip_special_tokens=True))
    return outputs


def run_translate(argv, capsys, monkeypatch, stdin: str | None = None) -> list[str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    capsys.readouterr()
    assert translate_main(argv) == 0
    return capsys.readouterr().out.splitlines()


def test_translate_stdin_file_and_arguments_equal_generate(model_dir, tmp_path, capsys, monkeypatch):
    expected = reference_translations(model_dir, SENTENCES)
    assert len(set(expected)) > 1  # the random model does not translate everything alike
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES) + "\n")
    stdin = run_translate(["--model", str(model_dir)], capsys, monkeypatch, stdin="\n".join(SENTENCES) + "\n")
    from_file = run_translate(["--model", str(model_dir), "--input", str(source)], capsys, monkeypatch)
    arguments = run_translate(["--model", str(model_dir), *SENTENCES], capsys, monkeypatch)
    assert stdin == from_file == arguments == expected


@pytest.mark.parametrize("batch_size", [1, 2, 4, 64])
def test_batch_size_does_not_change_translations(model_dir, tmp_path, capsys, monkeypatch, batch_size):
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES) + "\n")
    argv = ["--model", str(model_dir), "--input", str(source), "--batch_size", str(batch_size)]
    assert run_translate(argv, capsys, monkeypatch) == reference_translations(model_dir, SENTENCES)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_num_beams_overrides_the_generation_config(model_dir, capsys, monkeypatch, num_beams):
    argv = ["--model", str(model_dir), "--num_beams", str(num_beams), "--batch_size", "4", *SENTENCES]
    expected = reference_translations(model_dir, SENTENCES, num_beams=num_beams)
    assert run_translate(argv, capsys, monkeypatch) == expected


def test_empty_lines_stay_in_place(model_dir, capsys, monkeypatch):
    lines = run_translate(["--model", str(model_dir)], capsys, monkeypatch, stdin="the cat sat\n\npark\n")
    assert lines == [
        *reference_translations(model_dir, ["the cat sat"]),
        "",
        *reference_translations(model_dir, ["park"]),
    ]


def test_evaluate_bleu_equals_sacrebleu(model_dir, tmp_path, capsys, monkeypatch):
    hypotheses = reference_translations(model_dir, SENTENCES, num_beams=1)  # greedy: longer random outputs
    # Half the references are the model's own translations, so that BLEU is neither 0 nor 100.
    references = [h if i % 2 == 0 else s for i, (h, s) in enumerate(zip(hypotheses, SENTENCES, strict=True))]
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("".join(f"{line}\t{line}\n" for line in CORPUS))
    (data / "test.tsv").write_text("".join(f"{s}\t{r}\n" for s, r in zip(SENTENCES, references, strict=True)))
    written = tmp_path / "hypotheses.txt"
    argv = ["--model", str(model_dir), "--data", str(data), "--split", "test", "--batch_size", "4", "--num_beams", "1"]
    capsys.readouterr()
    assert evaluate_main([*argv, "--output", str(tmp_path / "scores.json"), "--hypotheses", str(written)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "scores.json").read_text())
    assert written.read_text().splitlines() == hypotheses
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    assert printed["bleu"] == pytest.approx(bleu.score)
    assert 0 < printed["bleu"] < 100
    assert printed["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    assert printed["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert printed["sentences"] == len(SENTENCES)
    assert printed["generation"] == {"num_beams": 1, "length_penalty": None, "max_length": None, "max_new_tokens": 6}


def test_evaluate_missing_split_is_a_clear_error(model_dir, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("a\tb\n")
    assert evaluate_main(["--model", str(model_dir), "--data", str(data), "--split", "test"]) == 2
    assert "no test split" in capsys.readouterr().err


def test_translate_streams_batch_by_batch(model_dir):
    """A translation comes out as soon as its batch is read, before the rest of the input exists."""
    model, tokenizer = load_model(str(model_dir))
    consumed = []

    def lines():
        for sentence in SENTENCES:
            consumed.append(sentence)
            yield sentence

    stream = translate(model, tokenizer, lines(), batch_size=2)
    first = next(stream)
    assert len(consumed) == 2
    assert [first, *stream] == reference_translations(model_dir, SENTENCES)


def test_attn_translate_command_on_stdin(model_dir):
    """The installed command line end to end: `attn translate` in a new process, sentences on stdin."""
    result = subprocess.run(
        [sys.executable, "-m", "modeling_attn.app.cli", "translate", "--model", str(model_dir), "--batch_size", "4"],
        input="\n".join(SENTENCES) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.splitlines() == reference_translations(model_dir, SENTENCES)


def test_a_closed_pipe_ends_translate_quietly(model_dir, tmp_path):
    """`attn translate ... | head -1`: the reader leaves early; the command stops without a traceback."""
    source = tmp_path / "many.txt"
    source.write_text("\n".join(SENTENCES * 400) + "\n")  # still translating when the reader leaves
    process = subprocess.Popen(
        [sys.executable, "-m", "modeling_attn.app.cli", "translate", "--model", str(model_dir), "--input", str(source),
         "--batch_size", "4", "--num_beams", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = process.stdout.readline()
    process.stdout.close()  # as `head -1` does
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 141 and first.strip() != ""
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
