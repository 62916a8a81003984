"""A catalogue of bad inputs (issue 8, check 1): each gets an error of a stated type whose message names what is
wrong and where (config field, file and line, token id, tensor shape), never an index error deep inside.

Four layers, one table each: the model (tensors in, both model types), the command line (`attn translate`,
`attn evaluate`, `attn train`, `attn average` through `modeling_attn.cli.main.main`), the data loaders
(training/data.py) and loading (config.json, safetensors, tokenizer, model type).

Covered elsewhere, not repeated here (they count towards the catalogue, 64 cases): tests/test_inputs.py (token id
beyond the vocabulary, negative ids, labels beyond the vocabulary and all -100, float ids, masks of wrong shape,
decoder mask of wrong shape, mask values other than 0/1, empty batch, ids and embeddings both or neither, a sequence
longer than max_position_embeddings, wrong cache type: 16), tests/test_configuration_transformer.py (invalid config
values incl. d_model not divisible by num_heads, unknown activation, wrong type: 17), tests/test_modeling_rnn.py (12
bad tensors incl. left padding and an empty row; 11 invalid config values), tests/test_training_data.py (empty line,
mismatched line counts, non-UTF-8 bytes in a .gz, bad TSV and JSONL lines, missing split and missing file: 7),
tests/test_translate.py (missing evaluation split: 1). This file adds 63 (one an expected failure: a known gap).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from modeling_attn.training.averaging import load_weights
from modeling_attn.training.data import load_parallel_data
from modeling_attn.training.tokenizer import train_bpe_tokenizer
from modeling_attn.training.train import TrainingRun
from safetensors.torch import load_file, save_file
from tiny import TINY_RNN, padded_batch, tiny_config, tiny_model
from transformers import AutoModelForSeq2SeqLM

from modeling_attn import (
    AttnRNNConfig,
    AttnRNNForConditionalGeneration,
    AttnTransformerForConditionalGeneration,
)
from modeling_attn.api.corpus import DataError
from modeling_attn.cli.main import main as cli_main
from modeling_attn.cli.train import parse_args
from modeling_attn.loading import WeightsError

CORPUS = ["the cat sat on the mat", "a dog ran in the park", "1987-03-03", "the 4th of July 1776"] * 5
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)


def _copy(world: SimpleNamespace, name: str) -> Path:
    folder = world.root / name
    shutil.copytree(world.model, folder)
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> SimpleNamespace:
    """Saved tiny models of both types with their tokenizer, and damaged copies of them."""
    root = tmp_path_factory.mktemp("world")
    tokenizer = train_bpe_tokenizer(CORPUS, vocab_size=60, min_frequency=1)
    model = tiny_model("sdpa", vocab_size=len(tokenizer), max_position_embeddings=16, **SPECIAL)
    model.generation_config.update(max_new_tokens=4, num_beams=1)
    world = SimpleNamespace(root=root, model=root / "model", rnn=root / "rnn", tokenizer=tokenizer)
    model.save_pretrained(world.model)
    tokenizer.save_pretrained(world.model)
    torch.manual_seed(0)
    AttnRNNForConditionalGeneration(AttnRNNConfig(vocab_size=len(tokenizer), **TINY_RNN, **SPECIAL)).save_pretrained(
        world.rnn
    )
    weights = (world.model / "model.safetensors").read_bytes()
    (_copy(world, "truncated") / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    (_copy(world, "garbage") / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    (_copy(world, "no_config") / "config.json").unlink()
    big = train_bpe_tokenizer([*CORPUS, "Zebras quietly juggle vexing wombats, fjords kvetch"], 120, min_frequency=1)
    assert len(big) > len(tokenizer)
    big.save_pretrained(_copy(world, "big_tokenizer"))
    for name, edit in {
        "no_d_model": lambda config: config.pop("d_model"),
        "string_d_model": lambda config: config.update(d_model="16"),
        "bad_heads": lambda config: config.update(num_heads=3),
    }.items():
        config = json.loads((world.model / "config.json").read_text())
        edit(config)
        (_copy(world, name) / "config.json").write_text(json.dumps(config))
    (_copy(world, "bad_json") / "config.json").write_text('{"model_type": "attn_transformer",')
    state = load_file(world.model / "model.safetensors")
    state["model.encoder.layers.0.self_attn.q_proj.weight"] = torch.zeros(3, 3)
    save_file(state, _copy(world, "wrong_shape") / "model.safetensors", metadata={"format": "pt"})
    del state["model.encoder.layers.0.self_attn.q_proj.weight"]
    save_file(state, _copy(world, "missing_tensor") / "model.safetensors", metadata={"format": "pt"})
    pickled = root / "pickle_only"
    pickled.mkdir()
    shutil.copy(world.model / "config.json", pickled)
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    (root / "long.txt").write_text("the cat\n" + "the cat sat on the mat " * 4 + "\n")
    (root / "latin1.txt").write_bytes("the cat\nthe caf\xe9\n".encode("latin-1"))
    return world


# -- the model layer ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformer():
    return tiny_model("sdpa")


@pytest.fixture(scope="module")
def rnn():
    torch.manual_seed(0)
    return AttnRNNForConditionalGeneration(AttnRNNConfig(vocab_size=99, **TINY_RNN, **SPECIAL)).eval()


def _with(batch_edit):
    """A model call on the padded batch of tests/tiny.py after `batch_edit(ids, mask, decoder_ids)` -> kwargs."""

    def call(model):
        input_ids, attention_mask, decoder_input_ids = padded_batch()
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        return model(**{**kwargs, **batch_edit(input_ids, attention_mask, decoder_input_ids)})

    return call


MODEL_CASES = [
    # (model, call, error type, message pattern)
    (
        "transformer",
        _with(lambda i, m, d: dict(attention_mask=m * 2)),
        ValueError,
        r"attention_mask must hold 0 \(padding\) and 1 \(token\) only, got 2 at \(batch, position\) \(0, 0\)",
    ),
    (
        "rnn",
        _with(lambda i, m, d: dict(attention_mask=m * 2)),
        ValueError,
        r"attention_mask must hold 0 \(padding\) and 1 \(token\) only, got 2",
    ),
    (
        "transformer",
        _with(lambda i, m, d: dict(attention_mask=m * torch.tensor([[1], [0], [1]]))),
        ValueError,
        "attention_mask row 1 masks every token",
    ),
    (
        "transformer",
        _with(lambda i, m, d: dict(decoder_input_ids=d[:2])),
        ValueError,
        r"decoder input .* has batch size 2, but the encoder output .* has shape \(3, 7, 16\)",
    ),
    (
        "transformer",
        _with(lambda i, m, d: dict(decoder_input_ids=None, labels=d[:2])),
        ValueError,
        r"decoder input \(decoder_input_ids, labels or decoder_inputs_embeds\) has batch size 2",
    ),
    (
        "transformer",
        _with(lambda i, m, d: dict(labels=d[:, :3])),
        ValueError,
        r"labels have shape \(3, 3\) but the decoder produced logits for \(batch, length\) = \(3, 5\)",
    ),
    (
        "rnn",
        _with(lambda i, m, d: dict(labels=d[:, :3])),
        ValueError,
        r"labels have shape \(3, 3\) but the decoder produced logits for \(batch, length\) = \(3, 5\)",
    ),
    (
        "transformer",
        _with(lambda i, m, d: dict(input_ids=None, inputs_embeds=torch.zeros(3, 7, 8))),
        ValueError,
        r"inputs_embeds has width 8, but the model's embeddings have 16 \(shape \(3, 7, 8\)\)",
    ),
    (
        "rnn",
        _with(lambda i, m, d: dict(input_ids=None, inputs_embeds=torch.zeros(3, 7, 8))),
        ValueError,
        r"inputs_embeds has width 8, but the model's embeddings have 16",
    ),
    (
        "transformer",
        _with(lambda i, m, d: dict(input_ids=None, encoder_outputs=(torch.zeros(3, 7, 8),))),
        ValueError,
        r"encoder_outputs have width 8, expected d_model=16 \(shape \(3, 7, 8\)\)",
    ),
    (
        "transformer",
        _with(lambda i, m, d: dict(input_ids=i[0], attention_mask=None)),
        ValueError,
        r"input_ids must be a non-empty \(batch, length\) tensor, got shape \(7,\)",
    ),
    (
        "transformer",
        _with(lambda i, m, d: dict(input_ids=i.bool())),
        TypeError,
        "input_ids must hold integer token ids, got dtype torch.bool",
    ),
    (
        "rnn",
        _with(lambda i, m, d: dict(input_ids=i.float())),
        TypeError,
        "input_ids must hold integer token ids, got dtype torch.float32",
    ),
    (
        "transformer",
        lambda model: model.generate(torch.tensor([[5, 99, 2]]), max_new_tokens=2),
        IndexError,
        r"input_ids holds token id 99 at \(batch, position\) \(0, 1\); ids must be in \[0, 99\)",
    ),
    (
        "rnn",
        lambda model: model.generate(torch.tensor([[5, -1, 2]]), max_new_tokens=2),
        IndexError,
        r"input_ids holds token id -1 at \(batch, position\) \(0, 1\)",
    ),
]


@pytest.mark.parametrize(("which", "call", "error", "pattern"), MODEL_CASES)
def test_model_input(which, call, error, pattern, transformer, rnn):
    with pytest.raises(error, match=pattern):
        call(transformer if which == "transformer" else rnn)


def test_unknown_attention_backend():
    with pytest.raises(ValueError, match=r'attn_implementation="bogus"` is not supported.*"eager".*sdpa'):
        AutoModelForSeq2SeqLM.from_config(tiny_config(), attn_implementation="bogus")
    model = tiny_model()
    with pytest.raises(ValueError, match=r'attn_implementation="flash"` is not supported'):
        model.set_attn_implementation("flash")


def test_generating_past_the_position_table():
    """The decoder's positions run out during generate(): the error names the limit, not an index deep inside."""
    model = tiny_model("sdpa", max_position_embeddings=8)
    with pytest.raises(ValueError, match="sequence of 9 positions exceeds max_position_embeddings=8"):
        model.generate(torch.tensor([[5, 6, 2]]), max_new_tokens=20, min_new_tokens=20)


