"""The model code on every supported transformers release (modeling_attn/compat.py), with and without the package.

Runs in the quick suite on the installed (newest) transformers; CI also runs it in a second environment with the
oldest supported release (.ci/run), where ATTN_COMPAT_FOLDERS names folders `attn train` wrote with the newest one.
Folders of both model types, written by `attn train` here (and those of ATTN_COMPAT_FOLDERS), are loaded with
`trust_remote_code=True` in a process where `modeling_attn` cannot be imported: greedy and beam generate, the
translation pipeline and one Trainer step must equal what the package computes here; the tokenizer is transformers'
own and loads with no question and no warning. With the package, `attn translate` gives the same translations.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from isolation import run_isolated
from tiny import padded_batch, spread_tiny_rnn
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

import modeling_attn
from modeling_attn.cli.main import main as attn
from modeling_attn.compat import CACHE_FIELD

SENTENCES = ["the 4th of March 1987", "1 May 2001", "June 30, 1999"]
TRAIN = dict(
    max_train_samples=64,
    max_eval_samples=8,
    max_predict_samples=8,
    vocab_size=120,
    max_tokens_per_batch=200,
    report_to="none",
    disable_tqdm=True,
    eval_strategy="no",
    do_predict=False,
    average_last_n=1,
    max_steps=2,
    dataloader_pin_memory=False,
)

# What the process without the package computes (modeling_attn blocked, tests/isolation.py): it prints one JSON line.
REMOTE = """
import json, logging, sys, torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
import compat_steps

