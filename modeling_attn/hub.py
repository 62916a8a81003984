"""Share a trained model on the Hugging Face Hub: `push_to_hub()` (used by `attn push` and `attn train
--push_to_hub`), and the files it uploads.

`save_for_hub(model_dir, folder)` writes exactly what is uploaded, and `push_to_hub` uploads what it wrote:
- safetensors weights, `config.json` with `auto_map` (both heads) and `custom_pipelines` (the translation pipeline),
  and the code files, so the model loads with `trust_remote_code=True` where this package is not installed;
- the tokenizer;
- `generation_config.json` with the paper's decoding (Sec. 6.1): beam size 4, length penalty 0.6, maximum output
  length = source length + 50 per sentence (`max_length_over_source`, see `generation.py`), stopping early when
  every beam has ended; the beam size and length penalty the evaluation JSON records win over the paper's (the
  card's scores were measured with them: the Multi30k recipe picks its length penalty on validation);
- `README.md`, the model card: `hub_card.md` rendered with `huggingface_hub.ModelCard`, its metadata
  (`ModelCardData`: languages, license, datasets, metrics, tags, `model-index` with the BLEU / chrF of the
  evaluation JSON) and the attention picture of the training run (`attention.png`) when there is one.

The evaluation JSON is what `attn evaluate --output FILE` writes, the `test_results.json` of `attn train`, or the
`multi30k_results.json` of bench/multi30k/recipe.py; by default `push` reads `test_results.json` of the model folder.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, PreTrainedModel

from .generation import SOURCE_LIMIT_FIELD
from .pipeline_translation import TranslationPipeline
from .translation import check_tokenizer_fits

PAPER_DECODING = {"num_beams": 4, "length_penalty": 0.6, SOURCE_LIMIT_FIELD: 50, "early_stopping": True}
# What a results JSON records of the decoding its scores were measured with (`paper_generation_config`)
DECODING_FIELDS = ("num_beams", "length_penalty", "early_stopping", SOURCE_LIMIT_FIELD, "max_length")
RESULTS_FILE = "test_results.json"
PICTURE_FILE = "attention.png"
ARCHITECTURES = {
    "attn_transformer": 'the encoder-decoder Transformer of Vaswani et al. (2017), "Attention Is All You Need"',
    "attn_rnn": "a bidirectional RNN encoder and an RNN decoder with attention (Bahdanau et al. 2015, Luong et al. 2015)",
}


def paper_generation_config(model: PreTrainedModel, measured: dict[str, Any] | None = None) -> GenerationConfig:
    """The model's generation config with the paper's decoding settings and the model's special tokens: the one
    owner of the decoding of `attn train` (its evaluation and saved models), `attn push` and the Multi30k recipe.

    `measured`: the decoding the model's scores were measured with (the `generation` of a results JSON:
    `num_beams`, `length_penalty`, `early_stopping`, `max_length_over_source`, `max_length`); its values win over
    the paper's, so that the model translates as its card says (None: not recorded, the paper's value); a model whose
    generation config this function wrote (it has `max_length_over_source`) keeps its settings under them. A `max_length`
    counts only with `max_length_over_source: None`, a fixed output limit instead of the paper's per-sentence one; on
    its own (older results JSONs) it is left out, as the per-sentence limit replaces it in `generate()`.
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


def read_results(path: str | Path) -> dict[str, Any]:
    """Scores of an evaluation JSON of `attn evaluate` (`bleu`, ...), `attn train` (`test_bleu`, ...) or the
    Multi30k recipe (`multi30k_results.json` of bench/multi30k/recipe.py: sacreBLEU, chrF and the lowercased
    tokenized BLEU of the published Multi30k numbers)."""
    raw = json.loads(Path(path).read_text())
    if "bleu_lc_tok" in raw:
        source_lang, _, target_lang = raw["direction"].partition("-")
        return {
            "bleu": float(raw["sacrebleu"]),
            "chrf": float(raw["chrf"]),
            "bleu_signature": raw["sacrebleu_signature"],
            "bleu_lc_tok": float(raw["bleu_lc_tok"]),
            "bleu_lc_tok_signature": raw.get("bleu_lc_tok_signature"),
            "data": "multi30k",
            "split": "test2016",
            "source_lang": source_lang,
            "target_lang": target_lang,
            "sentences": raw.get("test_sentences"),
            "generation": {"num_beams": raw.get("num_beams"), "length_penalty": raw.get("length_penalty")},
        }
    prefix = "test_" if "test_bleu" in raw else ""
    if f"{prefix}bleu" not in raw:
        raise ValueError(f"{path}: no 'bleu' or 'test_bleu' score; expected the JSON of `attn evaluate --output`")
    return {
        "bleu": float(raw[f"{prefix}bleu"]),
        "chrf": float(raw[f"{prefix}chrf"]) if f"{prefix}chrf" in raw else None,
        "bleu_signature": raw.get(f"{prefix}bleu_signature"),
        "data": raw.get("data"),
        "split": raw.get("split", "test"),
        "source_lang": raw.get("source_lang"),
        "target_lang": raw.get("target_lang"),
        "sentences": raw.get("sentences"),
        "generation": raw.get("generation"),
    }


