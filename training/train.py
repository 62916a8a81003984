"""`attn train` / `python -m modeling_attn.training` / `accelerate launch -m modeling_attn.training`: the paper's training recipe with Trainer.

Steps: load and check the parallel data (`modeling_attn.training.data`), train a joint BPE vocabulary or reuse a tokenizer
(`modeling_attn.training.tokenizer`), build the model from a preset or load it (`--model_name_or_path`), then train with
`TranslationTrainer` (transformers' `Seq2SeqTrainer`), average the last checkpoints (`modeling_attn.training.averaging`), evaluate
on the test set, and write test_results.json and a plot of the training curves; with `--push_to_hub`, upload the
final model with `modeling_attn.api.hub.push_to_hub` (`--hub_model_id`, default the output folder's name;
`--hub_private_repo`, `--hub_revision`, `--hub_token`), and the checkpoints as `--hub_strategy` says (transformers'
meaning, default every_save; `TranslationTrainer`), each with the files of `attn push`.

Command line: `modeling_attn.cli.parser.CommandParser` (flags files, `--a-b`, one-line errors); run_translation.py's
`--dataset_name`, `--dataset_config_name`, `--tokenizer_name` are aliases of ours. Every Trainer flag either does what
transformers documents or is refused before any work, with the reason (`parse_args`): e.g. sentence-batch flags
under token batches, a second run into a folder holding another run's checkpoints. `--load_best_model_at_end` makes
the best checkpoint the final model (no averaging); `--early_stopping_patience` stops on the validation metric.

The paper's recipe (Sec. 5.3-5.4, 6.1) is the default of the Trainer flags:
- Adam with beta1 0.9, beta2 0.98, eps 1e-9 (`--optim adamw_torch` with `--weight_decay 0` is Adam);
- lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) with warmup 4000 (Eq. 3): transformers'
  `inverse_sqrt` schedule with peak `--learning_rate` d_model^-0.5 * warmup^-0.5 (see `paper_learning_rate`);
- label smoothing 0.1; batches of about `--max_tokens_per_batch` tokens, bucketed by length;
- beam search with 4 beams, length penalty 0.6, at most source length + 50 tokens, stopping early when possible
  (`modeling_attn.api.hub.paper_generation_config`, the one generation config of validation, test, saved and pushed
  models); the average of the last 5 checkpoints.
Deviations: gradients are clipped at norm 1 (Trainer's default `--max_grad_norm`; the paper does not say), and
Trainer's scheduler applies the rate of step n-1 at update n (the logged rate at step n is the paper's).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import logging
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import pyarrow.compute as pc
import torch
import transformers
from huggingface_hub import HfApi
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
    set_seed,
)
from transformers.integrations import is_tensorboard_available
from transformers.trainer_utils import get_last_checkpoint

from modeling_attn.api.alignment import WORD_PATTERNS
from modeling_attn.api.hub import (
    EMBEDDED_TASK,
    decoding_settings,
    local_or_hub,
    paper_generation_config,
    push_to_hub,
    record_origin,
)
from modeling_attn.api.metrics import translation_scores, writes_lowercase
from modeling_attn.api.presets import available_presets, load_preset
from modeling_attn.generation import SOURCE_LIMIT_FIELD
from modeling_attn.loss import GUIDED_ALIGNMENT_WEIGHT
from modeling_attn.registry import MODEL_TYPES

from .alignment import check_alignment_flags, guided_alignment
from .averaging import average_checkpoints, find_checkpoints, load_weights
from .bpe_dropout import BPEDropoutPairs
from .data import ParallelData, load_parallel_data, require_splits
from .metrics import TranslationMetrics
from .plot import plot_history
from .prepare import bpe_cache_folder, iter_texts, tokenized_fingerprint
from .tokenizer import splits_punctuation, train_bpe_tokenizer, truncate
from .trainer import STAGING_DIR, TranslationTrainer

logger = logging.getLogger("modeling_attn.training")


# The paper's recipe, as defaults of transformers' own Seq2SeqTrainingArguments flags.
PAPER_DEFAULTS = {
    "output_dir": "outputs/attn",
    "optim": "adamw_torch",
    "weight_decay": 0.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.98,
    "adam_epsilon": 1e-9,
    "lr_scheduler_type": "inverse_sqrt",
    "warmup_steps": 4000,
    "label_smoothing_factor": 0.1,
    "predict_with_generate": True,
    "generation_num_beams": 4,
    "eval_strategy": "steps",
    "eval_steps": 1000,
    "save_steps": 1000,
    "save_total_limit": 5,
    "logging_steps": 100,
    "do_train": True,
    "do_eval": True,
    "do_predict": True,
    "per_device_eval_batch_size": 64,
    "dataloader_pin_memory": torch.cuda.is_available(),
    "report_to": "tensorboard" if is_tensorboard_available() else "none",
}


@dataclass
class RecipeArguments:
    """Our flags; every `Seq2SeqTrainingArguments` flag is accepted too."""

    data: str | None = field(
        default=None,
        metadata={"help": "Folder of {split}.{lang}[.gz] / {split}.tsv / {split}.jsonl files, a save_to_disk folder, "
                  "or a dataset name for datasets.load_dataset with a 'translation' column. Default: the embedded "
                  "dates task (no network needed).", "aliases": ["--dataset_name", "--dataset-name"]},
    )  # fmt: skip
    data_config: str | None = field(default=None, metadata={"help": "Dataset configuration, e.g. de-en for wmt14.",
                                                            "aliases": ["--dataset_config_name", "--dataset-config-name"]})  # fmt: skip
    source_lang: str | None = field(default=None, metadata={"help": "Source language code (file suffix / JSON key)."})
    target_lang: str | None = field(default=None, metadata={"help": "Target language code."})
    drop_empty_pairs: bool = field(default=False, metadata={"help": "Drop pairs with an empty side (counted, logged) "
                                                             "instead of stopping with an error."})  # fmt: skip
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={"help": "Processes that tokenize the data (datasets' map num_proc). Data read from files is cached: a "
                  "second run on the same files and tokenizer reuses it (training/prepare.py says where)."},
    )  # fmt: skip
    streaming: bool = field(
        default=False,
        metadata={"help": "Read and tokenize the data while training (datasets' IterableDataset) instead of preparing "
                  "it up front: for corpora too large to prepare. Token batches from a bounded length-sorted buffer; "
                  "needs --max_steps. A resumed run reads the stream again and skips the batches already trained "
                  "(README, Train)."},
    )  # fmt: skip
    streaming_buffer_pairs: int = field(
        default=100_000,
        metadata={"help": "--streaming: pairs held at a time to sort by length and cut into token batches."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Use only the first N test pairs."})
    model_type: str | None = field(
        default=None,
        metadata={"help": "Model type. Default: the type of --preset or --model_name_or_path, else attn_transformer.",
                  "choices": tuple(MODEL_TYPES)},
    )  # fmt: skip
    preset: str | None = field(
        default=None, metadata={"help": "Model preset (`attn preset` lists them); default small / rnn-small."}
    )
    config_overrides: str | None = field(
        default=None, metadata={"help": "Config values over the preset or the fine-tuned model's, e.g. 'dropout=0.3'."}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Fine-tune this model (local folder or Hub id) and keep its tokenizer."}
    )
    tokenizer_name_or_path: str | None = field(default=None, metadata={"help": "Reuse this tokenizer instead of "
                                                                        "training a BPE vocabulary.",
                                                                        "aliases": ["--tokenizer_name", "--tokenizer-name"]})  # fmt: skip
    vocab_size: int = field(
        default=37000, metadata={"help": "Size of the joint BPE vocabulary to train (paper: 37000)."}
    )
    lowercase: bool = field(
        default=False,
        metadata={"help": "New BPE vocabulary: lowercase all text (the model reads and writes lowercase)."},
    )
    split_punctuation: bool = field(
        default=False,
        metadata={"help": "New BPE vocabulary: punctuation marks are tokens of their own, never merged."},
    )
    max_source_length: int = field(default=256, metadata={"help": "Longer source sentences are truncated (counted)."})
    max_target_length: int = field(default=256, metadata={"help": "Longer target sentences are truncated (counted)."})
    bpe_dropout: float = field(
        default=0.0,
        metadata={"help": "BPE-dropout (Provilkov et al., 2020): while training, skip each BPE merge with this "
                  "probability, so the training sentences are segmented anew each epoch (e.g. 0.1). 0: off."},
    )  # fmt: skip
    max_tokens_per_batch: int = field(
        default=4096,
        metadata={"help": "Padded source (and target) tokens per batch and process; 0 batches by "
                  "--per_device_train_batch_size sentences. The paper: ~25000 per step over all processes."},
    )  # fmt: skip
    length_penalty: float = field(default=0.6, metadata={"help": "Beam search length penalty alpha (paper: 0.6)."})
    average_last_n: int = field(
        default=5,
        metadata={"help": "Average the last N checkpoints at the end (paper: 5); 1 (no averaging) with "
                  "--load_best_model_at_end, whose best checkpoint is the final model."},
    )  # fmt: skip
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Delete the checkpoints an earlier run left in --output_dir before training (transformers' "
                  "flag of that name; without it such a folder is refused unless --resume_from_checkpoint continues it)."},
    )  # fmt: skip
    early_stopping_patience: int | None = field(
        default=None,
        metadata={"help": "Stop when --metric_for_best_model has not improved for N evaluations (transformers' "
                  "EarlyStoppingCallback; needs validation: --eval_strategy steps or epoch)."},
    )  # fmt: skip
    early_stopping_threshold: float = field(
        default=0.0, metadata={"help": "With --early_stopping_patience: the least change that counts as improvement."}
    )
    num_samples_to_print: int = field(default=5, metadata={"help": "Test translations printed at the end."})
    # Guided alignment training (training/alignment.py)
    alignment_file: str | None = field(
        default=None,
        metadata={"help": "Word alignments of the training pairs, one Pharaoh line per pair (`0-0 1-2 ...`: source "
                  "word - target word), e.g. from fast_align or eflomal: train with guided alignment (Garg et al. "
                  "2019; Marian's --guided-alignment); the config records the supervised layer and head."},
    )  # fmt: skip
    guided_alignment_weight: float = field(
        default=GUIDED_ALIGNMENT_WEIGHT,
        metadata={"help": "--alignment_file: weight of the alignment loss added to the translation loss (Marian's "
                  "default; Garg et al. use 0.05)."},
    )  # fmt: skip
    alignment_words: str = field(
        default="whitespace",
        metadata={"help": "--alignment_file: what its words are: text between spaces, or runs of letters and digits "
                  "with the punctuation around them (alnum).", "choices": tuple(WORD_PATTERNS)},
    )  # fmt: skip


def paper_learning_rate(d_model: int, warmup_steps: int) -> float:
    """Peak rate d_model^-0.5 * warmup^-0.5 that makes `inverse_sqrt` equal Eq. 3 of the paper.

    `inverse_sqrt` gives peak * step / warmup before `warmup` and peak * sqrt(warmup / step) after it, which is
    d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) with this peak.
    """
    return d_model**-0.5 * max(warmup_steps, 1) ** -0.5


def paper_warmup_steps(training_args: Seq2SeqTrainingArguments) -> int:
    """The warmup steps of Eq. 3, as Trainer counts them: `--warmup_steps` below 1 is a ratio of the training steps."""
    warmup = training_args.warmup_steps
    if 0 < warmup < 1:
        if training_args.max_steps <= 0:
            raise ValueError(
                f"--warmup_steps {warmup} is a ratio of the training steps, which the paper's learning rate needs "
                "before training starts: give --max_steps, a whole number of --warmup_steps, or --learning_rate"
            )
        return training_args.get_warmup_steps(training_args.max_steps)
    return int(warmup)


def validate(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, given: set[str]) -> None:
    """Every check of the flags, once, before any work: a value or a combination that cannot work (or that would be
    silently ignored) raises ValueError naming the flags. `given`: the fields the command line named (the checks of
    flags that only matter when given). Fills in what the flags imply (the resumed checkpoint, TER's direction)."""
    if not 0 <= recipe.bpe_dropout <= 1:
        raise ValueError(f"--bpe_dropout is a probability in [0, 1] (0: off), got {recipe.bpe_dropout}")
    if recipe.bpe_dropout and not recipe.max_tokens_per_batch:
        raise ValueError("--bpe_dropout needs token batches (--max_tokens_per_batch > 0): they are packed anew "
                         "for each epoch's segmentation")  # fmt: skip
    if recipe.preset is not None and recipe.preset not in available_presets():
        near = difflib.get_close_matches(recipe.preset, available_presets(), n=1)
        raise ValueError(f"--preset: unknown preset {recipe.preset!r}; "
                         + (f"did you mean {near[0]!r}?" if near else f"one of {available_presets()}"))  # fmt: skip
    if recipe.streaming:
        if recipe.bpe_dropout:
            raise ValueError("--streaming with --bpe_dropout: BPE-dropout segments the whole training set in memory "
                             "at each epoch")  # fmt: skip
        if training_args.do_train and training_args.max_steps <= 0:
            raise ValueError("--streaming needs --max_steps: a stream has no length for Trainer to count epochs in")
        if training_args.world_size > 1:
            raise ValueError(f"--streaming reads the stream in one training process, not {training_args.world_size}")
    for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
        if (value := getattr(recipe, name)) is not None and value < 1:
            raise ValueError(f"--{name} must be a positive integer, got {value}")
    if training_args.learning_rate is None:
        paper_warmup_steps(training_args)  # a warmup ratio needs --max_steps: refused here, before any work
    _check_batching_flags(recipe, training_args, given)
    _check_best_model_flags(recipe, training_args, given)
    check_alignment_flags(recipe, training_args, given)
    if training_args.resume_from_checkpoint in ("True", "true", "last"):
        if not Path(training_args.output_dir).is_dir():
            raise ValueError(f"--resume_from_checkpoint: --output_dir {training_args.output_dir} does not exist")
        training_args.resume_from_checkpoint = get_last_checkpoint(training_args.output_dir)
        if training_args.resume_from_checkpoint is None:
            raise ValueError(f"--resume_from_checkpoint: no checkpoint in {training_args.output_dir}")
    check_output_dir(recipe, training_args)


# Trainer flags that shape sentence batches: token batches (--max_tokens_per_batch > 0) decide the batches instead.
SENTENCE_BATCH_FLAGS = ("per_device_train_batch_size", "auto_find_batch_size", "train_sampling_strategy",
                        "dataloader_drop_last")  # fmt: skip


def _check_batching_flags(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, given: set[str]) -> None:
    if training_args.sortish_sampler:
        raise ValueError(
            "--sortish_sampler does nothing in transformers 5.x (Seq2SeqTrainer no longer reads it); batches of "
            "sentences of similar length are what --max_tokens_per_batch builds (the default)"
        )
    if recipe.max_tokens_per_batch and (ignored := [name for name in SENTENCE_BATCH_FLAGS if name in given]):
        raise ValueError(
            f"{', '.join('--' + name for name in ignored)}: these shape batches of sentences, but the training batches "
            f"are token batches (--max_tokens_per_batch {recipe.max_tokens_per_batch}, bucketed by length); give "
            "--max_tokens_per_batch 0 to batch by sentences, or leave them out"
        )
    if not training_args.remove_unused_columns:
        raise ValueError(
            "--remove_unused_columns false: the datasets keep each pair's raw target sentence (the BLEU reference), "
            "which the model does not take and the collator cannot batch; leave it at true"
        )
    if not training_args.predict_with_generate and (training_args.eval_strategy != "no" or training_args.do_predict):
        raise ValueError(
            "--predict_with_generate false: validation and test scores (BLEU, chrF) are computed on generated "
            "translations; leave it at true, or turn evaluation off (--eval_strategy no --do_predict false)"
        )
    if training_args.generation_config is not None:
        raise ValueError(
            "--generation_config: the decoding of `attn train` is set by --generation_num_beams, --length_penalty and "
            "--generation_max_length (one generation config for evaluation, the saved model and `attn push`)"
        )


def _check_best_model_flags(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, given: set[str]) -> None:
    """--load_best_model_at_end keeps the best checkpoint as the final model, as Trainer documents, instead of the
    average of the last ones; --early_stopping_patience needs the validation metric it watches."""
    if training_args.load_best_model_at_end:
        if "average_last_n" in given and recipe.average_last_n > 1:
            raise ValueError(
                f"--load_best_model_at_end keeps the best checkpoint as the final model, --average_last_n "
                f"{recipe.average_last_n} averages the last ones into it: give one of them"
            )
        recipe.average_last_n = 1
    if recipe.early_stopping_patience is not None:
        if recipe.early_stopping_patience < 1:
            raise ValueError(
                f"--early_stopping_patience must be a positive integer, got {recipe.early_stopping_patience}"
            )
        if training_args.eval_strategy == "no" or not training_args.do_eval:
            raise ValueError("--early_stopping_patience watches the validation metric: it needs --eval_strategy steps "
                             "(or epoch) and --do_eval true")  # fmt: skip
        if training_args.metric_for_best_model is None:
            raise ValueError("--early_stopping_patience: name the validation metric it watches with "
                             "--metric_for_best_model (bleu, chrf, ter, exact_match or loss)")  # fmt: skip
    metric = (training_args.metric_for_best_model or "").removeprefix("eval_")
    if metric == "ter" and "greater_is_better" not in given:
        # Trainer guesses the direction from the name (only a "loss" is lower-is-better); TER is an error rate
        training_args.greater_is_better = False


def check_output_dir(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """Refuse an --output_dir that holds checkpoints of another run: they would be averaged with this run's.

    The way out: --resume_from_checkpoint (continue that run), --overwrite_output_dir (delete them), another folder.
    """
    output_dir = Path(training_args.output_dir)
    resumed = training_args.resume_from_checkpoint
    if recipe.overwrite_output_dir and resumed:
        raise ValueError("--overwrite_output_dir deletes the checkpoints of --output_dir, --resume_from_checkpoint "
                         "continues from one: give one of them")  # fmt: skip
    existing = find_checkpoints(output_dir) if output_dir.is_dir() else []
    if not existing or recipe.overwrite_output_dir or not training_args.do_train:
        return
    names = ", ".join(path.name for path in existing)
    if not resumed:
        raise ValueError(
            f"--output_dir {output_dir} holds checkpoints of an earlier run ({names}); they would be averaged with "
            "this run's. Continue that run with --resume_from_checkpoint last, delete them with "
            "--overwrite_output_dir, or choose another --output_dir"
        )
    resumed = Path(resumed)
    if resumed.resolve().parent != output_dir.resolve():
        raise ValueError(
            f"--resume_from_checkpoint {resumed} is not a checkpoint of --output_dir {output_dir}, which holds "
            f"checkpoints of another run ({names}); choose an empty --output_dir, or --overwrite_output_dir"
        )
    step = re.fullmatch(r"checkpoint-(\d+)", resumed.name)
    if step and (later := [path.name for path in existing if int(path.name.split("-")[1]) > int(step[1])]):
        raise ValueError(
            f"--resume_from_checkpoint {resumed}: --output_dir also holds later checkpoints ({', '.join(later)}) that "
            "this run would average with its own; resume from the last one (--resume_from_checkpoint last) or "
            "delete them"
        )


def _setup_logging(training_args: Seq2SeqTrainingArguments) -> None:
    level = training_args.get_process_log_level()
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler()],
    )
    # Our own summary lines (data, vocabulary, token batches and padding, learning rate) show on the main process.
    ours = min(level, logging.INFO) if training_args.should_log else level
    for name in ("modeling_attn",):
        logging.getLogger(name).setLevel(ours)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)