# -- the command line ----------------------------------------------------------------------------------------------


def run_cli(argv: list[str]) -> tuple[int, str]:
    """Exit status and stderr of `attn ...` (argparse errors exit through SystemExit)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = cli_main(argv)
        except SystemExit as exit_:
            status = exit_.code
    return status, stderr.getvalue()


LONG = "the cat sat on the mat " * 4  # more tokens than the world's models' 16 positions


def long_pair_folder(root: Path) -> Path:
    """Data whose validation split has a source sentence too long for the world's models as its third pair."""
    folder = root / "long_pair"
    folder.mkdir()
    (folder / "train.en").write_text("the cat\n")
    (folder / "train.de").write_text("die Katze\n")
    (folder / "valid.en").write_text(f"the cat\na dog\n{LONG}\n")
    (folder / "valid.de").write_text("die Katze\nein Hund\nx\n")
    return folder


def tsv_folder(root: Path, pairs: int = 20) -> Path:
    folder = root / "tsv"
    folder.mkdir(exist_ok=True)
    (folder / "train.tsv").write_text("".join(f"{s}\t{s}\n" for s in CORPUS[:pairs]))
    (folder / "valid.tsv").write_text("the cat\tthe cat\n")
    return folder


TRAIN = [
    "--preset",
    "tiny",
    "--vocab_size",
    "60",
    "--report_to",
    "none",
    "--eval_strategy",
    "no",
    "--do_predict",
    "False",
    "--max_steps",
    "1",
    "--disable_tqdm",
    "True",
]

