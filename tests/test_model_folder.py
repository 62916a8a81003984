"""modeling_attn/api/model_folder.py: a model folder that cannot be used is named with the reason (issue 34, item 4),
on real folders: a path that does not exist, configs that are not JSON / of another architecture / with an invalid
field, weights of another model, weights with tensors missing, a generation config that is not JSON."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from huggingface_hub import constants
from runs import free_port
from safetensors.torch import load_file, save_file
from test_translate import save_tiny_model
from tiny import tiny_model
from transformers import BertConfig

from modeling_attn.api.model_folder import ModelFolderError, check_config, load_checked


@pytest.fixture
def saved(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    return model, tmp_path / "model"


def test_a_good_folder_loads_with_its_weights(saved):
    model, folder = saved
    loaded = load_checked(folder)
    ids = torch.tensor([[5, 6, 7, 2]])
    with torch.no_grad():  # the loaded model may pick another attention backend: equal to float rounding
        torch.testing.assert_close(
            loaded(input_ids=ids, labels=ids).logits, model.eval()(input_ids=ids, labels=ids).logits
        )


def test_a_missing_path_is_named_as_a_folder_not_a_repo_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFolderError, match=r"^\./missing_model: no such model folder$"):
        check_config("./missing_model")


def test_a_config_that_is_not_json_names_the_file_and_place(saved):
    _, folder = saved
    (folder / "config.json").write_text('{"model_type": "attn_transformer",\n  "d_model": }')
    with pytest.raises(ModelFolderError, match=r"config.json: the config is not valid JSON \(.* line 2, column"):
        check_config(folder)


def test_an_invalid_field_is_named_with_its_value(saved):
    _, folder = saved
    fields = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**fields, "num_heads": 3}))
    with pytest.raises(ModelFolderError) as error:
        check_config(folder)
    assert (
        str(error.value)
        == f"{folder}: invalid config.json: AttnTransformerConfig.d_model (16) must be divisible by num_heads (3)"
    )


def test_a_config_of_another_architecture_is_named(tmp_path):
    BertConfig(architectures=["BertModel"]).save_pretrained(tmp_path / "bert")
    with pytest.raises(ModelFolderError, match=r"a 'bert' model \(BertModel\), not a translation \(encoder-decoder\)"):
        check_config(tmp_path / "bert")


def test_weights_of_another_model_are_refused(saved):
    _, folder = saved
    save_file({"bert.embeddings.weight": torch.zeros(3, 4)}, folder / "model.safetensors")
    with pytest.raises(ModelFolderError, match="hold none of the model's tensors .* random weights"):
        load_checked(folder)


def test_missing_tensors_are_refused_unless_allowed(saved):
    _, folder = saved
    weights = load_file(folder / "model.safetensors")
    dropped = sorted(name for name in weights if name.endswith("fc2.bias"))
    save_file({name: tensor for name, tensor in weights.items() if name not in dropped}, folder / "model.safetensors")
    with pytest.raises(ModelFolderError, match=rf"lack {len(dropped)} of the model's tensors \({dropped[0]}"):
        load_checked(folder)
    assert load_checked(folder, allow_missing=True) is not None


def test_a_generation_config_that_is_not_json_is_named(saved):
    _, folder = saved
    (folder / "generation_config.json").write_text("{num_beams: 4}")
    with pytest.raises(ModelFolderError, match=r"generation_config.json: the generation config is not valid JSON"):
        check_config(folder)


@pytest.fixture
def closed_hub(monkeypatch):
    """A Hub endpoint nothing listens on (a free loopback port): no network, as a user's offline machine."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return endpoint


def test_a_name_that_could_be_a_hub_id_with_no_hub_names_both_readings(tmp_path, monkeypatch, closed_hub):
    monkeypatch.chdir(tmp_path)
    for name in ("run-a", "user/run-a"):
        with pytest.raises(ModelFolderError) as raised:
            check_config(name)
        assert str(raised.value) == (
            f"{name}: no such model folder here, and the Hub ({closed_hub}) could not be reached to look for the "
            f"repository {name} (ConnectError)"
        )
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelFolderError, match=r"^run-a: no such model folder here, and the Hub is switched off"):
        check_config("run-a")


def test_attn_translate_with_a_name_and_no_hub_is_one_line(tmp_path):
    """The README's ensemble line as a new user types it: a real `attn` process, no Hub reachable, no retries."""
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HUB_OFFLINE": "0"}
    done = subprocess.run(
        ["attn", "translate", "--model", "run-a", "--model", "run-b", "May 2, 2030"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"attn translate: error: run-a: no such model folder here, and the Hub ({env['HF_ENDPOINT']}) could not be "
        "reached to look for the repository run-a (ConnectError)\n"
    )


def test_attn_push_with_no_hub_is_one_line(tmp_path):
    """`attn push` on a machine with no network: the Hub's transport error named in one line, exit 2."""
    save_tiny_model(tmp_path / "model", "attn_transformer")
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_unused"}
    done = subprocess.run(
        ["attn", "push", "--model", str(tmp_path / "model"), "--repo-id", "me/dates"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"attn push: error: the Hub ({endpoint}) could not be reached: [Errno 111] Connection refused; check the "
        "network or HF_ENDPOINT"
    )
    assert "Traceback" not in done.stderr