def _parse_overrides(text: str | None) -> dict:
    overrides = {}
    for item in filter(None, (text or "").split(",")):
        key, _, value = item.partition("=")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value
    return overrides


def build_tokenizer(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments,
                    parallel: ParallelData) -> PreTrainedTokenizerBase:  # fmt: skip
    """An existing tokenizer (given, of the fine-tuned model, or of the resumed checkpoint) or a new joint BPE."""
    existing = recipe.tokenizer_name_or_path or recipe.model_name_or_path
    resumed = training_args.resume_from_checkpoint
    if existing is None and resumed and (Path(resumed) / "tokenizer_config.json").is_file():
        existing = resumed
    if existing is not None:
        tokenizer = AutoTokenizer.from_pretrained(existing)
        asked = {"--lowercase": (recipe.lowercase, writes_lowercase), "--split_punctuation":
                 (recipe.split_punctuation, splits_punctuation)}  # fmt: skip
        if unmet := [flag for flag, (wanted, has) in asked.items() if wanted and not has(tokenizer)]:
            raise ValueError(
                f"{' and '.join(unmet)}: the reused tokenizer of {existing} does not do that (these flags shape a "
                "new BPE vocabulary); leave them out, or train a new vocabulary"
            )
        return tokenizer
    saved = Path(training_args.output_dir) / "tokenizer"
    with training_args.main_process_first(desc="training the BPE vocabulary"):
        if training_args.process_index == 0:  # the other processes load what the first one trained
            train, start = parallel.splits["train"], time.perf_counter()
            settings = {"vocab_size": recipe.vocab_size, "lowercase": recipe.lowercase,
                        "split_punctuation": recipe.split_punctuation}  # fmt: skip
            cached = bpe_cache_folder(train, settings)
            if cached is not None and (cached / "tokenizer.json").is_file():
                tokenizer = AutoTokenizer.from_pretrained(cached)
                logger.info(f"reusing the joint BPE vocabulary trained on the same data and settings: {cached}")
            else:
                tokenizer = train_bpe_tokenizer(iter_texts(train), **settings)
                logger.info(f"trained a joint BPE vocabulary of {len(tokenizer)} tokens in "
                            f"{time.perf_counter() - start:.1f} s")  # fmt: skip
                if cached is not None:
                    tokenizer.save_pretrained(cached)
            tokenizer.save_pretrained(saved)
            logger.info(f"tokenizer saved in {saved}")
        else:
            tokenizer = AutoTokenizer.from_pretrained(saved)
    return tokenizer