CLI_CASES = [
    # (argv built from the world and a fresh folder, pattern in stderr); every one exits with status 2
    (lambda w, t: ["translate", "--model", str(t / "absent"), "x"], r"absent: no such model folder"),
    (lambda w, t: ["translate", "--model", str(w.root / "no_config"), "x"], r"no_config: no config\.json"),
    (
        lambda w, t: ["translate", "--model", str(w.model), "--input", str(t / "none.txt")],
        r"--input .*none\.txt: no such file; give a file of sentences",
    ),
    (
        lambda w, t: ["translate", "--model", str(w.model), "--input", str(w.root / "latin1.txt")],
        r"latin1\.txt:2: not valid UTF-8 \(byte 0xe9 at column 8\)",
    ),
    (
        lambda w, t: ["translate", "--model", str(w.model), "--input", str(w.root / "long.txt")],
        r"long\.txt:2: the sentence \('the cat sat on the mat the cat sat on th'\.\.\.\) has \d+ tokens, "
        r"more than the model's max_position_embeddings=16",
    ),
    (
        lambda w, t: ["translate", "--model", str(w.model), "--batch_size", "2", "a", "b", "c", LONG],
        r"argument 4: the sentence \('the cat sat on the mat the cat sat on th'\.\.\.\) has \d+ tokens",
    ),
    (
        lambda w, t: ["translate", "--model", str(w.model), "--max_new_tokens", "17", "x"],
        r"max_new_tokens=17 is more than the model's max_position_embeddings=16: the decoder has no position",
    ),
    (
        lambda w, t: [
            "evaluate",
            "--model",
            str(w.model),
            "--data",
            str(long_pair_folder(t)),
            "--source_lang",
            "en",
            "--target_lang",
            "de",
            "--split",
            "validation",
            "--batch_size",
            "2",
        ],
        r"the validation split of .*long_pair, pair 3: "
        r"the source sentence \('the cat sat on the mat the cat sat on th'",
    ),
    (
        lambda w, t: ["evaluate", "--model", str(w.model), "--max_samples", "0"],
        "argument --max_samples: must be a positive integer, got 0",
    ),
    (
        lambda w, t: ["average", str(t), "--last", "0", "--output_dir", str(t / "avg")],
        "argument --last: must be a positive integer, got 0",
    ),
    (
        lambda w, t: ["translate", "--model", str(w.model), "--batch_size", "0", "x"],
        "argument --batch_size: must be a positive integer, got 0",
    ),
    (
        lambda w, t: ["translate", "--model", str(w.model), "--num_beams", "0", "x"],
        "argument --num_beams: must be a positive integer, got 0",
    ),
    (
        lambda w, t: ["translate", "--model", str(w.model), "--max_new_tokens", "-3", "x"],
        "argument --max_new_tokens: must be a positive integer, got -3",
    ),
    (
        lambda w, t: ["translate", "--model", str(w.root / "big_tokenizer"), "x"],
        r"big_tokenizer: the tokenizer has \d+ tokens but the model's config.vocab_size is \d+",
    ),
    (
        lambda w, t: ["translate", "--model", str(w.root / "truncated"), "x"],
        r"truncated/model.safetensors: the safetensors weights are corrupt or truncated",
    ),
    (
        lambda w, t: ["evaluate", "--model", str(w.model), "--data", str(t / "absent")],
        r"absent: no such folder, and not a dataset datasets.load_dataset can open",
    ),
    (lambda w, t: ["evaluate", "--model", str(w.model), "--split", "dev"], r"argument --split: invalid choice: 'dev'"),
    (
        lambda w, t: ["train", "--data", str(tsv_folder(t) / "train.tsv"), "--output_dir", str(t / "out"), *TRAIN],
        r"train\.tsv is a file; --data takes a folder",
    ),
]


