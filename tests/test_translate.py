"""`attn translate` and `attn evaluate` (modeling_attn/cli/translate.py, cli/evaluate.py,
modeling_attn/api/translation.py) on tiny saved models of both types, each with a real BPE tokenizer trained by the
recipe's `train_bpe_tokenizer`.

Reference checks: the command's output equals `model.generate` run in Python one sentence at a time, for stdin,
a file and arguments, for every batch size; n-best scores equal generate()'s `sequences_scores` (beam search) and
the log-probabilities of generate()'s own logits (sampling); `attn evaluate`'s BLEU, chrF and TER equal sacreBLEU
run directly, for every way of giving the test set.
"""

from __future__ import annotations

import io
import json
import math
import shlex
import signal
import subprocess
import sys
import time

import pytest
import sacrebleu
import torch
from modeling_attn.training.tokenizer import train_bpe_tokenizer
from tiny import tiny_config, tiny_rnn_config
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, set_seed

from modeling_attn import AttnRNNForConditionalGeneration
from modeling_attn import AttnTransformerForConditionalGeneration as Transformer
from modeling_attn.api.translation import TranslateError, load_model, translate, translate_batch, translate_nbest
from modeling_attn.cli.evaluate import main as evaluate_main
from modeling_attn.cli.translate import main as translate_main

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
        model = Transformer(tiny_config(vocab_size=len(tokenizer), **special))
    else:
        model = AttnRNNForConditionalGeneration(tiny_rnn_config(vocab_size=len(tokenizer), **special))
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


@pytest.fixture(scope="module")
def transformer_dir(tmp_path_factory):
    """One model for the tests of the command's mechanics (flags, files, errors)."""
    return save_tiny_model(tmp_path_factory.mktemp("transformer"), "attn_transformer")


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
    # the decoding as attn train records it (what attn push reads): the model's max_new_tokens 6 is a fixed limit
    assert printed["generation"] == {
        "num_beams": 1,
        "length_penalty": None,
        "early_stopping": None,
        "max_length_over_source": None,
        "max_length": 7,
    }


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
        [sys.executable, "-m", "modeling_attn.cli.main", "translate", "--model", str(model_dir), "--batch_size", "4"],
        input="\n".join(SENTENCES) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.splitlines() == reference_translations(model_dir, SENTENCES)


# `attn translate` in a process of its own, and its flags for a run of batches of 4 greedy translations.
ATTN_TRANSLATE = [sys.executable, "-m", "modeling_attn.cli.main", "translate"]
ONE_BEAM = shlex.split("--batch_size 4 --num_beams 1")


