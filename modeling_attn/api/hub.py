"""Share a trained model on the Hugging Face Hub: `push_to_hub()` and the files it uploads.

`push_to_hub` is used by `attn push` and `attn train --push_to_hub`. `save_for_hub(model_dir, folder)` writes exactly
what is uploaded, and `push_to_hub` uploads what it wrote:
- safetensors weights, `config.json` with `auto_map` and `custom_pipelines`, and the code files, so the model loads
  with `trust_remote_code=True` where this package is not installed; the tokenizer;
- `generation_config.json` with the paper's decoding (Sec. 6.1: beam 4, length penalty 0.6, source length + 50 per
  sentence, early stop; `paper_generation_config`), where the evaluation JSON's beams and length penalty win;
- `README.md`, the model card: `hub_card.md` rendered with `huggingface_hub.ModelCard`, its metadata
  (`ModelCardData`) and the training run's attention picture. docs/hub.md, "Push", details the card.

The evaluation JSON is what `attn evaluate --output FILE` writes, the `test_results.json` of `attn train`, or the
`multi30k_results.json` of bench/multi30k/recipe.py; by default `push` reads `test_results.json` of the model folder.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalTokenNotFoundError, OfflineModeIsEnabled
from huggingface_hub.utils import validate_repo_id
from transformers import GenerationConfig, PreTrainedConfig, PreTrainedModel

from ..generation import SOURCE_LIMIT_FIELD
from ..pipeline_translation import TranslationPipeline
from ..registry import MODEL_TYPES
from .errors import ResultsError, UserError, hub_transport_error, unreachable_hub
from .model_folder import read_json
from .translation import load_model

logger = logging.getLogger(__name__)

PAPER_DECODING = {"num_beams": 4, "length_penalty": 0.6, SOURCE_LIMIT_FIELD: 50, "early_stopping": True}
# What a results JSON records of the decoding its scores were measured with (`paper_generation_config`)
DECODING_FIELDS = ("num_beams", "length_penalty", "early_stopping", SOURCE_LIMIT_FIELD, "max_length")
RESULTS_FILE = "test_results.json"
PICTURE_FILE = "attention.png"
ORIGIN_FILE = "origin.json"  # where a model folder records the model it was made from (`record_origin`)
EMBEDDED_TASK = "embedded dates task"  # the `data` of the results of a run on the embedded task (no --data)
EMBEDDED_TASK_TEXT = (
    "the embedded dates task of modeling-attn (`training/synthetic.py`): dates written in many English and German "
    "styles (source) to ISO 8601 dates (target), generated without network; not a natural language pair"
)


def paper_generation_config(model: PreTrainedModel, measured: dict[str, Any] | None = None) -> GenerationConfig:
    """The model's generation config with the paper's decoding settings and the model's special tokens: the one
    owner of the decoding of `attn train` (its evaluation and saved models), `attn push` and the Multi30k recipe.

    `measured`: the decoding the model's scores were measured with (the `generation` of a results JSON:
    `num_beams`, `length_penalty`, `early_stopping`, `max_length_over_source`, `max_length`); its values win over
    the paper's, so that the model translates as its card says (None: not recorded, the paper's value); a model whose
    generation config this function wrote (it has `max_length_over_source`) keeps its settings under them. A
    `max_length` counts only with `max_length_over_source: None`, a fixed output limit instead of the paper's
    per-sentence one; on its own (older results JSONs) it is left out, as the per-sentence limit replaces it in
    `generate()`.
    """
    own = model.generation_config
    if hasattr(own, SOURCE_LIMIT_FIELD):  # written by this function (`attn train`, the recipe): its settings stand
        measured = {**{key: getattr(own, key, None) for key in DECODING_FIELDS}, **(measured or {})}
    measured = {key: value for key, value in (measured or {}).items() if key in DECODING_FIELDS}
    fixed_limit = (
        SOURCE_LIMIT_FIELD in measured and measured[SOURCE_LIMIT_FIELD] is None and measured.get("max_length")
    )
    decoding = {**PAPER_DECODING}
    decoding.update({key: value for key, value in measured.items() if value is not None and key != "max_length"})
    if fixed_limit:
        decoding.update({SOURCE_LIMIT_FIELD: None, "max_length": fixed_limit})
    config = GenerationConfig.from_dict(model.generation_config.to_dict())
    unknown = config.update(
        **decoding,
        pad_token_id=model.config.pad_token_id,
        eos_token_id=model.config.eos_token_id,
        decoder_start_token_id=model.config.decoder_start_token_id,
    )
    for name, value in unknown.items():  # `update` sets only GenerationConfig's own fields
        setattr(config, name, value)
    config.max_new_tokens = None  # would take precedence over the per-sentence limit
    config._from_model_config = False  # ours, not derived from the model config: generate() must not replace it
    return config


@cache
def _language_codes() -> frozenset[str]:
    """The language codes of Hub metadata, from the list `datasets` ships for dataset cards: ISO 639-1, and
    ISO 639-3 for languages without a two-letter code (BCP 47's choice: "de", not "deu")."""
    try:
        text = (resources.files("datasets.utils.resources") / "languages.json").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):  # the list moved in another datasets release
        logger.warning("datasets ships no languages.json: any 2- or 3-letter language code goes into the card")
        return frozenset()
    return frozenset(json.loads(text))