warnings = []
class Record(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("transformers").addHandler(Record())
folder, sentences = sys.argv[1], json.loads(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
translator = pipeline("translation", model=folder, trust_remote_code=True)
print(json.dumps({
    "tokenizer": type(tokenizer).__module__,
    "model": type(model).__module__,
    "pipeline": type(translator).__module__,
    "generated": compat_steps.generated(model, tokenizer, sentences),
    "translations": [result["translation_text"] for result in translator(sentences)],
    "train_loss": compat_steps.trainer_step(model, tokenizer, sentences, folder + "-remote-trainer"),
    "warnings": warnings,
}))
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """`attn train` folders of both model types written here, and those ATTN_COMPAT_FOLDERS names (path-separated)."""
    root = tmp_path_factory.mktemp("compat")
    found = {}
    for model_type, preset in (("attn_transformer", "tiny"), ("attn_rnn", "rnn-tiny")):
        output_dir = root / model_type
        flags = [part for flag, value in TRAIN.items() for part in (f"--{flag}", str(value))]
        flags += ["--output_dir", str(output_dir), "--model_type", model_type, "--preset", preset]
        assert attn(["train", *flags]) == 0
        found[f"{model_type}-here"] = output_dir
    for folder in filter(None, os.environ.get("ATTN_COMPAT_FOLDERS", "").split(os.pathsep)):
        found[f"{Path(folder).name}-given"] = Path(folder)
    return found


@pytest.fixture(scope="module")
def remote(folders, tmp_path_factory) -> dict[str, dict]:
    """What the process without the package computed for each folder."""
    cwd = tmp_path_factory.mktemp("remote")
    (cwd / "compat_steps.py").write_text((Path(__file__).parent / "compat_steps.py").read_text())
    results = {}
    for name, folder in folders.items():
        code = REMOTE.replace("sys.argv[1]", repr(str(folder))).replace("sys.argv[2]", repr(json.dumps(SENTENCES)))
        results[name] = run_isolated(code, cwd, env={"PYTHONPATH": str(cwd)})
    return results


def test_remote_code_equals_the_package(folders, remote, tmp_path):
    """Greedy and beam generate, the translation pipeline and a Trainer step from the folder's own code equal the
    package's; the tokenizer is transformers' own class, and nothing asks or warns about the model type."""
    from compat_steps import generated, trainer_step

    for name, folder in folders.items():
        result = remote[name]
        model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
        assert result["model"].startswith("transformers_modules.")  # the folder's code, not the package's
        assert result["pipeline"].startswith("transformers_modules.")
        assert result["tokenizer"].startswith("transformers.")  # no code from the folder for the tokenizer
        assert result["generated"] == generated(model, tokenizer, SENTENCES)
        assert result["translations"] == result["generated"]["saved_settings"]
        assert result["train_loss"] == pytest.approx(trainer_step(model, tokenizer, SENTENCES, tmp_path / name))
        unexpected = [message for message in result["warnings"] if re.search("instantiate a model of type", message)]
        assert unexpected == []


# The tokenizer alone, without the package and with stdin closed: what it printed and logged while loading, the
# folder's own modules imported (transformers_modules.*), its class and ids; then AutoTokenizer with no
# trust_remote_code, the question it asks (transformers 5 reads config.json, the model's code, before the tokenizer's).
TOKENIZER_ALONE = """
import contextlib, io, json, logging, os, sys
from transformers import AutoTokenizer, PreTrainedTokenizerFast

warnings = []
class Record(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("transformers").addHandler(Record())
sys.stdin = open(os.devnull)
folder, sentences = sys.argv[1], json.loads(sys.argv[2])
printed = io.StringIO()
with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
alone = {
    "printed": printed.getvalue(),
    "warnings": list(warnings),
    "folder_code": sorted(name for name in sys.modules if name.startswith("transformers_modules")),
    "tokenizer": type(tokenizer).__module__,
    "ids": tokenizer(sentences)["input_ids"],
}
with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
    AutoTokenizer.from_pretrained(folder)
print(json.dumps({"alone": alone, "auto": printed.getvalue()[len(alone["printed"]):], "auto_warnings": warnings}))
"""


def test_the_tokenizer_loads_without_the_package_and_with_no_code_of_the_models(folders, tmp_path):
    """As docs/hub.md gives it: transformers' own class reads the tokenizer files, with no question, no warning and no
    code from the folder, and tokenizes as the package's tokenizer does. (AutoTokenizer without trust_remote_code
    asks to run the folder's code, whatever the folder holds: docs/hub.md says so.)"""
    documented = (Path(__file__).parent.parent / "docs" / "hub.md").read_text(encoding="utf-8")
    assert 'PreTrainedTokenizerFast.from_pretrained("you/dates-iso")' in documented
    for name, folder in folders.items():
        code = TOKENIZER_ALONE.replace("sys.argv[1]", repr(str(folder)))
        result = run_isolated(code.replace("sys.argv[2]", repr(json.dumps(SENTENCES))), tmp_path)
        alone = result["alone"]
        assert (alone["printed"], alone["warnings"], alone["folder_code"]) == ("", [], []), name
        assert alone["tokenizer"].startswith("transformers.")
        assert alone["ids"] == AutoTokenizer.from_pretrained(folder)(SENTENCES)["input_ids"]
        assert "Do you wish to run the custom code?" in result["auto"]
        assert any("instantiate a model of type" in message for message in result["auto_warnings"])


def test_attn_translate_and_the_pipeline_with_the_package(folders, remote, tmp_path, capsys):
    for name, folder in folders.items():
        (tmp_path / "input.txt").write_text("\n".join(SENTENCES) + "\n")
        capsys.readouterr()
        # the package's own torch code against the folder's (with the default engine a barely trained model's beams
        # that reach the length limit may end otherwise: docs/export.md, "Engines")
        argv = ["translate", "--model", str(folder), "--input", str(tmp_path / "input.txt"), "--engine", "torch"]
        assert attn(argv) == 0
        assert capsys.readouterr().out.splitlines() == remote[name]["translations"]
        translator = pipeline("translation", model=str(folder), trust_remote_code=True)
        assert [result["translation_text"] for result in translator(SENTENCES)] == remote[name]["translations"]


def test_torch_export_of_the_rnn_with_default_arguments():
    """attn_rnn returns its AttnRNNCache (use_cache defaults to True): registered as a pytree node, it exports, and the
    exported program computes what the model computes."""
    model = spread_tiny_rnn()
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    with torch.no_grad():
        program = torch.export.export(model, (), inputs)
        exported, eager = program.module()(**inputs), model(**inputs)
    torch.testing.assert_close(exported.logits, eager.logits, rtol=1e-5, atol=1e-5)  # float32 rounding of its kernels
    exported_cache, eager_cache = getattr(exported, CACHE_FIELD), getattr(eager, CACHE_FIELD)
    assert type(exported_cache) is type(eager_cache) and exported_cache.steps == eager_cache.steps == 5
    for name in ("keys", "hidden"):
        torch.testing.assert_close(getattr(exported_cache, name), getattr(eager_cache, name), rtol=1e-5, atol=1e-5)


def test_each_model_file_imports_every_file_it_needs():
    """transformers 5.4-5.10 copy out of a local folder only the files that the loaded module itself imports: each
    file transformers loads by name (auto_map, custom_pipelines) imports all the package files it needs directly."""
    package = Path(modeling_attn.__file__).parent

    def imported(name: str) -> set[str]:
        return set(re.findall(r"^\s*from\s+\.(\w+)\s+import", (package / f"{name}.py").read_text(), re.MULTILINE))

    entries = ("configuration_rnn", "configuration_transformer", "modeling_rnn", "modeling_transformer")
    for entry in (*entries, "pipeline_translation"):
        direct, needed, todo = imported(entry), set(), [entry]
        while todo:
            for name in imported(todo.pop()) - needed:
                needed.add(name)
                todo.append(name)
        assert needed - {entry} <= direct, f"{entry}.py must import {sorted(needed - {entry} - direct)} itself"


# What asks which transformers is installed: a dataclass field probed, a version compared or parsed, a signature probe.
VERSION_PROBE = re.compile(
    r"__dataclass_fields__|\bversion\.parse\(|packaging\.version|__version__\s*(<|>|==|!=)|"
    r"in\s+inspect\.signature\([^)]*\)\.parameters\s+else"
)


def version_probes(source: str) -> list[int]:
    """The numbers of the lines of `source` that ask which release of a library is installed."""
    return [number for number, line in enumerate(source.splitlines(), 1) if VERSION_PROBE.search(line)]


def test_a_planted_version_probe_is_found():
    planted = [
        'FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"',
        'names = ["cache" if "cache" in inspect.signature(m.forward).parameters else "past_key_values" for m in ms]',
        "if transformers.__version__ >= '5.24': pass",
        "if version.parse(transformers.__version__).minor > 23: pass",
    ]
    assert version_probes("\n".join(["x = 1", *planted, "y = 2"])) == [2, 3, 4, 5]


def test_no_module_but_compat_asks_which_release_is_installed():
    """compat.py's docstring promises it: each difference between releases is met there, once."""
    root = Path(modeling_attn.__file__).parent.parent
    found = [
        f"{path.relative_to(root)}:{line}"
        for folder in ("modeling_attn", "training")
        for path in sorted((root / folder).rglob("*.py"))
        if path.name != "compat.py"
        for line in version_probes(path.read_text(encoding="utf-8"))
    ]
    assert found == [], f"version checks outside modeling_attn/compat.py: {found}"
