"""Checkpoint averaging (the paper, Sec. 6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which were written at
10-minute intervals. For the big models, we averaged the last 20". Floating-point weights are averaged element-wise
(in float64, then cast back); other tensors are taken from the newest checkpoint. The result is saved with the
newest checkpoint's config, generation config and tokenizer. Checkpoints that differ in config or tokenizer (another
run's, or another vocabulary's) are refused, naming the first difference: averaging them would give weights that fit
neither.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

from modeling_attn.api.ensemble import find_checkpoints  # noqa: F401  (the recipe's name for it)
from modeling_attn.api.errors import UserError
from modeling_attn.loading import WeightsError

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "source.spm",
    "target.spm",
    "sentencepiece.bpe.model",
)

# config.json fields that differ between checkpoints of one model without changing it
# label_smoothing: a training setting the configs of checkpoints written before it left the config still hold
_VOLATILE_CONFIG_FIELDS = ("transformers_version", "_name_or_path", "label_smoothing")


class AveragingError(UserError, ValueError):
    """Checkpoints that cannot be averaged (unreadable, of different models); the message names the file."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AveragingError(f"{path}: cannot read it as JSON ({error})") from error


def first_difference(checkpoint: str | Path, reference: str | Path) -> str | None:
    """What first differs between two checkpoints' config.json and tokenizer files (None if nothing does)."""
    checkpoint, reference = Path(checkpoint), Path(reference)
    for folder in (checkpoint, reference):
        if not (folder / "config.json").is_file():
            raise AveragingError(f"{folder}: no config.json; not a saved model")
    config, expected = _read_json(checkpoint / "config.json"), _read_json(reference / "config.json")
    # folder names, or whole paths where two runs both have a checkpoint-20
    ours, theirs = (checkpoint.name, reference.name) if checkpoint.name != reference.name else (checkpoint, reference)
    for key in sorted(set(config) | set(expected), key=lambda key: (key != "model_type", key)):  # the type first
        if key not in _VOLATILE_CONFIG_FIELDS and config.get(key, "<absent>") != expected.get(key, "<absent>"):
            return (
                f"config.json field {key!r} is {config.get(key, '<absent>')!r} in {ours}, "
                f"{expected.get(key, '<absent>')!r} in {theirs}"
            )
    for name in _TOKENIZER_FILES:
        here, there = (checkpoint / name).is_file(), (reference / name).is_file()
        if here != there:
            return f"tokenizer file {name} is only in {ours if here else theirs}"
        if here and (checkpoint / name).read_bytes() != (reference / name).read_bytes():
            return f"tokenizer file {name} differs between {ours} and {theirs}"
    return None


def check_same_model(checkpoints: list[str | Path]) -> None:
    """Refuse checkpoints that differ from the newest in config or tokenizer, naming the first difference."""
    for checkpoint in checkpoints[:-1]:
        if difference := first_difference(checkpoint, checkpoints[-1]):
            raise AveragingError(
                f"cannot average {checkpoint} with {checkpoints[-1]}: {difference} (checkpoints of different runs "
                "or models)"
            )


def load_weights(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint's safetensors file(s)."""
    files = sorted(Path(checkpoint).glob("model*.safetensors"))
    if not files:
        raise WeightsError(f"{checkpoint}: no model*.safetensors file")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(file))
        except SafetensorError as error:  # its own message names no file
            raise WeightsError(f"{file}: corrupt or truncated safetensors file ({error})") from error
    return weights


def average_checkpoints(checkpoints: list[str | Path], output_dir: str | Path) -> Path:
    """Average the weights of `checkpoints` (same config and tokenizer) and save the averaged model to `output_dir`."""
    if not checkpoints:
        raise AveragingError("no checkpoint to average")
    check_same_model(checkpoints)
    states = [load_weights(c) for c in checkpoints]
    keys = set(states[-1])
    for checkpoint, state in zip(checkpoints, states, strict=True):
        if set(state) != keys:
            raise AveragingError(f"{checkpoint} holds different tensors than {checkpoints[-1]}; cannot average them")
    averaged = {}
    for key, newest in states[-1].items():
        if newest.is_floating_point():
            total = sum(state[key].to(torch.float64) for state in states)
            averaged[key] = (total / len(states)).to(newest.dtype)
        else:
            averaged[key] = newest
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoints[-1])
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    # Saved files hold each shared tensor once (tied weights, or the RNN's source/target embeddings, one module
    # under three names): a missing name that is the same tensor as a loaded one was loaded.
    tensors = model.state_dict(keep_vars=True)
    loaded = {tensors[key].data_ptr() for key in averaged if key in tensors}
    missing = [key for key in missing if tensors[key].data_ptr() not in loaded]
    if unexpected or missing:
        raise AveragingError(f"averaged weights do not fit the model: missing {missing}, unexpected {unexpected}")
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    for name in _TOKENIZER_FILES:
        if (Path(checkpoints[-1]) / name).is_file() and Path(checkpoints[-1]).resolve() != output_dir.resolve():
            shutil.copy(Path(checkpoints[-1]) / name, output_dir / name)
    logger.info(
        f"averaged {len(checkpoints)} checkpoints ({', '.join(Path(c).name for c in checkpoints)}) into {output_dir}"
    )
    return output_dir
