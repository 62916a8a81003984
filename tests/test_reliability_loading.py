"""Safe loading (issue 8, check 5), in fresh processes whose network is cut (every socket connect and DNS lookup
raises) and whose HF cache is an empty folder:

- importing `modeling_attn` (and `training`) downloads nothing, opens no connection, writes nothing to the cache;
- a saved model loads with the package installed without `trust_remote_code`; without the package it needs
  `trust_remote_code=True` (the code saved beside the weights), and says so when it is not given;
- pickle weights are refused before anything is unpickled: a `pytorch_model.bin` whose unpickling would run code
  does not run it; `use_safetensors=False` is the explicit opt-in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from isolation import _BLOCK_PACKAGE
from tiny import tiny_model
from transformers import AutoModelForSeq2SeqLM

NO_NETWORK = """
import socket
attempts = []
def _refuse(*args, **kwargs):
    attempts.append(repr(args)[:200])
    raise OSError("network access is blocked in this test")
socket.socket.connect = socket.socket.connect_ex = _refuse
socket.create_connection = socket.getaddrinfo = _refuse
"""


def run_offline(code: str, home: Path, without_package: bool = False) -> dict:
    """Run `code` (after NO_NETWORK) with an empty HF_HOME; it prints one JSON line, which is returned.

    `without_package` blocks `import modeling_attn` (tests/isolation.py), as for a user who never installed it.
    stdin is empty, so transformers' "run the custom code? [y/N]" prompt gets no answer.
    """
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    prefix = NO_NETWORK + (_BLOCK_PACKAGE if without_package else "")
    result = subprocess.run(
        [sys.executable, "-c", prefix + textwrap.dedent(code)],
        cwd=home.parent,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("saved")
    tiny_model("sdpa").save_pretrained(folder)
    return folder


def test_import_and_local_loading_download_nothing_and_need_no_trust_remote_code(saved, tmp_path):
    """One process: import the package (registration happens, nothing else), then load a saved folder with the
    Auto classes and no trust_remote_code; no connection is attempted, the empty HF cache stays empty."""
    home = tmp_path / "hf_home"
    home.mkdir()
    seen = run_offline(
        f"""
        import json, os, torch
        import modeling_attn, modeling_attn.training.train, modeling_attn.training.data
        from transformers import AutoModelForSeq2SeqLM
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        after_import = {{"attempts": list(attempts), "cache": os.listdir({str(home)!r}),
                        "registered": "attn_transformer" in CONFIG_MAPPING and "attn_rnn" in CONFIG_MAPPING}}
        model = AutoModelForSeq2SeqLM.from_pretrained({str(saved)!r})
        ids = torch.tensor([[5, 6, 7, 2]])
        logits = model(input_ids=ids, decoder_input_ids=ids).logits
        print(json.dumps({{"after_import": after_import, "attempts": attempts, "class": type(model).__module__,
                          "sum": logits.sum().item()}}))
        """,
        home,
    )
    assert seen["after_import"] == {"attempts": [], "cache": [], "registered": True}
    assert seen["attempts"] == [] and seen["class"].startswith("modeling_attn.")
    model = AutoModelForSeq2SeqLM.from_pretrained(saved)
    ids = torch.tensor([[5, 6, 7, 2]])
    with torch.no_grad():
        assert seen["sum"] == pytest.approx(model(input_ids=ids, decoder_input_ids=ids).logits.sum().item(), abs=1e-4)
    assert list(home.rglob("*")) == [], "importing or loading wrote to the HF cache"


def test_without_the_package_remote_code_needs_trust_remote_code(saved, tmp_path):
    (tmp_path / "hf_home").mkdir()
    seen = run_offline(
        f"""
        import json
        from transformers import AutoModelForSeq2SeqLM
        try:
            AutoModelForSeq2SeqLM.from_pretrained({str(saved)!r})
            refused = None
        except ValueError as error:
            refused = str(error)
        model = AutoModelForSeq2SeqLM.from_pretrained({str(saved)!r}, trust_remote_code=True)
        print()  # after the unanswered prompt
        print(json.dumps({{"refused": refused, "class": type(model).__module__, "attempts": attempts}}))
        """,
        tmp_path / "hf_home",
        without_package=True,
    )
    assert seen["refused"] is not None and "trust_remote_code=True" in seen["refused"]
    assert not seen["class"].startswith("modeling_attn")  # the code saved beside the weights
    assert seen["attempts"] == []


class _RunsCodeWhenUnpickled:
    """Unpickling this calls Path.touch on `marker`: what a malicious pytorch_model.bin could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickle_weights_are_refused_before_unpickling(saved, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((saved / "config.json").read_text())
    marker = tmp_path / "code-ran"
    torch.save({"model.shared.weight": _RunsCodeWhenUnpickled(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(OSError, match=r"pickled: no safetensors weights .*pytorch_model\.bin.*use_safetensors=False"):
        AutoModelForSeq2SeqLM.from_pretrained(folder)
    assert not marker.exists()


def test_pickle_weights_load_when_explicitly_allowed(saved, tmp_path):
    """The opt-in loads a trusted pickle checkpoint (transformers unpickles with torch's weights_only=True)."""
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((saved / "config.json").read_text())
    model = AutoModelForSeq2SeqLM.from_pretrained(saved)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    loaded = AutoModelForSeq2SeqLM.from_pretrained(folder, use_safetensors=False)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