def test_a_closed_pipe_ends_translate_quietly(model_dir, tmp_path):
    """`attn translate ... | head -1`: the reader leaves early; the command stops without a traceback."""
    source = tmp_path / "many.txt"
    source.write_text("\n".join(SENTENCES * 400) + "\n")  # still translating when the reader leaves
    process = subprocess.Popen(
        [*ATTN_TRANSLATE, "--model", str(model_dir), "--input", str(source), *ONE_BEAM],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = process.stdout.readline()
    process.stdout.close()  # as `head -1` does
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 141 and first.strip() != ""
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr


# -- the attn command-line convention ----------------------------------------------------------------------------


def test_both_flag_spellings_and_a_flags_file_translate_alike(transformer_dir, tmp_path, capsys, monkeypatch):
    expected = reference_translations(transformer_dir, SENTENCES, num_beams=1)
    dashes = ["--model", str(transformer_dir), "--batch-size", "2", "--num-beams", "1", "--no-progress", *SENTENCES]
    underscores = [
        "--model",
        str(transformer_dir),
        "--batch_size",
        "2",
        "--num_beams",
        "1",
        "--no_progress",
        *SENTENCES,
    ]
    flags = tmp_path / "flags.yaml"
    flags.write_text(f"model: {transformer_dir}\nbatch-size: 2\nnum_beams: 1\nprogress: false\n")
    assert run_translate(dashes, capsys, monkeypatch) == expected
    assert run_translate(underscores, capsys, monkeypatch) == expected
    assert run_translate([str(flags), *SENTENCES], capsys, monkeypatch) == expected


def test_help_shows_the_defaults_that_apply(capsys):
    for main in (translate_main, evaluate_main):
        with pytest.raises(SystemExit) as exit_info:
            main(["--help"])
        assert exit_info.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "--batch_size BATCH_SIZE, --batch-size BATCH_SIZE Sentences per generate() call. (default: 32)" in text
        assert "Beam size (default: the model's generation_config)." in text and "(default: None)" not in text
    with pytest.raises(SystemExit):
        evaluate_main(["--help"])
    assert "--source_lang SOURCE_LANG, --source-lang SOURCE_LANG" in capsys.readouterr().out


def error_line(main, argv, capsys) -> str:
    """The one stderr line of a command that refuses `argv` with exit status 2."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_info:  # the parser's own errors
        code = exit_info.code
    captured = capsys.readouterr()
    # transformers' own "Loading weights" bar comes before errors found once the model is loaded
    lines = [line for line in captured.err.replace("\r", "\n").splitlines() if line and "Loading weights" not in line]
    assert code == 2 and len(lines) == 1, captured.err
    assert captured.out == ""
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--batch-sise", "2", "x"], "unrecognized flag --batch-sise; did you mean --batch_size?"),
        (["--num_beams", "0", "x"], "argument --num_beams: must be a positive integer, got 0"),
        (["--top_k", "3", "x"], "--top_k: a sampling setting, with no --do_sample; add --do_sample"),
        (["--do_sample", "--top_p", "1.5", "x"], "argument --top_p: must be a probability in (0, 1], got 1.5"),
        (
            ["--do_sample", "--temperature", "nan", "x"],
            "argument --temperature: must be a finite number above 0, got nan",
        ),
        (["--length_penalty", "inf", "x"], "argument --length_penalty: must be a finite number, got inf"),
        (["--num_return_sequences", "3", "--num_beams", "2", "x"], "num_return_sequences=3 is more than num_beams=2"),
        (["--num_return_sequences", "2", "--attention-png", "a.png", "x"], "drop --num_return_sequences"),
        (["--device", "gpu", "x"], "device 'gpu': not a device name"),
        (["--input", "{tmp}/missing.txt"], "--input {tmp}/missing.txt: no such file; give a file of sentences"),
        (["--input", "{tmp}"], "--input {tmp}: a folder; give a file of sentences"),
        (["--output", "{tmp}/no/folder.txt", "x"], "the folder {tmp}/no does not exist"),
        (["x", "--input", "{tmp}/x.txt"], "give the sentences as arguments or with --input, not both"),
    ],
)
def test_translate_user_errors_are_one_line(transformer_dir, tmp_path, capsys, argv, expected):
    argv = [argument.replace("{tmp}", str(tmp_path)) for argument in argv]
    line = error_line(translate_main, ["--model", str(transformer_dir), *argv], capsys)
    assert line.startswith("attn translate: error: ") and expected.replace("{tmp}", str(tmp_path)) in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_one_line(transformer_dir, capsys):
    line = error_line(translate_main, ["--model", str(transformer_dir), "--device", "cuda", "x"], capsys)
    assert "device 'cuda': CUDA is not available" in line
    line = error_line(evaluate_main, ["--model", str(transformer_dir), "--device", "cuda:0"], capsys)
    assert line.startswith("attn evaluate: error: device 'cuda:0': CUDA is not available")


def test_a_missing_or_broken_model_folder_is_one_line(transformer_dir, tmp_path, capsys):
    line = error_line(translate_main, ["--model", str(tmp_path / "nope"), "x"], capsys)
    assert line == f"attn translate: error: {tmp_path / 'nope'}: no such model folder"
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text('{"model_type": "no_such_type"}')
    line = error_line(translate_main, ["--model", str(tmp_path / "unknown"), "x"], capsys)
    assert (
        line.startswith(f"attn translate: error: {tmp_path / 'unknown' / 'config.json'}: ") and "no_such_type" in line
    )
    (tmp_path / "no_tokenizer").mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (tmp_path / "no_tokenizer" / name).write_bytes((transformer_dir / name).read_bytes())
    line = error_line(evaluate_main, ["--model", str(tmp_path / "no_tokenizer")], capsys)
    assert line.startswith(f"attn evaluate: error: {tmp_path / 'no_tokenizer'}: no tokenizer (tokenizer.json")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--sorce-lang", "en"], "unrecognized flag --sorce-lang; did you mean --source_lang?"),
        (["--hypotheses_file", "h.txt"], "--hypotheses_file needs --references_file"),
        (["--model", "m", "--hypotheses_file", "h", "--references_file", "r"], "drop --model"),
        (["--sources_file", "s.txt", "--model", "m"], "--sources_file and --references_file go together"),
        (["--split", "dev", "--model", "m"], "argument --split: invalid choice: 'dev'"),
        (["--model", "{tmp}/m"], "{tmp}/m: no such model folder"),
        (["--model", "{tmp}/m", "--data", "{tmp}/d"], "{tmp}/d: no such folder, and not a dataset"),
        (
            ["--hypotheses_file", "{tmp}/h.txt", "--references_file", "{tmp}/r.txt"],
            "{tmp}/h.txt:2: line has no counterpart: r.txt has 1 lines but h.txt has 2",
        ),
    ],
)
def test_evaluate_user_errors_are_one_line(tmp_path, capsys, argv, expected):
    (tmp_path / "h.txt").write_text("a\nb\n")
    (tmp_path / "r.txt").write_text("a\n")
    line = error_line(evaluate_main, [argument.replace("{tmp}", str(tmp_path)) for argument in argv], capsys)
    assert line.startswith("attn evaluate: error: ") and expected.replace("{tmp}", str(tmp_path)) in line


# -- n-best lists and sampling -----------------------------------------------------------------------------------


def beam_reference(folder, sentence: str, num_beams: int, **generate_kwargs) -> list[tuple[str, float]]:
    """generate()'s own n-best list of one sentence: texts and sequences_scores."""
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer([sentence], return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        outputs = model.generate(
            **encoded,
            num_beams=num_beams,
            num_return_sequences=num_beams,
            output_scores=True,
            return_dict_in_generate=True,
            **generate_kwargs,
        )
    texts = tokenizer.batch_decode(outputs.sequences, skip_special_tokens=True)
    return list(zip(texts, outputs.sequences_scores.tolist(), strict=True))


@pytest.mark.parametrize("length_penalty", [1.0, 0.6])
def test_nbest_scores_are_the_sequences_scores_of_generate(model_dir, length_penalty):
    model, tokenizer = load_model(str(model_dir))
    settings = {"length_penalty": length_penalty, "max_new_tokens": 8}
    nbest = translate_nbest(model, tokenizer, [*SENTENCES, ""], num_return_sequences=3, num_beams=3, **settings)
    for sentence, block in zip(SENTENCES, nbest, strict=False):
        expected = beam_reference(model_dir, sentence, 3, **settings)
        assert [hypothesis.text for hypothesis in block] == [text for text, _ in expected]
        assert [hypothesis.score for hypothesis in block] == pytest.approx([score for _, score in expected], abs=1e-5)
    assert [hypothesis.text for hypothesis in nbest[-1]] == ["", "", ""]  # the empty sentence
    assert all(math.isnan(hypothesis.score) for hypothesis in nbest[-1])
    with pytest.raises(TranslateError, match="use translate_nbest"):  # one translation per sentence there
        translate_batch(model, tokenizer, SENTENCES, num_return_sequences=2)


def test_nbest_list_format(transformer_dir, capsys, monkeypatch):
    argv = [
        "--model",
        str(transformer_dir),
        "--num_return_sequences",
        "2",
        "--num_beams",
        "2",
        "--no_progress",
        SENTENCES[0],
        "",
        SENTENCES[1],
    ]
    rows = [line.split(" ||| ") for line in run_translate(argv, capsys, monkeypatch)]
    assert [row[0] for row in rows] == ["0", "0", "1", "1", "2", "2"] and all(len(row) == 3 for row in rows)
    assert [row[1:] for row in rows[2:4]] == [["", "nan"], ["", "nan"]]
    for number, sentence in ((0, SENTENCES[0]), (2, SENTENCES[1])):
        expected = beam_reference(transformer_dir, sentence, 2)
        block = [row for row in rows if row[0] == str(number)]
        assert [row[1] for row in block] == [text for text, _ in expected]
        assert [float(row[2]) for row in block] == pytest.approx([score for _, score in expected], abs=1e-4)


def sampled_reference(folder, sentences, seed: int, num_return_sequences: int, **sampling) -> list[list[tuple]]:
    """One seeded generate(do_sample=True) call on the padded batch, scored from generate()'s own logits: the
    log-softmax of each chosen token's logits, up to and including the first end of sentence, best first."""
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(sentences, padding=True, return_tensors="pt", return_token_type_ids=False)
    set_seed(seed)
    with torch.no_grad():
        outputs = model.generate(
            **encoded,
            do_sample=True,
            num_beams=1,
            num_return_sequences=num_return_sequences,
            output_logits=True,
            return_dict_in_generate=True,
            **sampling,
        )
    transition = model.compute_transition_scores(outputs.sequences, outputs.logits, normalize_logits=True)
    generated = outputs.sequences[:, 1:]
    ends = (generated == model.generation_config.eos_token_id).int()
    counted = (ends.cumsum(dim=1) - ends) == 0
    scores = (transition * counted).sum(dim=1) / counted.sum(dim=1) ** (model.generation_config.length_penalty or 1)
    texts = tokenizer.batch_decode(outputs.sequences, skip_special_tokens=True)
    pairs = list(zip(texts, scores.tolist(), strict=True))
    blocks = [pairs[i : i + num_return_sequences] for i in range(0, len(pairs), num_return_sequences)]
    return [sorted(block, key=lambda pair: -pair[1]) for block in blocks]


def test_seeded_sampling_repeats_and_scores_the_samples(model_dir, capsys, monkeypatch):
    argv = [
        "--model",
        str(model_dir),
        "--do_sample",
        "--temperature",
        "1.5",
        "--top_k",
        "30",
        "--max_new_tokens",
        "8",
        "--num_return_sequences",
        "3",
        "--batch_size",
        "64",
        "--no_progress",
        *SENTENCES,
    ]
    first = run_translate([*argv, "--seed", "7"], capsys, monkeypatch)
    assert run_translate([*argv, "--seed", "7"], capsys, monkeypatch) == first  # same seed, same samples
    assert run_translate([*argv, "--seed", "8"], capsys, monkeypatch) != first
    expected = sampled_reference(model_dir, SENTENCES, 7, 3, temperature=1.5, top_k=30, max_new_tokens=8)
    rows = [line.split(" ||| ") for line in first]
    assert [row[1] for row in rows] == [text for block in expected for text, _ in block]
    assert [float(row[2]) for row in rows] == pytest.approx(
        [score for block in expected for _, score in block], abs=1e-4
    )
    assert len({row[1] for row in rows}) > len(SENTENCES)  # samples, not one translation repeated


# -- output, threads, progress -----------------------------------------------------------------------------------


def test_output_file_holds_what_stdout_would(transformer_dir, tmp_path, capsys, monkeypatch):
    printed = run_translate(["--model", str(transformer_dir), *SENTENCES], capsys, monkeypatch)
    output = tmp_path / "out.txt"
    assert (
        run_translate(["--model", str(transformer_dir), "--output", str(output), *SENTENCES], capsys, monkeypatch)
        == []
    )
    assert output.read_text().splitlines() == printed
    # no temporary file left, nor a record beside it; the record of what attn wrote (in the user's state folder,
    # api/outputs.py) lets a second run replace it
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.txt"]
    assert run_translate(["--model", str(transformer_dir), "--output", str(output), "x"], capsys, monkeypatch) == []


def default_sigint() -> None:
    """Ctrl-C as at a terminal: a test run started in the background (`pytest &`, nohup) ignores SIGINT, its children
    inherit that, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_no_partial_output(transformer_dir, tmp_path, signum):
    """The output appears only when the run ends well: killed halfway, an existing file is left as it was."""
    source, output = tmp_path / "many.txt", tmp_path / "out.txt"
    # far more input than is translated before the first buffered write shows in the temporary file: the run cannot
    # finish between that moment and the signal
    source.write_text("\n".join(SENTENCES * 50000) + "\n")
    output.write_text("the previous run\n")
    command = [*ATTN_TRANSLATE, "--model", str(transformer_dir), "--input", str(source), "--output", str(output)]
    process = subprocess.Popen(
        [*command, "--overwrite", *ONE_BEAM, "--no_progress"],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    deadline = time.monotonic() + 120
    try:
        while not any(path.stat().st_size > 0 for path in tmp_path.glob(".out.txt.*.partial")):  # halfway
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signum)
        stderr = process.communicate(timeout=60)[1]
    finally:
        process.kill()  # never left running when an assertion above fails
    assert process.returncode == (130 if signum == signal.SIGINT else 143), stderr
    assert "Traceback" not in stderr
    assert output.read_text() == "the previous run\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["many.txt", "out.txt"]


def test_threads_sets_torch_threads(transformer_dir, capsys, monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_translate(["--model", str(transformer_dir), "--threads", "1", "x"], capsys, monkeypatch)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_progress_bar_on_stdin_that_is_not_a_terminal(transformer_dir, capsys, monkeypatch):
    lines = "\n".join(SENTENCES) + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    assert translate_main(["--model", str(transformer_dir)]) == 0
    captured = capsys.readouterr()
    # a count: the size is not known; the engine that translates
    assert f"translatingwithctranslate2(auto):{len(SENTENCES)}sent[" in captured.err.replace(" ", "")
    assert len(captured.out.splitlines()) == len(SENTENCES)
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    assert translate_main(["--model", str(transformer_dir), "--no_progress"]) == 0
    assert "translating" not in capsys.readouterr().err


# -- attn evaluate: any test set -------------------------------------------------------------------------------


def sacrebleu_scores(hypotheses, references, lowercase: bool = False) -> dict[str, float]:
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references], lowercase=lowercase).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score
        if not lowercase
        else sacrebleu.metrics.CHRF(lowercase=True).corpus_score(hypotheses, [references]).score,
        "ter": sacrebleu.corpus_ter(hypotheses, [references], case_sensitive=not lowercase).score,
    }


@pytest.mark.parametrize("layout", ["text files", "tsv", "jsonl", "sources file"])
def test_evaluate_scores_a_test_only_folder_or_files(transformer_dir, tmp_path, capsys, layout):
    hypotheses = reference_translations(transformer_dir, SENTENCES, num_beams=1)
    references = [h if i % 2 == 0 else s for i, (h, s) in enumerate(zip(hypotheses, SENTENCES, strict=True))]
    data = tmp_path / "data"
    data.mkdir()  # test files only: no train split
    if layout == "text files":
        (data / "test.en").write_text("".join(f"{s}\n" for s in SENTENCES))
        (data / "test.de").write_text("".join(f"{r}\n" for r in references))
        flags = ["--data", str(data), "--source-lang", "en", "--target-lang", "de"]
    elif layout == "tsv":  # no header line
        (data / "test.tsv").write_text("".join(f"{s}\t{r}\n" for s, r in zip(SENTENCES, references, strict=True)))
        flags = ["--data", str(data)]
    elif layout == "jsonl":
        rows = [json.dumps({"translation": {"en": s, "de": r}}) for s, r in zip(SENTENCES, references, strict=True)]
        (data / "test.jsonl").write_text("\n".join(rows) + "\n")
        flags = ["--data", str(data), "--source_lang", "en", "--target_lang", "de"]
    else:
        (data / "sources.txt").write_text("".join(f"{s}\n" for s in SENTENCES))
        (data / "references.txt").write_text("".join(f"{r}\n" for r in references))
        flags = ["--sources_file", str(data / "sources.txt"), "--references_file", str(data / "references.txt")]
    capsys.readouterr()
    assert evaluate_main(["--model", str(transformer_dir), "--num_beams", "1", "--no_progress", *flags]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = sacrebleu_scores(hypotheses, references)
    assert {name: printed[name] for name in expected} == pytest.approx(expected)
    assert 0 < printed["bleu"] < 100 and printed["ter"] > 0
    assert printed["ter_signature"].startswith("nrefs:1|case:mixed|tok:tercom")
    assert printed["sentences"] == len(SENTENCES)


@pytest.mark.parametrize("lowercase", [False, True])
def test_evaluate_scores_a_file_of_translations_without_a_model(tmp_path, capsys, lowercase):
    hypotheses = ["The cat sat on a mat .", "A dog ran in the park", "", "Die Katze saß."]
    references = ["the cat sat on the mat .", "A dog ran in a park", "ein Hund", "Die Katze saß auf der Matte."]
    (tmp_path / "hyp.txt").write_text("".join(f"{h}\n" for h in hypotheses))
    (tmp_path / "ref.txt").write_text("".join(f"{r}\n" for r in references))
    argv = [
        "--hypotheses_file",
        str(tmp_path / "hyp.txt"),
        "--references_file",
        str(tmp_path / "ref.txt"),
        "--output",
        str(tmp_path / "scores.json"),
        *(["--lowercase"] if lowercase else []),
    ]
    capsys.readouterr()
    assert evaluate_main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "scores.json").read_text())
    expected = sacrebleu_scores(hypotheses, references, lowercase=lowercase)
    assert {name: printed[name] for name in expected} == pytest.approx(expected)
    case = "lc" if lowercase else "mixed"
    for name in ("bleu", "chrf", "ter"):
        assert printed[f"{name}_signature"].startswith(f"nrefs:1|case:{case}|")
    assert printed["sentences"] == 4 and "model" not in printed


# -- outputs never destroy inputs or files attn did not write (modeling_attn/api/outputs.py, issue 34) ----------------


def test_evaluate_never_writes_over_its_references(transformer_dir, tmp_path, capsys):
    references, sources = tmp_path / "refs.de", tmp_path / "src.en"
    references.write_text("ein Haus\n")
    sources.write_text("a house\n")
    argv = ["--model", str(transformer_dir), "--sources_file", str(sources), "--references_file", str(references)]
    line = error_line(evaluate_main, [*argv, "--output", str(references), "--overwrite"], capsys)
    assert (
        line == f"attn evaluate: error: --output {references} is --references_file {references}: "
        "writing it would destroy the input"
    )
    assert references.read_text() == "ein Haus\n"
    line = error_line(evaluate_main, [*argv, "--hypotheses", str(sources)], capsys)
    assert f"--hypotheses {sources} is --sources_file {sources}" in line
    notes = tmp_path / "notes.json"
    notes.write_text("the user's")
    assert "notes.json already exists; pass --overwrite" in error_line(
        evaluate_main, [*argv, "--output", str(notes)], capsys
    )
    assert notes.read_text() == "the user's"


def test_translate_never_writes_over_its_input_or_model(transformer_dir, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("a house\n")
    line = error_line(
        translate_main, ["--model", str(transformer_dir), "--input", str(source), "--output", str(source)], capsys
    )
    assert line.endswith(f"--output {source} is --input {source}: writing it would destroy the input")
    inside = transformer_dir / "out.txt"
    line = error_line(translate_main, ["--model", str(transformer_dir), "--output", str(inside), "x"], capsys)
    assert line.endswith(f"--output {inside} is inside --model {transformer_dir}: write it somewhere else")
    assert source.read_text() == "a house\n" and not inside.exists()