def language_codes(*languages: str | None) -> list[str] | None:
    """The card's `language` for a language pair: ISO 639 codes ("en_XX", "pt-BR" -> "en", "pt"), or None when
    either side is no language code. One unknown side drops both: the embedded task's pair "date" -> "iso" is not a
    language pair, though "iso" alone is a code (Isoko)."""
    known = _language_codes()
    codes: list[str] = []
    for language in languages:
        primary = re.split(r"[-_]", (language or "").strip())[0].lower()
        if not (primary in known if known else re.fullmatch(r"[a-z]{2,3}", primary)):
            return None
        if primary not in codes:
            codes.append(primary)
    return codes or None


def hub_id(reference: str | None) -> str | None:
    """`reference` (a model or dataset as a command line named it) if it names a Hub repository, else None: the
    embedded task and local paths (absolute, `./`, `~`, or existing here) are not Hub ids."""
    if not reference or reference == EMBEDDED_TASK:
        return None
    if reference.startswith((".", "~", "/", "\\")) or Path(reference).exists():
        return None
    try:
        validate_repo_id(reference)
    except HFValidationError:
        return None
    return reference


def decoding_settings(config: GenerationConfig, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The decoding of a generation config (with the settings a command line gave over it) as evaluation JSONs
    record it (`attn train`'s test_results.json, `attn evaluate --output`), and as `paper_generation_config` and the
    card read it."""
    settings = {name: (overrides or {}).get(name, getattr(config, name, None)) for name in DECODING_FIELDS}
    new_tokens = (overrides or {}).get("max_new_tokens", getattr(config, "max_new_tokens", None))
    if new_tokens is not None:  # a fixed limit, which generate() applies over the others
        # recorded as the same limit in max_length, which counts the decoder's start token
        settings.update({SOURCE_LIMIT_FIELD: None, "max_length": new_tokens + 1})
    if settings[SOURCE_LIMIT_FIELD] is not None:
        del settings["max_length"]  # replaced by the per-sentence limit in generate()
    return settings


def local_or_hub(name_or_path: str | None) -> str | None:
    """A model or dataset named on a command line, as a record that `hub_id` reads right later and elsewhere: an
    existing local path made absolute (a relative `data/m30k` would pass for a Hub id), anything else as given."""
    if name_or_path and Path(name_or_path).exists():
        return str(Path(name_or_path).resolve())
    return name_or_path


def record_origin(folder: str | Path, source: str | Path, how: str) -> Path:
    """Write `origin.json` into the model folder `folder`: the model it was made from (`source`, a folder or a Hub
    id) and `how` ("converted from the Marian model"). `attn push` makes a Hub id the card's `base_model`."""
    from .. import __version__

    path = Path(folder) / ORIGIN_FILE
    origin = {
        "how": how,
        "source": local_or_hub(str(source)),
        "hub_id": hub_id(str(source)),
        "by": f"modeling-attn {__version__}",
    }
    path.write_text(json.dumps(origin, indent=2) + "\n")
    return path


def model_origin(model_dir: str | Path, _depth: int = 0) -> tuple[str | None, str | None]:
    """The Hub id of the model that the model in `model_dir` was made from, and a sentence for the card.

    Read from its `origin.json` (written by `attn convert --from-marian` and `attn train --model_name_or_path`).
    A local folder as source is followed to its own origin (a model fine-tuned from a converted OPUS-MT model
    derives from that OPUS-MT model). (None, None): trained from scratch, or not recorded."""
    path = Path(model_dir) / ORIGIN_FILE
    if not path.is_file():
        return None, None
    origin = json.loads(path.read_text())
    how, source = origin.get("how") or "made from", origin.get("source")
    if not source:
        return None, None
    found = hub_id(source)
    if found is not None:
        return found, f"{how} [{found}](https://huggingface.co/{found})"
    local = f"{how} {Path(source).name} (a local folder)"  # its name only: the pusher's folders stay private
    if _depth < 8 and Path(source).is_dir():
        ancestor, text = model_origin(source, _depth + 1)
        if text is not None:
            return ancestor, f"{local}, which was {text}"
    return None, local


def read_results(path: str | Path) -> dict[str, Any]:
    """Scores of an evaluation JSON of `attn evaluate` (`bleu`, ...), `attn train` (`test_bleu`, ...) or the
    Multi30k recipe (`multi30k_results.json` of bench/multi30k/recipe.py: sacreBLEU, chrF and the lowercased
    tokenized BLEU of the published Multi30k numbers)."""
    expected = "expected the JSON of `attn evaluate --output`"
    raw = read_json(path, "evaluation results (the JSON of `attn evaluate --output`)", ResultsError)
    if not isinstance(raw, dict):
        raise ResultsError(f"{path}: a JSON {type(raw).__name__}, not an object of scores; {expected}")
    try:
        return _scores(raw, path, expected)
    except ResultsError:
        raise
    except (KeyError, TypeError, ValueError) as error:  # a score missing, or not a number
        raise ResultsError(f"{path}: cannot read its scores ({type(error).__name__}: {error}); {expected}") from None


def _scores(raw: dict[str, Any], path: str | Path, expected: str) -> dict[str, Any]:
    """`read_results`' fields of one results object (KeyError, TypeError or ValueError where one is missing)."""
    if "bleu_lc_tok" in raw:
        source_lang, _, target_lang = raw["direction"].partition("-")
        return {
            "bleu": float(raw["sacrebleu"]),
            "chrf": float(raw["chrf"]),
            "bleu_signature": raw["sacrebleu_signature"],
            "bleu_lc_tok": float(raw["bleu_lc_tok"]),
            "bleu_lc_tok_signature": raw.get("bleu_lc_tok_signature"),
            "data": "multi30k",
            "dataset_id": None,  # read from local files (bench/multi30k/recipe.py --data), not a Hub dataset
            "split": "test2016",
            "source_lang": source_lang,
            "target_lang": target_lang,
            "sentences": raw.get("test_sentences"),
            "generation": {"num_beams": raw.get("num_beams"), "length_penalty": raw.get("length_penalty")},
        }
    prefix = "test_" if "test_bleu" in raw else ""
    if f"{prefix}bleu" not in raw:
        raise ResultsError(f"{path}: no 'bleu' or 'test_bleu' score; {expected}")
    return {
        "bleu": float(raw[f"{prefix}bleu"]),
        "chrf": float(raw[f"{prefix}chrf"]) if f"{prefix}chrf" in raw else None,
        "bleu_signature": raw.get(f"{prefix}bleu_signature"),
        "data": raw.get("data"),
        "dataset_id": hub_id(raw.get("data")),
        "split": raw.get("split", "test"),
        "source_lang": raw.get("source_lang"),
        "target_lang": raw.get("target_lang"),
        "sentences": raw.get("sentences"),
        "generation": raw.get("generation"),
    }


def describe_size(model: PreTrainedModel) -> str:
    """The model's size for the card: its parameter count and its shape (`registry.MODEL_TYPES`)."""
    return f"{model.num_parameters() / 1e6:.2f}M parameters: {MODEL_TYPES[model.config.model_type].size(model.config)}"


def _describe_decoding(settings: dict[str, Any] | None) -> str:
    if not settings:
        return "the settings of the evaluation run (not recorded)"
    return ", ".join(f"{name} {value}" for name, value in settings.items() if value is not None)


def _training_summary(model_dir: Path) -> str:
    state_file = model_dir / "trainer_state.json"
    if not state_file.is_file():
        return "not recorded (the model folder has no trainer_state.json of `attn train`)"
    state = json.loads(state_file.read_text())
    runtime = next((e["train_runtime"] for e in state.get("log_history", []) if "train_runtime" in e), None)
    text = f"{state.get('global_step')} steps with `attn train`"
    return text + (f", {runtime / 60:.1f} minutes" if runtime else "")


def describe_generation(config: GenerationConfig) -> str:
    """The decoding that `generation_config.json` gives `generate()`, in words."""
    beams = config.num_beams or 1
    parts = [f"beam search with {beams} beams, length penalty {config.length_penalty}" if beams > 1 else "greedy"]
    offset = getattr(config, SOURCE_LIMIT_FIELD, None)
    if config.max_new_tokens is not None:
        parts.append(f"at most {config.max_new_tokens} new tokens")
    elif offset is not None:
        parts.append(f"at most source length + {offset} tokens per sentence (`{SOURCE_LIMIT_FIELD}`)")
    elif config.max_length is not None:
        parts.append(f"at most {config.max_length} tokens")
    if beams > 1:
        parts.append(
            "stopping once every beam has ended"
            if config.early_stopping is True
            else f"`early_stopping={config.early_stopping}`"
        )
    return ", ".join(parts)


def describe_alignments(config: PreTrainedConfig) -> str:
    """Where `attn translate --align` reads word alignments (`api/alignment.py`), in words."""
    if not hasattr(config, "alignment_layer"):
        return "the RNN's alignment weights alpha (Bahdanau et al. 2015)"
    layer = config.alignment_layer % config.decoder_layers
    heads = "all its heads" if config.alignment_heads == 0 else f"its first {config.alignment_heads} head(s)"
    return (
        f"the cross-attention of decoder layer {layer + 1} of {config.decoder_layers}, the mean of {heads} "
        "(`alignment_layer`, `alignment_heads` in config.json)"
    )


def _describe_data(results: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """The data of the results for the card: (Hub dataset id or None, a short name for the text and model-index)."""
    data = (results or {}).get("data")
    if not data:
        return None, None
    dataset_id = results.get("dataset_id", hub_id(data))
    if dataset_id is not None or data in (EMBEDDED_TASK, "multi30k"):
        return dataset_id, data
    return None, Path(data).name  # a local folder: its name only, the pusher's folders stay private


def _card_metrics(results: dict[str, Any]) -> list[tuple[str, str, float, str | None]]:
    """The scores of `results` the card reports: (metric type, name, value, metric_config), recorded ones only. A
    lowercasing model is scored case-insensitively (sacreBLEU signature `case:lc`): the names say so."""
    case = " (case-insensitive)" if "case:lc" in (results.get("bleu_signature") or "") else ""
    metrics = [("bleu", f"BLEU{case}", results["bleu"], None), ("chrf", f"chrF{case}", results.get("chrf"), None)]
    if results.get("bleu_lc_tok") is not None:
        name = "BLEU, lowercased and Moses-tokenized (multi-bleu)"
        metrics.append(("bleu", name, results["bleu_lc_tok"], "lowercased-tokenized"))
    return [metric for metric in metrics if metric[2] is not None]


def _eval_results(results: dict[str, Any], dataset_id: str | None, dataset: str | None) -> list[EvalResult]:
    """The card's `model-index`: one `EvalResult` per score of `_card_metrics`."""
    return [
        EvalResult(
            task_type="translation",
            task_name="Translation",
            # the Hub id, else an id-like slug of the name (the model-index wants no spaces there)
            dataset_type=dataset_id or re.sub(r"[^A-Za-z0-9._-]+", "-", dataset or "unknown").strip("-"),
            dataset_name=dataset or "unknown",
            dataset_config=results.get("data_config"),
            dataset_split=results.get("split"),
            metric_type=metric,
            metric_name=name,
            metric_value=round(value, 2),
            metric_config=config,
        )
        for metric, name, value, config in _card_metrics(results)
    ]


def _results_table(results: dict[str, Any], dataset: str | None, pair_text: str) -> str:
    """The card's scores in its text: what was scored and how it was decoded, a table, the signatures."""
    rows = [f"| {name} | {value:.2f} |" for _, name, value, _ in _card_metrics(results)]
    lines = [
        f"On the {results.get('split')} split of {dataset} ({results.get('sentences')} sentences, {pair_text}), "
        f"decoding with {_describe_decoding(results.get('generation'))}:",
        "",
        "| metric | score |",
        "| --- | --- |",
        *rows,
        "",
        f"sacreBLEU signature: `{results.get('bleu_signature')}`",
    ]
    if "bleu_lc_tok" in results:
        lines.append(f"Lowercased tokenized BLEU: `{results['bleu_lc_tok_signature']}`")
    return "\n".join(lines)


def _describe_training_data(dataset: str | None, dataset_id: str | None, pair_text: str) -> str | None:
    if dataset == EMBEDDED_TASK:
        return EMBEDDED_TASK_TEXT
    if dataset_id is not None:
        return f"[{dataset_id}](https://huggingface.co/datasets/{dataset_id}) ({pair_text})"
    if dataset:
        return f"{dataset}, a local dataset ({pair_text})"
    return None


def model_card(
    model: PreTrainedModel,
    repo_id: str,
    results: dict[str, Any] | None = None,
    picture: str | None = None,
    training_recipe: str | None = None,
    base_model: str | None = None,
    origin: str | None = None,
) -> ModelCard:
    """The model card: `hub_card.md` rendered with this model's metadata and evaluation `results`.

    The metadata holds what the Hub reads as identifiers, and only then: `language` as ISO 639 codes
    (`language_codes`), `datasets` as Hub dataset ids, `base_model` (the Hub id of the model it was fine-tuned or
    converted from, with `base_model_relation: finetune`). Data and origins that are not on the Hub are described
    in the text (`origin`: a sentence of `model_origin`).
    """
    model_type = model.config.model_type
    pair = [lang for lang in ((results or {}).get("source_lang"), (results or {}).get("target_lang")) if lang]
    dataset_id, dataset = _describe_data(results)
    pair_text = " -> ".join(pair) or "languages not recorded"
    card_data = ModelCardData(
        model_name=repo_id.split("/")[-1],
        base_model=base_model,
        base_model_relation="finetune" if base_model else None,
        language=language_codes(*pair) if len(pair) == 2 else None,
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", model_type, "modeling-attn"],
        datasets=[dataset_id] if dataset_id else None,
        metrics=["bleu", "chrf"],
        eval_results=_eval_results(results, dataset_id, dataset) if results is not None else None,
    )
    template = (resources.files("modeling_attn") / "hub_card.md").read_text()
    if not template.startswith("---"):  # e.g. a checkout without symlinks holds the link's target path as text
        raise RuntimeError(f"modeling_attn/hub_card.md is not the model card template (it starts {template[:40]!r})")
    return ModelCard.from_template(
        card_data,
        template_str=template,
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        model_type=model_type,
        architecture=MODEL_TYPES[model_type].describe,
        size=describe_size(model),
        decoding=describe_generation(model.generation_config),
        alignments=describe_alignments(model.config),
        origin=origin,
        training_data=_describe_training_data(dataset, dataset_id, pair_text),
        training_recipe=training_recipe,
        results_table=_results_table(results, dataset, pair_text) if results is not None else None,
        picture=picture,
    )


def save_for_hub(
    model_dir: str | Path, folder: str | Path, repo_id: str, results_file: str | Path | None = None
) -> Path:
    """Write into `folder` exactly the files `push_to_hub` uploads for the model saved in `model_dir`."""
    model_dir, folder = Path(model_dir), Path(folder)
    import modeling_attn  # noqa: F401  (registers the model types and the pipeline)

    model, tokenizer = load_model(str(model_dir), "cpu")  # a folder that cannot be used: named, with the reason
    results_file = results_file or (model_dir / RESULTS_FILE if (model_dir / RESULTS_FILE).is_file() else None)
    results = read_results(results_file) if results_file else None
    model.generation_config = paper_generation_config(model, (results or {}).get("generation"))
    # Pipeline.save_pretrained writes config.custom_pipelines, copies pipeline_translation.py, and saves the
    # model (safetensors, config, code, generation config) and the tokenizer.
    TranslationPipeline(model=model, tokenizer=tokenizer).save_pretrained(folder)
    picture = None
    if (model_dir / PICTURE_FILE).is_file():
        shutil.copyfile(model_dir / PICTURE_FILE, folder / PICTURE_FILE)
        picture = PICTURE_FILE
    base_model, origin = model_origin(model_dir)
    card = model_card(model, repo_id, results, picture, _training_summary(model_dir), base_model, origin)
    card.save(folder / "README.md")
    return folder


def push_to_hub(
    model_dir: str | Path,
    repo_id: str,
    private: bool | None = None,
    revision: str | None = None,
    token: str | None = None,
    results_file: str | Path | None = None,
    commit_message: str | None = None,
) -> str:
    """Upload the model in `model_dir` to the Hub repository `repo_id` (created if needed; `revision` is a branch,
    created from main if needed). Returns the URL of the commit.

    What the Hub's answer makes impossible is one `UserError` line, as `attn push` reports it: no network
    (`HubUnreachableError`, naming the Hub and the way out), no token, no access, a refusal."""
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory() as folder:
        save_for_hub(model_dir, folder, repo_id, results_file)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            if revision is not None:
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            commit = api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                revision=revision,
                commit_message=commit_message or f"Upload {Path(model_dir).name} with modeling-attn",
            )
        # `from None`: the HTTP client's traceback (some 70 lines) says nothing the line does not
        except (hub_transport_error(), OfflineModeIsEnabled) as error:
            raise unreachable_hub(error) from None
        except (HfHubHTTPError, LocalTokenNotFoundError) as error:  # no token, no access: the Hub's answer
            raise UserError(f"the upload to {repo_id} failed: {str(error).strip().splitlines()[0]}") from None
    return commit.commit_url


__all__ = [
    "describe_alignments",
    "describe_generation",
    "describe_size",
    "hub_id",
    "language_codes",
    "local_or_hub",
    "model_card",
    "model_origin",
    "paper_generation_config",
    "push_to_hub",
    "read_results",
    "record_origin",
    "save_for_hub",
]
