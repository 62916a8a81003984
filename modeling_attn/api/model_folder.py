"""A model folder that cannot be used is named, with the reason, in one exception (`ModelFolderError`).

transformers' own answers to a broken folder are correct but scattered: a path that does not exist is reported as an
invalid Hub repository id, a config of another architecture as "Unrecognized configuration class ... for this kind of
AutoModel" followed by the list of all classes, an invalid config field as a `StrictDataclassClassValidationError`
dump, a weights file that holds none of the model's tensors as a logged table (the model then runs with random
weights), and a `generation_config.json` that is not JSON is replaced by the defaults without a word. Here:

- `check_config(path)`: the folder exists (`check_folder`: else the nearest folder beside it is named), its
  config.json is JSON, of a translation (seq2seq) model type, with valid fields (the field and its value named); its
  generation_config.json, if any, is JSON;
- `load_checked(path, ...)`: `AutoModelForSeq2SeqLM.from_pretrained` with the load report checked: weights that match
  none of the model's tensors are refused; some missing are refused unless `allow_missing` (their names shown).

Hub ids (`user/name`) go through the same checks once transformers has fetched the files; a name that is no folder
here and whose Hub repository cannot be looked up (`check_hub_reachable`) is named with both readings at once.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from huggingface_hub import constants, get_session, try_to_load_from_cache
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForSeq2SeqLM, PretrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING

from .errors import UserError


class ModelFolderError(UserError, OSError):
    """A model folder (or Hub repository) that cannot be used; the message names it and the reason."""


def looks_local(name: str) -> bool:
    """Whether `name` can only be a local path (a Hub repo id is `name` or `namespace/name`), or is one in all
    likelihood: `outputs/datse` where the folder `outputs` exists here (a mistyped run folder, not a Hub id to spend
    half a minute of retries on)."""
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).is_absolute():
        return True
    return "/" in name and Path(name).parent.is_dir()


def no_such_folder(name: str, what: str = "model folder") -> str:
    """`name: no such model folder` (or `what`), with the nearest folder beside it when one is near."""
    path = Path(name).expanduser()
    parent = path.parent if path.parent.is_dir() else None
    siblings = sorted(entry.name for entry in parent.iterdir() if entry.is_dir()) if parent else []
    near = difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.6)
    return f"{name}: no such {what}" + (f"; did you mean {Path(name).parent / near[0]}?" if near else "")


def read_json(path: str | Path, what: str, error_class: type[Exception] = ModelFolderError) -> Any:
    """The JSON value in `path`; `error_class` naming the file and `what` it should be when it is not UTF-8 text or
    not valid JSON (line and column)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise error_class(f"{path}: the {what} is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise error_class(
            f"{path}: the {what} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
        ) from None


def check_folder(name: str | Path) -> Path:
    """The local folder `name`, or ModelFolderError: no such model folder (with the nearest one beside it), or a
    file; the one message of that mistake for every command, whatever the folder is for."""
    folder = Path(name).expanduser()
    if not folder.exists():
        raise ModelFolderError(no_such_folder(str(name)))
    if not folder.is_dir():
        raise ModelFolderError(f"{name}: a file, not a model folder (the folder save_pretrained or attn train wrote)")
    return folder


# How long the Hub may take to answer whether it is there, before a name that is no folder here is refused.
HUB_PROBE_SECONDS = 5.0


def check_hub_reachable(name: str, what: str = "model folder") -> None:
    """`name`, no folder here, read as a Hub repository id: nothing if its config is in the Hub cache or the Hub
    answers (whatever it says: transformers reports a missing repository itself), else ModelFolderError naming both
    readings, within seconds instead of transformers' half a minute of retries (no network, HF_HUB_OFFLINE)."""
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    here = f"{name}: no such {what} here"
    if constants.HF_HUB_OFFLINE:
        raise ModelFolderError(f"{here}, and the Hub is switched off (HF_HUB_OFFLINE): no repository {name} looked up")
    try:
        get_session().head(f"{constants.ENDPOINT}/api/models/{name}", timeout=HUB_PROBE_SECONDS)
    except Exception as error:  # no answer at all (the session's transport errors: no network, no name, a timeout)
        raise ModelFolderError(
            f"{here}, and the Hub ({constants.ENDPOINT}) could not be reached to look for the repository {name} "
            f"({type(error).__name__})"
        ) from None