@pytest.mark.parametrize(("argv", "pattern"), CLI_CASES)
def test_command_line(argv, pattern, world, tmp_path):
    status, stderr = run_cli(argv(world, tmp_path))
    assert status == 2, stderr
    assert "Traceback" not in stderr
    assert re.search(rf"attn \w+: error: .*{pattern}", stderr), stderr


@pytest.mark.parametrize(
    ("stdin", "pattern"),
    [
        (b"the cat\nthe caf\xe9\n", r"stdin:2: not valid UTF-8 \(byte 0xe9 at column 8\)"),
        (f"a\n\n{LONG}\n".encode(), r"stdin:3: the sentence \('the cat sat on the mat the cat sat on th'"),
    ],
)
def test_stdin_errors_name_the_line(stdin, pattern, world, monkeypatch):
    """Lines on stdin are read as bytes and decoded like a file's: bad bytes and long sentences name stdin:LINE."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    status, stderr = run_cli(["translate", "--model", str(world.model), "--batch_size", "2"])
    assert status == 2 and "Traceback" not in stderr, stderr
    assert re.search(rf"attn translate: error: {pattern}", stderr), stderr


TRAIN_CASES = [
    # (extra argv, pattern of the error line): one line on stderr and exit status 2 (issue 25),
    # before any training step
    (["--preset", "tinyy"], r"--preset: unknown preset 'tinyy'; did you mean 'tiny'\?"),
    (["--config_overrides", "d_model=30"], r".*d_model \(30\) must be divisible by num_heads.*"),
    (
        ["--config_overrides", "decoder_layers=0"],
        r".*decoder_layers=0: zero decoder layers; a model needs at least .*",
    ),
    (
        ["--max_tokens_per_batch", "4"],
        r"--max_tokens_per_batch 4 cannot hold training pair \d+ \(\d+ source / \d+ target tokens\).*",
    ),
    (["--streaming", "--max_steps", "-1"], r"--streaming needs --max_steps: .*"),
    (["--model_name_or_path", "/no/such/model"], r".*/no/such/model.*"),
    (["--data", "my_data/"], r"--data my_data/: no such data folder"),  # a trailing /: a folder, not a Hub id
    (["--tokenizer_name_or_path", "./missing"], r"--tokenizer_name_or_path \./missing: no such tokenizer folder"),
    (["--resume_from_checkpoint", "last"], r"--resume_from_checkpoint: no checkpoint was written in .*; rerun .*"),
    (
        ["--max_train_samples", "0"],
        r"argument --max_train_samples: must be a positive integer, got 0 \(see attn train --help\)",
    ),
    (["--max_predict_samples", "-2"], r"argument --max_predict_samples: must be a positive integer, got -2.*"),
    (
        ["--streaming", "--max_steps", "2", "--streaming_buffer_pairs", "0"],
        r"argument --streaming_buffer_pairs: must be a positive integer, got 0.*",
    ),
    # the recipe sets these from the tokenizer (was a TypeError traceback: load_preset got vocab_size twice)
    (["--config_overrides", "vocab_size=300"], r"--config_overrides: \['vocab_size'\] are set from the tokenizer .*"),
]


FINE_TUNE_CASES = [
    # (extra argv after --model_name_or_path WORLD_MODEL, pattern of the ValueError, whether the flags alone refuse it)
    (
        ["--preset", "big"],
        r"--preset big builds a new model, --model_name_or_path fine-tunes .*model with its own",
        True,
    ),
    (
        ["--model_type", "attn_rnn"],
        r"--model_type is attn_rnn, but --model_name_or_path .*model is attn_transformer",
        False,
    ),
    (
        ["--config_overrides", "dropout=0.2,colour=1"],
        r"--config_overrides: \['colour'\] are not fields of the config",
        False,
    ),
]


@pytest.mark.parametrize(("extra", "pattern", "by_flags"), FINE_TUNE_CASES)
def test_fine_tuning_refuses_what_describes_a_new_model(extra, pattern, by_flags, world, tmp_path):
    """What the flags alone make impossible is refused by `validate` (in parse_args, before any work); what needs the
    fine-tuned model's config, when that config is loaded."""
    argv = [
        "--data",
        str(tsv_folder(tmp_path)),
        "--output_dir",
        str(tmp_path / "out"),
        *TRAIN[2:],
        "--model_name_or_path",
        str(world.model),
        *extra,
    ]
    if by_flags:
        with pytest.raises(ValueError, match=pattern):
            parse_args(argv)
        return
    training = TrainingRun(*parse_args(argv))
    training.tokenizer = world.tokenizer
    with pytest.raises(ValueError, match=pattern):
        training.build_model()