def _describe_size(model: PreTrainedModel) -> str:
    config = model.config
    parameters = f"{model.num_parameters() / 1e6:.2f}M parameters"
    if config.model_type == "attn_transformer":
        return (
            f"{parameters}: {config.encoder_layers} encoder and {config.decoder_layers} decoder layers, d_model "
            f"{config.d_model}, {config.num_heads} heads, d_ff {config.d_ff}, vocabulary {config.vocab_size}"
        )
    return (
        f"{parameters}: {config.rnn_type.upper()} encoder ({config.encoder_layers} layers, {config.encoder_hidden_size}"
        f" per direction), {config.decoder_style} decoder ({config.decoder_hidden_size}), "
        f"{config.attention_score} attention, vocabulary {config.vocab_size}"
    )


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


def model_card(
    model: PreTrainedModel,
    repo_id: str,
    results: dict[str, Any] | None = None,
    picture: str | None = None,
    training_recipe: str | None = None,
) -> ModelCard:
    """The model card: `hub_card.md` rendered with this model's metadata and evaluation `results`."""
    model_type = model.config.model_type
    languages = [lang for lang in ((results or {}).get("source_lang"), (results or {}).get("target_lang")) if lang]
    data = (results or {}).get("data")
    # A local path would put the pusher's folders into a public card: keep its last part only.
    is_path = data and (Path(data).is_absolute() or data.startswith((".", "~")) or Path(data).exists())
    dataset = Path(data).name if is_path else data
    eval_results = None
    results_table = None
    if results is not None:
        # (metric type, name, value, metric_config)
        # A lowercasing model is scored case-insensitively (sacreBLEU signature `case:lc`): the names say so.
        case = " (case-insensitive)" if "case:lc" in (results.get("bleu_signature") or "") else ""
        metrics = [("bleu", f"BLEU{case}", results["bleu"], None), ("chrf", f"chrF{case}", results.get("chrf"), None)]
        if results.get("bleu_lc_tok") is not None:
            name = "BLEU, lowercased and Moses-tokenized (multi-bleu)"
            metrics.append(("bleu", name, results["bleu_lc_tok"], "lowercased-tokenized"))
        eval_results = [
            EvalResult(
                task_type="translation",
                task_name="Translation",
                dataset_type=dataset or "unknown",
                dataset_name=dataset or "unknown",
                dataset_split=results.get("split"),
                metric_type=metric,
                metric_name=name,
                metric_value=round(value, 2),
                metric_config=config,
            )
            for metric, name, value, config in metrics
            if value is not None
        ]
        rows = [f"| {name} | {value:.2f} |" for _, name, value, _ in metrics if value is not None]
        results_table = "\n".join(
            [
                f"On the {results.get('split')} split of {dataset} ({results.get('sentences')} sentences, "
                f"{' -> '.join(languages) or 'languages not recorded'}), decoding with "
                f"{_describe_decoding(results.get('generation'))}:",
                "",
                "| metric | score |",
                "| --- | --- |",
                *rows,
                "",
                f"sacreBLEU signature: `{results.get('bleu_signature')}`",
            ]
            + (
                [f"Lowercased tokenized BLEU: `{results['bleu_lc_tok_signature']}`"]
                if "bleu_lc_tok" in results
                else []
            )
        )
    card_data = ModelCardData(
        model_name=repo_id.split("/")[-1],
        language=languages or None,
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", model_type, "modeling-attn"],
        datasets=[dataset] if dataset else None,
        metrics=["bleu", "chrf"],
        eval_results=eval_results,
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
        architecture=ARCHITECTURES[model_type],
        size=_describe_size(model),
        training_data=f"{dataset} ({' -> '.join(languages)})" if dataset else None,
        training_recipe=training_recipe,
        results_table=results_table,
        picture=picture,
    )


def save_for_hub(
    model_dir: str | Path, folder: str | Path, repo_id: str, results_file: str | Path | None = None
) -> Path:
    """Write into `folder` exactly the files `push_to_hub` uploads for the model saved in `model_dir`."""
    model_dir, folder = Path(model_dir), Path(folder)
    import modeling_attn  # noqa: F401  (registers the model types and the pipeline)

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    check_tokenizer_fits(model, tokenizer, str(model_dir))
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
    model_card(model, repo_id, results, picture, _training_summary(model_dir)).save(folder / "README.md")
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
    created from main if needed). Returns the URL of the commit."""
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory() as folder:
        save_for_hub(model_dir, folder, repo_id, results_file)
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            revision=revision,
            commit_message=commit_message or f"Upload {Path(model_dir).name} with modeling-attn",
        )
    return commit.commit_url


__all__ = ["model_card", "paper_generation_config", "push_to_hub", "read_results", "save_for_hub"]