def check_config(name_or_path: str | Path, local: bool = False) -> PretrainedConfig:
    """The config of a model folder or Hub repository, checked as the module docstring says (`local`: a folder on
    this machine, never a Hub id; a missing one is named as such, with the nearest folder beside it)."""
    name = str(name_or_path)
    folder = Path(name).expanduser()
    if folder.exists() or local or looks_local(name):
        check_folder(name)
    else:
        check_hub_reachable(name)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ModelFolderError(f"{name}: no config.json (a folder written by save_pretrained or attn train)")
        fields = read_json(folder / "config.json", "config")
        if not isinstance(fields, dict):
            raise ModelFolderError(f"{folder / 'config.json'}: a config is a JSON object, not {type(fields).__name__}")
        if (folder / "generation_config.json").is_file():
            read_json(folder / "generation_config.json", "generation config")  # else silently the defaults
        _check_model_type(folder / "config.json", fields.get("model_type"))
    try:
        config = AutoConfig.from_pretrained(name)
    except StrictDataclassError as error:  # "Class validation error for validator ...:\n    ValueError: <what>"
        reason = str(error).strip().splitlines()[-1].strip().removeprefix("ValueError: ")
        raise ModelFolderError(f"{name}: invalid config.json: {reason}") from None
    except ValueError as error:  # a model type transformers does not know; its message runs over lines
        raise ModelFolderError(f"{name}: {str(error).strip().splitlines()[0]}") from None
    import modeling_attn  # noqa: F401  (registers our model types, so that they count as seq2seq below)

    if type(config) not in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING:
        architectures = ", ".join(config.architectures or []) or "no architectures listed"
        raise ModelFolderError(
            f"{name}: a {config.model_type!r} model ({architectures}), not a translation (encoder-decoder) model"
        )
    return config


def _check_model_type(path: Path, model_type: Any) -> None:
    """A model_type transformers does not know (a typo) named as such, with the nearest known one; transformers
    would speak of remote code when the config also has an `auto_map`."""
    import modeling_attn  # noqa: F401  (registers our model types)

    if model_type is None or model_type in CONFIG_MAPPING:
        return
    near = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=1, cutoff=0.8)
    raise ModelFolderError(
        f"{path}: model_type {model_type!r} is not a model type of transformers or modeling_attn"
        + (f"; did you mean {near[0]!r}?" if near else "")
    )


def load_checked(name_or_path: str | Path, allow_missing: bool = False, **kwargs: Any) -> PreTrainedModel:
    """`AutoModelForSeq2SeqLM.from_pretrained(name_or_path, **kwargs)` after `check_config`, refusing weights that
    do not belong to the model (see the module docstring)."""
    check_config(name_or_path)
    model, report = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, output_loading_info=True, **kwargs)
    missing = sorted(report.get("missing_keys", ()))
    mismatched = sorted(str(key) for key in report.get("mismatched_keys", ()))
    if mismatched:
        raise ModelFolderError(f"{name_or_path}: weights of the wrong shape for {', '.join(mismatched[:3])}")
    expected = set(model.state_dict())
    if missing and expected <= set(missing) | _tied(model):
        raise ModelFolderError(
            f"{name_or_path}: the weights hold none of the model's tensors (e.g. {missing[0]}); "
            "it would translate with random weights"
        )
    if missing and not allow_missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelFolderError(
            f"{name_or_path}: the weights lack {len(missing)} of the model's tensors ({shown}); they would be random"
        )
    return model


def _tied(model: PreTrainedModel) -> set[str]:
    """Names that share their tensor with another name (tied embeddings): never reported as loaded on their own."""
    seen: dict[int, str] = {}
    tied = set()
    for key, tensor in model.state_dict(keep_vars=True).items():
        if tensor.data_ptr() in seen:
            tied |= {key, seen[tensor.data_ptr()]}
        seen.setdefault(tensor.data_ptr(), key)
    return tied


__all__ = [
    "ModelFolderError",
    "check_config",
    "check_folder",
    "load_checked",
    "looks_local",
    "no_such_folder",
    "read_json",
]