def build_model(recipe: RecipeArguments, tokenizer: PreTrainedTokenizerBase):
    """The model to fine-tune (`--model_name_or_path`), or a new one from `--preset` sized to the tokenizer."""
    if recipe.model_name_or_path is not None:
        return pretrained_model(recipe)
    preset = recipe.preset or MODEL_TYPES[recipe.model_type or next(iter(MODEL_TYPES))].default_preset
    overrides = _parse_overrides(recipe.config_overrides)
    fields = {field.name for field in dataclasses.fields(MODEL_TYPES[load_preset(preset).model_type].config_class)}
    if unknown := sorted(set(overrides) - fields):
        raise ValueError(f"--config_overrides: {unknown} are not fields of the {preset!r} preset's config")
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
    config = load_preset(
        preset,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=start,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=start,
        **overrides,
    )
    if recipe.model_type is not None and config.model_type != recipe.model_type:
        raise ValueError(f"preset {preset!r} is a {config.model_type} model but --model_type is {recipe.model_type}")
    return AutoModelForSeq2SeqLM.from_config(config)


def pretrained_model(recipe: RecipeArguments):
    """The model of `--model_name_or_path`, its config changed by `--config_overrides` (dropout, say); `--preset` and
    a `--model_type` other than the model's are refused (they describe a new model)."""
    path = recipe.model_name_or_path
    if recipe.preset is not None:
        raise ValueError(
            f"--preset {recipe.preset} builds a new model, --model_name_or_path fine-tunes {path} with its own "
            "config: give one of them (--config_overrides changes the fine-tuned model's config)"
        )
    config = AutoConfig.from_pretrained(path)
    if recipe.model_type is not None and config.model_type != recipe.model_type:
        raise ValueError(
            f"--model_type is {recipe.model_type}, but --model_name_or_path {path} is {config.model_type}"
        )
    overrides = _parse_overrides(recipe.config_overrides)
    fields = {field.name for field in dataclasses.fields(type(config))}
    if unknown := sorted(set(overrides) - fields):
        raise ValueError(f"--config_overrides: {unknown} are not fields of the config of {path} ({config.model_type})")
    return AutoModelForSeq2SeqLM.from_pretrained(path, **overrides)


