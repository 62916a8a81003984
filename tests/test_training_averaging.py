"""Tests of training/averaging.py and `attn average`: the averaged weights are the element-wise mean."""

from __future__ import annotations

import shutil

import pytest
import torch
from modeling_attn.training.averaging import average_checkpoints, find_checkpoints
from modeling_attn.training.synthetic import generate_pairs
from modeling_attn.training.tokenizer import train_bpe_tokenizer
from transformers import AutoModelForSeq2SeqLM

import modeling_attn  # noqa: F401
from modeling_attn.api.presets import load_preset
from modeling_attn.cli.main import main as attn


def save_checkpoints(folder, count: int) -> list:
    paths = []
    for step in range(1, count + 1):
        torch.manual_seed(step)
        model = AutoModelForSeq2SeqLM.from_config(load_preset("tiny"))
        paths.append(folder / f"checkpoint-{step * 10}")
        model.save_pretrained(paths[-1])
    return paths


def test_average_is_the_mean(tmp_path):
    paths = save_checkpoints(tmp_path, 3)
    average_checkpoints(paths, tmp_path / "averaged")
    models = [AutoModelForSeq2SeqLM.from_pretrained(p) for p in paths]
    averaged = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "averaged")
    for name, tensor in averaged.state_dict().items():
        expected = sum(m.state_dict()[name].double() for m in models) / 3
        torch.testing.assert_close(tensor, expected.to(tensor.dtype))
    assert averaged.lm_head.weight is averaged.model.shared.weight  # still tied after averaging


def test_attn_average_takes_the_last_checkpoints_of_a_training_folder(tmp_path):
    paths = save_checkpoints(tmp_path, 3)
    (tmp_path / "checkpoint-x").mkdir()  # not a checkpoint-<step> folder: ignored
    assert find_checkpoints(tmp_path) == paths
    assert attn(["average", str(tmp_path), "--last", "2", "--output_dir", str(tmp_path / "avg")]) == 0
    expected = average_checkpoints(paths[1:], tmp_path / "expected")
    got = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg").state_dict()
    for name, tensor in AutoModelForSeq2SeqLM.from_pretrained(expected).state_dict().items():
        assert torch.equal(got[name], tensor)


def test_rnn_with_shared_embeddings_averages(tmp_path):
    """The RNN's source and target embeddings are one module under three names, saved once as model.shared.weight."""
    config = load_preset("rnn-tiny", share_encoder_decoder_embeddings=True)
    models = []
    for step in (1, 2):
        torch.manual_seed(step)
        models.append(AutoModelForSeq2SeqLM.from_config(config))
        models[-1].save_pretrained(tmp_path / f"checkpoint-{step}")
    average_checkpoints([tmp_path / "checkpoint-1", tmp_path / "checkpoint-2"], tmp_path / "averaged")
    averaged = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "averaged")
    name = "model.shared.weight"
    expected = (models[0].state_dict()[name] + models[1].state_dict()[name]) / 2
    torch.testing.assert_close(averaged.state_dict()[name], expected)
    assert averaged.model.encoder.embed_tokens.weight is averaged.model.decoder.embed_tokens.weight


def test_checkpoints_of_different_configs_are_refused_naming_the_field(tmp_path, capsys):
    """A checkpoint of another model (here: another dropout) is not averaged in; the error names the field."""
    paths = save_checkpoints(tmp_path, 2)
    AutoModelForSeq2SeqLM.from_config(load_preset("tiny", dropout=0.3)).save_pretrained(tmp_path / "checkpoint-30")
    with pytest.raises(
        ValueError,
        match=r"cannot average .*checkpoint-10 with .*checkpoint-30: config\.json field "
        r"'dropout' is 0\.1 in checkpoint-10, 0\.3 in checkpoint-30",
    ):
        average_checkpoints([*paths, tmp_path / "checkpoint-30"], tmp_path / "averaged")
    assert not (tmp_path / "averaged").exists()
    # `attn average` of the folder's last two: one line naming the field, exit status 2
    capsys.readouterr()  # the progress bars of the saves above
    status = attn(["average", str(tmp_path), "--last", "2", "--output_dir", str(tmp_path / "avg")])
    error = capsys.readouterr().err
    assert status == 2 and len(error.splitlines()) == 1 and "config.json field 'dropout'" in error
    assert not (tmp_path / "avg").exists()


def test_checkpoints_of_two_model_types_with_one_name_are_refused_naming_the_type_and_the_paths(tmp_path):
    """A Transformer's and an RNN's checkpoint-20 (two runs): the model type is named first, with whole paths."""
    transformer, rnn = tmp_path / "transformer" / "checkpoint-20", tmp_path / "rnn" / "checkpoint-20"
    AutoModelForSeq2SeqLM.from_config(load_preset("tiny")).save_pretrained(transformer)
    AutoModelForSeq2SeqLM.from_config(load_preset("rnn-tiny")).save_pretrained(rnn)
    with pytest.raises(ValueError) as refused:
        average_checkpoints([transformer, rnn], tmp_path / "averaged")
    assert str(refused.value) == (
        f"cannot average {transformer} with {rnn}: config.json field 'model_type' is 'attn_transformer' in "
        f"{transformer}, 'attn_rnn' in {rnn} (checkpoints of different runs or models)"
    )
    assert not (tmp_path / "averaged").exists()


def test_checkpoints_with_different_tokenizers_are_refused_naming_the_file(tmp_path):
    """Same config, another vocabulary (a tokenizer retrained by a later run): refused, naming the tokenizer file."""
    paths = save_checkpoints(tmp_path, 2)
    for path, seed in zip(paths, (1, 2), strict=True):
        texts = [text for pair in generate_pairs(200, seed=seed) for text in pair]
        train_bpe_tokenizer(texts, vocab_size=99).save_pretrained(path)
    with pytest.raises(
        ValueError, match=r"checkpoint-10 with .*checkpoint-20: tokenizer file tokenizer\.json differs"
    ):
        average_checkpoints(paths, tmp_path / "averaged")
    (paths[0] / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"tokenizer file tokenizer\.json is only in checkpoint-20"):
        average_checkpoints(paths, tmp_path / "averaged")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the same tokenizer in both: averaged
        shutil.copy(paths[1] / name, paths[0] / name)
    average_checkpoints(paths, tmp_path / "averaged")
    assert (tmp_path / "averaged" / "tokenizer.json").read_bytes() == (paths[1] / "tokenizer.json").read_bytes()