def fine_tuned(argv: list[str], world):
    """The model `TrainingRun.build_model` builds for `argv` with the tokenizer of `world`."""
    training = TrainingRun(*parse_args(argv))
    training.tokenizer = world.tokenizer
    training.build_model()
    return training.model


def test_fine_tuning_applies_config_overrides_to_the_loaded_model(world, tmp_path):
    argv = ["--data", str(tsv_folder(tmp_path)), "--output_dir", str(tmp_path / "out"), *TRAIN[2:]]
    model = fine_tuned([*argv, "--model_name_or_path", str(world.model), "--config_overrides", "dropout=0.25"], world)
    saved = AutoModelForSeq2SeqLM.from_pretrained(world.model)
    assert (model.config.dropout, saved.config.dropout) == (0.25, tiny_config().dropout)
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), saved.state_dict().values(), strict=True)
    )
    model = fine_tuned([*argv, "--model_name_or_path", str(world.model), "--model_type", "attn_transformer"], world)
    assert model.config.model_type == "attn_transformer"


@pytest.mark.parametrize(("extra", "pattern"), TRAIN_CASES)
def test_train_command(extra, pattern, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    argv = ["train", "--data", str(tsv_folder(tmp_path)), "--output_dir", str(tmp_path / "out"), *TRAIN, *extra]
    try:  # a value out of its declared range ends in the parser (SystemExit 2), a later error in run_command
        status = cli_main(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    # one error line, the last (progress bars of the data preparation may come before it), no traceback
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert "Traceback" not in err and len(errors) == 1, err
    assert re.fullmatch(f"attn train: error: {pattern}", err.splitlines()[-1]), err
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_average_command(world, tmp_path):
    """A folder that is not a checkpoint is a user error of `attn average`: one line naming the file, exit 2."""
    empty = tmp_path / "empty"
    empty.mkdir()
    status, stderr = run_cli(["average", str(empty), "--output_dir", str(tmp_path / "avg")])
    assert status == 2 and len(stderr.splitlines()) == 1, stderr
    assert re.search(r"attn average: error: .*empty: no model\*\.safetensors file", stderr), stderr
    status, stderr = run_cli(
        ["average", str(world.model), str(world.root / "truncated"), "--output_dir", str(tmp_path / "a")]
    )
    assert status == 2 and len(stderr.splitlines()) == 1, stderr
    assert re.search(r"attn average: error: .*truncated/model\.safetensors: corrupt or truncated safetensors", stderr)
    with pytest.raises(OSError, match=r"garbage/model\.safetensors: corrupt or truncated safetensors file"):
        load_weights(world.root / "garbage")


# -- the data loaders ----------------------------------------------------------------------------------------------


def files(root: Path, contents: dict[str, str | bytes]) -> str:
    folder = root / "data"
    folder.mkdir()
    for name, content in contents.items():
        data = content if isinstance(content, bytes) else content.encode()
        (folder / name).write_bytes(gzip.compress(data)[:-20] if name.endswith(".gz") else data)  # cut short
    return str(folder)


DATA_CASES = [
    # (files, (source_lang, target_lang), pattern of the DataError)
    ({}, None, r"data: no such folder, and not a dataset"),
    ({"train.en": "", "train.de": ""}, ("en", "de"), r"data/train\.en and .*data/train\.de are empty"),
    ({"train.tsv": ""}, None, r"data/train\.tsv: empty file"),
    (
        {"train.en.gz": "a cat\n" * 50, "train.de": "eine Katze\n"},
        ("en", "de"),
        r"data/train\.en\.gz: cannot be read: Compressed file ended",
    ),
    ({"train.en": "a cat\n"}, ("en", "de"), r"data: train\.de\[\.gz\] is missing"),
    (
        {"train.en": "a\n", "train.de": "b\n", "train.fr": "c\n"},
        None,
        r"data: found languages \['de', 'en', 'fr'\]; choose the pair with --source_lang and --target_lang",
    ),
    (
        {
            "train.en": "a\n",
            "train.de": "b\n",
            "test_a.en": "a\n",
            "test_a.de": "b\n",
            "test_b.en": "a\n",
            "test_b.de": "b\n",
        },
        ("en", "de"),
        r"data: several test sets \['test_a', 'test_b'\]",
    ),
    (
        {"train.en": "a cat\n \t \n", "train.de": "eine Katze\nein Hund\n"},
        ("en", "de"),
        r"data/train\.en:2 / .*data/train\.de:2: empty source sentence",
    ),
    ({"train.tsv": "a cat\teine Katze\na dog\t\n"}, None, r"data/train\.tsv:2: empty target sentence"),
    (
        {"train.jsonl": '{"en": "a", "de": "b"}\n["a", "b"]\n'},
        ("en", "de"),
        r"data/train\.jsonl:2: expected an object with string fields 'en' and 'de'",
    ),
    ({"train.jsonl": '{"en": "a", "de": "b"}\n\n'}, ("en", "de"), r"data/train\.jsonl:2: empty line"),
    ({"train.jsonl": '{"en": "a", "de": "b"}\n'}, None, r"data: JSONL data needs --source_lang and --target_lang"),
    (
        {"train.en": "a cat\n", "train.de": "eine Katze\nein Hund\n"},
        ("en", "de"),
        r"data/train\.de:2: line has no counterpart: train\.en has 1 lines but train\.de has 2",
    ),
]


@pytest.mark.parametrize(("contents", "langs", "pattern"), DATA_CASES)
def test_data(contents, langs, pattern, tmp_path):
    folder = files(tmp_path, contents) if contents else str(tmp_path / "data")
    with pytest.raises(DataError, match=pattern):
        load_parallel_data(folder, *(langs or (None, None)))


def test_data_file_instead_of_folder(tmp_path):
    folder = tsv_folder(tmp_path)
    with pytest.raises(DataError, match=r"tsv/train\.tsv is a file; --data takes a folder"):
        load_parallel_data(str(folder / "train.tsv"))


def test_byte_order_mark_is_dropped_not_kept_in_the_first_sentence(tmp_path):
    """Documented behaviour, not an error: Windows editors start UTF-8 files with U+FEFF."""
    folder = files(tmp_path, {"train.en": "\ufeffa cat\na dog\n", "train.de": "\ufeffeine Katze\nein Hund\n"})
    train = load_parallel_data(folder, "en", "de").splits["train"]
    assert train[0] == {"source": "a cat", "target": "eine Katze"}


# -- loading checkpoints -------------------------------------------------------------------------------------------


def test_checkpoint_of_the_other_model_type(world):
    with pytest.raises(ValueError, match=r"model: config.json has model_type 'attn_transformer', but AttnRNNConfig"):
        AttnRNNForConditionalGeneration.from_pretrained(world.model)
    with pytest.raises(ValueError, match=r"rnn: config.json has model_type 'attn_rnn', but AttnTransformerConfig"):
        AttnTransformerForConditionalGeneration.from_pretrained(world.rnn)


@pytest.mark.parametrize(
    ("folder", "error", "pattern"),
    [
        (
            "string_d_model",
            StrictDataclassError,
            r"AttnTransformerConfig\.d_model must be a positive integer, got '16'",
        ),
        (
            "bad_heads",
            StrictDataclassError,
            r"AttnTransformerConfig\.d_model \(16\) must be divisible by num_heads \(3\)",
        ),
        ("bad_json", OSError, r"config file at '.*bad_json/config\.json' is not a valid JSON file"),
        ("no_config", ValueError, r"Unrecognized model in .*no_config\. Should have a `model_type` key"),
        ("pickle_only", OSError, r"pickle_only: no safetensors weights .*pytorch_model\.bin.*use_safetensors=False"),
    ],
)
def test_loading(folder, error, pattern, world):
    with pytest.raises(error, match=pattern):
        AutoModelForSeq2SeqLM.from_pretrained(world.root / folder)


@pytest.mark.parametrize(
    ("folder", "report"),
    [
        # config.json lacks d_model: the default (512) does not fit the 16-wide weights
        (
            "no_d_model",
            r"model\.shared\.weight .*MISMATCH.*ckpt: torch\.Size\(\[\d+, 16\]\) vs model:torch\.Size\(\[\d+, 512\]\)",
        ),
        (
            "wrong_shape",
            r"q_proj\.weight .*MISMATCH.*ckpt: torch\.Size\(\[3, 3\]\) vs model:torch\.Size\(\[16, 16\]\)",
        ),
    ],
)
def test_weights_that_do_not_fit_the_config(folder, report, world, caplog):
    """Our classes raise WeightsError naming the file, a tensor and both shapes; transformers' load report (logged
    just before) names each one."""
    with pytest.raises(WeightsError, match=rf"{folder}/model\.safetensors: the weights do not fit config\.json \("):
        AutoModelForSeq2SeqLM.from_pretrained(world.root / folder)
    assert re.search(report, caplog.text)


def test_a_tensor_missing_from_the_checkpoint_is_named_by_the_load_report(world, caplog):
    """As for transformers' built-in models, a missing weight is initialised, and the load report names it."""
    model = AutoModelForSeq2SeqLM.from_pretrained(world.root / "missing_tensor")
    assert model.config.model_type == "attn_transformer"
    assert re.search(r"q_proj\.weight\s*\|\s*MISSING", caplog.text)