def tokenize_splits(parallel: ParallelData, tokenizer: PreTrainedTokenizerBase, recipe: RecipeArguments):
    """Token ids of every split (columns input_ids, attention_mask, labels, and the raw `target` for BLEU)."""
    limits = {"input_ids": recipe.max_source_length, "labels": recipe.max_target_length}

    def encode(batch: dict) -> dict:
        encoded = tokenizer(batch["source"], text_target=batch["target"])
        truncated = [False] * len(batch["source"])
        for column, limit in limits.items():
            for row, ids in enumerate(encoded[column]):
                if len(ids) > limit:
                    encoded[column][row] = truncate(ids, limit)
                    truncated[row] = True
        encoded["attention_mask"] = [[1] * len(ids) for ids in encoded["input_ids"]]
        return {**encoded, "truncated": truncated}

    tokenized = datasets.DatasetDict()
    for split, table in parallel.splits.items():
        if isinstance(table, datasets.IterableDataset):  # --streaming: tokenized as the stream is read, uncounted
            ids = datasets.List(datasets.Value("int64"))
            features = datasets.Features({"target": datasets.Value("string"), "input_ids": ids, "labels": ids,
                                          "attention_mask": ids, "truncated": datasets.Value("bool")})  # fmt: skip
            streamed = table.map(encode, batched=True, remove_columns=["source"], features=features)
            tokenized[split] = streamed.remove_columns("truncated")
            continue
        table = table.map(
            encode,
            batched=True,
            remove_columns=["source"],
            num_proc=recipe.preprocessing_num_workers if len(table) > 1 else None,
            new_fingerprint=tokenized_fingerprint(table, tokenizer, limits),
            desc=f"tokenizing {split}",
        )
        if count := pc.sum(table.data.column("truncated")).as_py():  # Arrow, not a Python loop over the rows
            logger.warning(
                f"{split}: truncated {count} pair(s) to {recipe.max_source_length}/{recipe.max_target_length} tokens"
            )
        tokenized[split] = table.remove_columns("truncated")
    return tokenized


def decoding(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> dict:
    """The decoding the flags ask for, over the paper's (`paper_generation_config`): --generation_num_beams,
    --length_penalty, and --generation_max_length as a fixed output limit instead of the paper's source length + 50."""
    asked = {"num_beams": training_args.generation_num_beams, "length_penalty": recipe.length_penalty}
    if training_args.generation_max_length is not None:
        asked.update({SOURCE_LIMIT_FIELD: None, "max_length": training_args.generation_max_length})
    return asked


def _write_alignment_picture(trainer: TranslationTrainer, sentence: str, path: Path) -> None:
    """The demo's last step: the cross-attention of one test translation as a picture (needs matplotlib)."""
    if importlib.util.find_spec("matplotlib") is None:
        logger.info("matplotlib is not installed: no attention picture (pip install 'modeling-attn[plot]')")
        return
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        logger.info("FSDP/DeepSpeed: no attention picture (the model is sharded)")
        return
    from modeling_attn.api.heatmaps import plot_alignment
    from modeling_attn.api.translation import translate_batch

    model = trainer.model.eval()
    backend = model.config._attn_implementation
    if MODEL_TYPES[model.config.model_type].per_head_attention:
        model.set_attn_implementation("eager")  # the backend that returns attention weights
    try:
        (translation,), (attention,) = translate_batch(model, trainer.processing_class, [sentence], True)
    finally:
        model.set_attn_implementation(backend)
    plot_alignment(attention, path=path, title=f"{sentence} -> {translation}")
    logger.info(f"attention picture: {path}")


def _write_final_results(trainer: TranslationTrainer, test_dataset, parallel: ParallelData,
                         metrics_fn: TranslationMetrics, recipe: RecipeArguments, output_dir: Path) -> dict:  # fmt: skip
    raw_test = parallel.splits["test"]
    output = trainer.predict(test_dataset, metric_key_prefix="test")
    hypotheses = metrics_fn.last_hypotheses
    scores = translation_scores(hypotheses, list(raw_test["target"]), lowercase=metrics_fn.lowercase)
    # What the model card (`attn push`) reports with the scores: data, languages, decoding.
    results = {**output.metrics, "test_bleu_signature": scores["bleu_signature"],
               "test_chrf_signature": scores["chrf_signature"], "test_ter_signature": scores["ter_signature"],
               "data": local_or_hub(recipe.data) or EMBEDDED_TASK, "data_config": recipe.data_config, "split": "test", "source_lang": parallel.source_lang, "target_lang": parallel.target_lang,
               "sentences": len(hypotheses),
               "generation": decoding_settings(trainer.model.generation_config)}  # fmt: skip
    if trainer.is_world_process_zero():
        samples = [
            {"source": s, "reference": r, "hypothesis": h}
            for s, r, h in zip(raw_test["source"], raw_test["target"], hypotheses, strict=True)
        ][: recipe.num_samples_to_print]
        (output_dir / "test_results.json").write_text(json.dumps({**results, "samples": samples}, indent=2) + "\n")
        print("\nSample test translations:")
        for sample in samples:
            print(f"  {sample['source']}\n    -> {sample['hypothesis']}    (reference: {sample['reference']})")
        print(
            f"\nTest BLEU {results['test_bleu']:.2f}  chrF {results['test_chrf']:.2f}  "
            f"exact match {results['test_exact_match']:.1f}%  ({len(hypotheses)} sentences)\n"
            f"BLEU signature: {results['test_bleu_signature']}\nResults: {output_dir / 'test_results.json'}"
        )
        _write_alignment_picture(trainer, raw_test["source"][0], output_dir / "attention.png")
    return results


class HubSetupError(RuntimeError):
    """--push_to_hub, but the Hub repository cannot be created: refused before any work."""


def _clear_output_dir(output_dir: Path, training_args: Seq2SeqTrainingArguments) -> None:
    """--overwrite_output_dir: delete the checkpoints (and any staging folder) an earlier run left behind."""
    with training_args.main_process_first(desc="clearing --output_dir"):
        if training_args.process_index == 0:
            for checkpoint in find_checkpoints(output_dir) if output_dir.is_dir() else []:
                logger.warning(f"--overwrite_output_dir: deleting {checkpoint} of an earlier run")
                shutil.rmtree(checkpoint)
            shutil.rmtree(output_dir / STAGING_DIR, ignore_errors=True)


def run(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> int:
    """Train (and evaluate) with the flags `parse_args` returned."""
    # --push_to_hub: the files of `attn push` (code, card), not Trainer's raw folder: TranslationTrainer pushes the
    # checkpoints of --hub_strategy, and the final model is pushed after the test, with its scores in the card.
    push, training_args.push_to_hub = training_args.push_to_hub, False
    _setup_logging(training_args)
    output_dir = Path(training_args.output_dir)
    repo_id = training_args.hub_model_id or output_dir.name
    if push and training_args.process_index == 0:  # as Trainer's init_hf_repo: the repository exists before any work
        api = HfApi(token=training_args.hub_token)
        try:
            api.create_repo(repo_id, private=training_args.hub_private_repo, exist_ok=True)
            if training_args.hub_revision is not None:
                api.create_branch(repo_id, branch=training_args.hub_revision, exist_ok=True)
        except OSError as error:  # offline, not logged in, no such organisation: huggingface_hub's errors are OSErrors
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise HubSetupError(
                f"--push_to_hub: cannot create the Hub repository {repo_id} ({reason}); log in (`hf auth login`), "
                "or leave --push_to_hub out and run `attn push` later"
            ) from error
    if recipe.overwrite_output_dir and training_args.do_train:
        _clear_output_dir(output_dir, training_args)
    set_seed(training_args.seed)

    start = time.perf_counter()
    # The first process writes the Arrow cache; the others then open what it wrote.
    with training_args.main_process_first(desc="reading the data"):
        parallel = load_parallel_data(recipe.data, recipe.source_lang, recipe.target_lang, recipe.data_config,
                                      recipe.drop_empty_pairs, recipe.streaming)  # fmt: skip
    needed = (["train"] if training_args.do_train else []) + (
        ["validation"] if training_args.eval_strategy != "no" else []
    )
    require_splits(parallel, needed, recipe.data)
    limits = {
        "train": recipe.max_train_samples,
        "validation": recipe.max_eval_samples,
        "test": recipe.max_predict_samples,
    }
    for split, limit in limits.items():
        if limit is not None and split in parallel.splits:
            table = parallel.splits[split]
            parallel.splits[split] = (
                table.take(limit)
                if isinstance(table, datasets.IterableDataset)
                else table.select(range(min(limit, len(table))))
            )
    logger.info(
        f"data {recipe.data or 'embedded dates task'} ({parallel.source_lang} -> {parallel.target_lang}): "
        + ", ".join(f"{split} {len(table) if isinstance(table, datasets.Dataset) else 'streamed'} pairs"
                    for split, table in parallel.splits.items())
        + f"; read and checked in {time.perf_counter() - start:.1f} s"
    )  # fmt: skip

    tokenizer = build_tokenizer(recipe, training_args, parallel)
    model = build_model(recipe, tokenizer)
    start = time.perf_counter()
    with training_args.main_process_first(desc="tokenizing"):
        tokenized = tokenize_splits(parallel, tokenizer, recipe)
    prepared = [table for table in tokenized.values() if isinstance(table, datasets.Dataset)]
    logger.info(f"tokenized {sum(map(len, prepared))} pairs in {time.perf_counter() - start:.1f} s")

    if training_args.learning_rate is None:
        d_model = getattr(model.config, "d_model", None) or model.config.hidden_size
        training_args.learning_rate = paper_learning_rate(d_model, paper_warmup_steps(training_args))
    # One decoding for the validation during training, the test, every saved folder and `attn push`
    model.generation_config = paper_generation_config(model, decoding(recipe, training_args))
    logger.info(
        f"model {model.config.model_type}: {model.num_parameters() / 1e6:.2f}M parameters, "
        f"peak learning rate {training_args.learning_rate:.3g} (warmup {training_args.warmup_steps})"
    )

    train_dataset = tokenized["train"] if training_args.do_train else None
    if training_args.do_train and recipe.bpe_dropout:
        train_pairs = parallel.splits["train"]
        train_dataset = BPEDropoutPairs(train_pairs["source"], train_pairs["target"], tokenizer, recipe.bpe_dropout,
                                        recipe.max_source_length, recipe.max_target_length)  # fmt: skip
        growth = [sum(new) / sum(len(ids) for ids in tokenized["train"][column])
                  for new, column in zip(train_dataset.lengths(), ("input_ids", "labels"), strict=True)]  # fmt: skip
        logger.info(
            f"BPE-dropout {recipe.bpe_dropout}: the training set is segmented anew at each epoch; this segmentation "
            f"has {100 * (growth[0] - 1):.1f}% (source) / {100 * (growth[1] - 1):.1f}% (target) more tokens"
        )

    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    if recipe.alignment_file and training_args.do_train:  # guided alignment training (training/alignment.py)
        train_dataset, collator = guided_alignment(
            recipe, model, tokenizer, parallel.splits["train"], train_dataset, collator
        )
    metrics = TranslationMetrics(tokenizer)
    trainer = TranslationTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=tokenized.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=metrics,
        max_tokens_per_batch=recipe.max_tokens_per_batch or None,
        hub_repo_id=repo_id if push else None,
        streaming_buffer_pairs=recipe.streaming_buffer_pairs,
    )
    if recipe.early_stopping_patience is not None:
        trainer.add_callback(EarlyStoppingCallback(recipe.early_stopping_patience, recipe.early_stopping_threshold))

    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()
        if recipe.model_name_or_path and trainer.is_world_process_zero():  # the card's base_model (`attn push`)
            record_origin(output_dir, recipe.model_name_or_path, "fine-tuned from")
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
        trainer.save_state()
        if training_args.load_best_model_at_end:
            logger.info(f"final model: the best checkpoint, {trainer.state.best_model_checkpoint} (eval "
                        f"{training_args.metric_for_best_model} {trainer.state.best_metric})")  # fmt: skip
        checkpoints = find_checkpoints(output_dir)[-recipe.average_last_n :]
        if recipe.average_last_n > 1 and len(checkpoints) > 1:
            if trainer.is_world_process_zero():
                average_checkpoints(checkpoints, output_dir)
            trainer.accelerator.wait_for_everyone()
            if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
                logger.warning("FSDP/DeepSpeed: the test below uses the last weights; the averaged model is saved")
            else:
                trainer.model.load_state_dict(load_weights(output_dir), strict=False)
        if trainer.is_world_process_zero() and plot_history(
            trainer.state.log_history, output_dir / "training_curves.png"
        ):
            logger.info(f"training curves: {output_dir / 'training_curves.png'}")

    if training_args.do_predict:
        if "test" in parallel.splits:
            _write_final_results(trainer, tokenized["test"], parallel, metrics, recipe, output_dir)
        else:
            logger.warning(f"{recipe.data}: no test split, skipping the final test evaluation")
    elif training_args.do_eval and "validation" in tokenized:
        trainer.save_metrics("eval", trainer.evaluate())
    if push and trainer.is_world_process_zero():
        url = push_to_hub(output_dir, repo_id, training_args.hub_private_repo, training_args.hub_revision,
                          training_args.hub_token)  # fmt: skip
        logger.info(f"pushed {output_dir} to {url}")
    return 0


__all__ = ["PAPER_DEFAULTS", "RecipeArguments", "paper_learning_rate", "run", "validate"]
