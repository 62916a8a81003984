"""`attn train` / `python -m modeling_attn.training` / `accelerate launch -m modeling_attn.training`: the paper's
training recipe with Trainer, as named steps (`run` lists them; torchtune's recipes are the model):

1. `setup`: logging, the Hub repository of `--push_to_hub` (created before any work), `--overwrite_output_dir`, the
   seed;
2. `load_data`: the parallel data, read and checked (`modeling_attn.training.data`), cut to `--max_*_samples`;
3. `build_tokenizer`: a joint BPE vocabulary trained on it (`modeling_attn.training.tokenizer`), or a reused tokenizer;
4. `build_model`: a new model from a preset, or the model of `--model_name_or_path` to fine-tune;
5. `tokenize`: token ids of every split (cached, `modeling_attn.training.prepare`); `configure` sets the paper's
   learning rate (Eq. 3) and the one decoding (`modeling_attn.api.hub.paper_generation_config`: validation, test,
   saved and pushed models); `training_set` is the tokenized training split, or its BPE-dropout pairs;
6. `train`: `TranslationTrainer` (transformers' `Seq2SeqTrainer`), with the checkpoint pushes of `--hub_strategy`
   (`modeling_attn.training.hub_push.CheckpointPush`) and `--early_stopping_patience` as callbacks;
7. `average`: the last `--average_last_n` checkpoints averaged into the final model
   (`modeling_attn.training.averaging`);
8. `report`: the test set translated and scored, test_results.json and an attention picture written;
   `push_final_model` uploads the final model with `modeling_attn.api.hub.push_to_hub` (`--hub_model_id`, default
   the output folder's name; `--hub_private_repo`, `--hub_revision`, `--hub_token`), its scores in the card.

The flags (`modeling_attn.training.arguments`: the paper's recipe as defaults) are checked before `run`, once
(`modeling_attn.training.validate`); `--load_best_model_at_end` makes the best checkpoint the final model (no
averaging); `--early_stopping_patience` stops on the validation metric.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import shutil
import time
from pathlib import Path

import datasets
import numpy as np
import pyarrow.compute as pc
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)

from modeling_attn.api.hub import (
    EMBEDDED_TASK,
    decoding_settings,
    local_or_hub,
    paper_generation_config,
    push_to_hub,
    record_origin,
)
from modeling_attn.api.metrics import translation_scores, writes_lowercase
from modeling_attn.api.outputs import LOCK, is_disk_full, record_written
from modeling_attn.api.presets import load_preset
from modeling_attn.generation import SOURCE_LIMIT_FIELD
from modeling_attn.registry import MODEL_TYPES

from .alignment import guided_alignment
from .arguments import RecipeArguments, paper_learning_rate, paper_warmup_steps
from .averaging import average_checkpoints, find_checkpoints, load_weights
from .batching import column_lengths
from .bpe_dropout import BPEDropoutPairs
from .data import ParallelData, load_parallel_data, require_splits
from .hub_push import CheckpointPush, create_hub_repo
from .metrics import TranslationMetrics
from .plot import plot_history
from .prepare import bpe_cache_folder, iter_texts, tokenized_fingerprint
from .tokenizer import splits_punctuation, train_bpe_tokenizer, truncate
from .trainer import STAGING_DIR, TranslationTrainer
from .validate import config_overrides, new_model_preset

logger = logging.getLogger("modeling_attn.training")


def run(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> int:
    """Train (and evaluate) with the flags `parse_args` returned (`validate` has checked them): the recipe's steps.

    What the run writes into --output_dir is recorded there (at each checkpoint and at the end, also after an
    error), so that a later run tells it from files it did not write (`validate.check_output_dir`)."""
    output_dir, started = Path(training_args.output_dir), _run_start(training_args)
    try:
        return _run_steps(recipe, training_args, RecordWrites(output_dir, started))
    finally:
        if training_args.process_index == 0:
            record_written(output_dir, started)


def _run_start(training_args: Seq2SeqTrainingArguments) -> int:
    """When this run began, as a file-system time: the mtime of the folder lock `attn train` holds, else now."""
    with contextlib.suppress(OSError):
        return (Path(training_args.output_dir) / LOCK).stat().st_mtime_ns
    return time.time_ns()


class RecordWrites(TrainerCallback):
    """After each checkpoint save: record what the run has written into --output_dir (`record_written`)."""

    def __init__(self, output_dir: Path, started: int):
        self.output_dir, self.started = output_dir, started

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            record_written(self.output_dir, self.started)


def _run_steps(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, record: RecordWrites) -> int:
    repo_id = setup(recipe, training_args)
    parallel = load_data(recipe, training_args)
    tokenizer = build_tokenizer(recipe, training_args, parallel)
    model = build_model(recipe, tokenizer)
    tokenized = tokenize(parallel, tokenizer, recipe, training_args)
    configure(model, recipe, training_args)
    train_dataset = training_set(parallel, tokenized, tokenizer, recipe, training_args)
    train_dataset, collator = collate(parallel, model, tokenizer, train_dataset, recipe, training_args)
    trainer = build_trainer(
        model, tokenizer, train_dataset, tokenized.get("validation"), collator, recipe, training_args, repo_id
    )
    trainer.add_callback(record)
    if training_args.do_train:
        train(trainer, recipe, training_args)
        average(trainer, recipe, training_args)
    report(trainer, parallel, tokenized, recipe, training_args)
    if repo_id is not None:
        push_final_model(trainer, repo_id, training_args)
    return 0


# -- 1. setup ---------------------------------------------------------------------------------------------------


def setup(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> str | None:
    """Logging, the Hub repository of --push_to_hub (its id is returned; None without the flag), the checkpoints
    --overwrite_output_dir deletes, and the seed.

    With --push_to_hub the recipe pushes the files of `attn push` (code, card), not Trainer's raw folder: Trainer's
    own pushes are turned off, `CheckpointPush` pushes the checkpoints of --hub_strategy and `push_final_model` the
    final model after the test, with its scores in the card.
    """
    push, training_args.push_to_hub = training_args.push_to_hub, False
    _setup_logging(training_args)
    repo_id = (training_args.hub_model_id or Path(training_args.output_dir).name) if push else None
    if repo_id is not None and training_args.process_index == 0:
        create_hub_repo(repo_id, training_args)
    if recipe.overwrite_output_dir and training_args.do_train:
        _clear_output_dir(Path(training_args.output_dir), training_args)
    set_seed(training_args.seed)
    return repo_id


def _setup_logging(training_args: Seq2SeqTrainingArguments) -> None:
    level = training_args.get_process_log_level()
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler()],
    )
    # Our own summary lines (data, vocabulary, token batches and padding, learning rate) show on the main process.
    ours = min(level, logging.INFO) if training_args.should_log else level
    logging.getLogger("modeling_attn").setLevel(ours)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)


def _clear_output_dir(output_dir: Path, training_args: Seq2SeqTrainingArguments) -> None:
    """--overwrite_output_dir: delete the checkpoints (and any staging folder) an earlier run left behind."""
    with training_args.main_process_first(desc="clearing --output_dir"):
        if training_args.process_index == 0:
            for checkpoint in find_checkpoints(output_dir) if output_dir.is_dir() else []:
                logger.warning(f"--overwrite_output_dir: deleting {checkpoint} of an earlier run")
                shutil.rmtree(checkpoint)
            shutil.rmtree(output_dir / STAGING_DIR, ignore_errors=True)


# -- 2. data ----------------------------------------------------------------------------------------------------


def load_data(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> ParallelData:
    """The parallel data, read and checked, with the splits this run needs, each cut to its --max_*_samples."""
    start = time.perf_counter()
    # The first process writes the Arrow cache; the others then open what it wrote.
    with training_args.main_process_first(desc="reading the data"):
        parallel = load_parallel_data(
            recipe.data,
            recipe.source_lang,
            recipe.target_lang,
            recipe.data_config,
            recipe.drop_empty_pairs,
            recipe.streaming,
        )
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
        + ", ".join(
            f"{split} {len(table) if isinstance(table, datasets.Dataset) else 'streamed'} pairs"
            for split, table in parallel.splits.items()
        )
        + f"; read and checked in {time.perf_counter() - start:.1f} s"
    )
    return parallel


# -- 3. tokenizer -----------------------------------------------------------------------------------------------


def build_tokenizer(
    recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, parallel: ParallelData
) -> PreTrainedTokenizerBase:
    """An existing tokenizer (given, of the fine-tuned model, or of the resumed checkpoint) or a new joint BPE."""
    existing = recipe.tokenizer_name_or_path or recipe.model_name_or_path
    resumed = training_args.resume_from_checkpoint
    if existing is None and resumed and (Path(resumed) / "tokenizer_config.json").is_file():
        existing = resumed
    if existing is not None:
        return _reused_tokenizer(existing, recipe)
    saved = Path(training_args.output_dir) / "tokenizer"
    with training_args.main_process_first(desc="training the BPE vocabulary"):
        if training_args.process_index != 0:  # the other processes load what the first one trained
            return AutoTokenizer.from_pretrained(saved)
        tokenizer = _new_bpe_tokenizer(parallel.splits["train"], recipe)
        tokenizer.save_pretrained(saved)
        logger.info(f"tokenizer saved in {saved}")
    return tokenizer


def _reused_tokenizer(existing: str, recipe: RecipeArguments) -> PreTrainedTokenizerBase:
    """The tokenizer of `existing`, which must do what --lowercase and --split_punctuation ask (checked here: they
    can be checked only against the loaded tokenizer)."""
    tokenizer = AutoTokenizer.from_pretrained(existing)
    asked = {
        "--lowercase": (recipe.lowercase, writes_lowercase),
        "--split_punctuation": (recipe.split_punctuation, splits_punctuation),
    }
    if unmet := [flag for flag, (wanted, has) in asked.items() if wanted and not has(tokenizer)]:
        raise ValueError(
            f"{' and '.join(unmet)}: the reused tokenizer of {existing} does not do that (these flags shape a "
            "new BPE vocabulary); leave them out, or train a new vocabulary"
        )
    return tokenizer


def _new_bpe_tokenizer(train: datasets.Dataset, recipe: RecipeArguments) -> PreTrainedTokenizerBase:
    """A joint BPE vocabulary of the training split, or the one trained earlier on the same data and settings."""
    start = time.perf_counter()
    settings = {
        "vocab_size": recipe.vocab_size,
        "lowercase": recipe.lowercase,
        "split_punctuation": recipe.split_punctuation,
    }
    cached = bpe_cache_folder(train, settings)
    if cached is not None and (cached / "tokenizer.json").is_file():
        logger.info(f"reusing the joint BPE vocabulary trained on the same data and settings: {cached}")
        return AutoTokenizer.from_pretrained(cached)
    tokenizer = train_bpe_tokenizer(iter_texts(train), **settings)
    logger.info(f"trained a joint BPE vocabulary of {len(tokenizer)} tokens in {time.perf_counter() - start:.1f} s")
    if cached is not None:
        tokenizer.save_pretrained(cached)
    return tokenizer


# -- 4. model ---------------------------------------------------------------------------------------------------


def build_model(recipe: RecipeArguments, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The model to fine-tune (`--model_name_or_path`), or a new one from `--preset` (with `--config_overrides`) sized
    to the tokenizer."""
    if recipe.model_name_or_path is not None:
        return pretrained_model(recipe)
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
    config = load_preset(
        new_model_preset(recipe),
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=start,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=start,
        **config_overrides(recipe.config_overrides),
    )
    return AutoModelForSeq2SeqLM.from_config(config)


def pretrained_model(recipe: RecipeArguments) -> PreTrainedModel:
    """The model of `--model_name_or_path`, its config changed by `--config_overrides` (dropout, say). Its config is
    checked here against `--model_type` and the overrides' fields: only the loaded config can say."""
    path = recipe.model_name_or_path
    config = AutoConfig.from_pretrained(path)
    if recipe.model_type is not None and config.model_type != recipe.model_type:
        raise ValueError(
            f"--model_type is {recipe.model_type}, but --model_name_or_path {path} is {config.model_type}"
        )
    overrides = config_overrides(recipe.config_overrides)
    if unknown := sorted(set(overrides) - {field.name for field in dataclasses.fields(type(config))}):
        raise ValueError(f"--config_overrides: {unknown} are not fields of the config of {path} ({config.model_type})")
    return AutoModelForSeq2SeqLM.from_pretrained(path, **overrides)


# -- 5. tokenized data, the learning rate and the decoding ------------------------------------------------------


def tokenize(
    parallel: ParallelData,
    tokenizer: PreTrainedTokenizerBase,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
) -> datasets.DatasetDict:
    """`tokenize_splits`, by the first process first (the others open what it cached)."""
    start = time.perf_counter()
    with training_args.main_process_first(desc="tokenizing"):
        tokenized = tokenize_splits(parallel, tokenizer, recipe)
    prepared = [table for table in tokenized.values() if isinstance(table, datasets.Dataset)]
    logger.info(f"tokenized {sum(map(len, prepared))} pairs in {time.perf_counter() - start:.1f} s")
    return tokenized


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
            features = datasets.Features(
                {
                    "target": datasets.Value("string"),
                    "input_ids": ids,
                    "labels": ids,
                    "attention_mask": ids,
                    "truncated": datasets.Value("bool"),
                }
            )
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


def configure(model: PreTrainedModel, recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """The paper's peak learning rate for this model (Eq. 3; unless --learning_rate), and one decoding for the
    validation during training, the test, every saved folder and `attn push` (`decoding`)."""
    if training_args.learning_rate is None:
        d_model = getattr(model.config, "d_model", None) or model.config.hidden_size
        training_args.learning_rate = paper_learning_rate(d_model, paper_warmup_steps(training_args))
    model.generation_config = paper_generation_config(model, decoding(recipe, training_args))
    logger.info(
        f"model {model.config.model_type}: {model.num_parameters() / 1e6:.2f}M parameters, "
        f"peak learning rate {training_args.learning_rate:.3g} (warmup {training_args.warmup_steps})"
    )


def decoding(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> dict:
    """The decoding the flags ask for, over the paper's (`paper_generation_config`): --generation_num_beams,
    --length_penalty, and --generation_max_length as a fixed output limit instead of the paper's source length + 50."""
    asked = {"num_beams": training_args.generation_num_beams, "length_penalty": recipe.length_penalty}
    if training_args.generation_max_length is not None:
        asked.update({SOURCE_LIMIT_FIELD: None, "max_length": training_args.generation_max_length})
    return asked


def training_set(
    parallel: ParallelData,
    tokenized: datasets.DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
):
    """The tokenized training split, or with --bpe_dropout its pairs segmented anew at each epoch; None without
    --do_train. Its longest pair is checked against --max_tokens_per_batch here, where the lengths are known."""
    if not training_args.do_train:
        return None
    train_dataset = tokenized["train"]
    if recipe.bpe_dropout:
        train_pairs = parallel.splits["train"]
        train_dataset = BPEDropoutPairs(
            train_pairs["source"],
            train_pairs["target"],
            tokenizer,
            recipe.bpe_dropout,
            recipe.max_source_length,
            recipe.max_target_length,
        )
        growth = [
            sum(new) / sum(len(ids) for ids in tokenized["train"][column])
            for new, column in zip(train_dataset.lengths(), ("input_ids", "labels"), strict=True)
        ]
        logger.info(
            f"BPE-dropout {recipe.bpe_dropout}: the training set is segmented anew at each epoch; this segmentation "
            f"has {100 * (growth[0] - 1):.1f}% (source) / {100 * (growth[1] - 1):.1f}% (target) more tokens"
        )
    if recipe.max_tokens_per_batch and not isinstance(train_dataset, datasets.IterableDataset):
        _check_token_budget(train_dataset, recipe.max_tokens_per_batch)
    return train_dataset


def _check_token_budget(train_dataset, max_tokens: int) -> None:
    """--max_tokens_per_batch must hold the longest training pair (with --bpe_dropout, its longest segmentation:
    every merge skipped). A streamed pair is checked as it is read (`batching.StreamingTokenBatches`)."""
    dropout = isinstance(train_dataset, BPEDropoutPairs)
    if dropout:
        source_lengths, target_lengths = map(np.asarray, train_dataset.longest_lengths())
    else:  # numpy arrays read from the Arrow columns
        source_lengths = column_lengths(train_dataset, "input_ids")
        target_lengths = column_lengths(train_dataset, "labels")
    if not len(source_lengths):
        return
    longest = int(np.argmax(np.maximum(source_lengths, target_lengths)))
    if max(source_lengths[longest], target_lengths[longest]) > max_tokens:
        raise ValueError(
            f"--max_tokens_per_batch {max_tokens} cannot hold training pair {longest} ({source_lengths[longest]} "
            f"source / {target_lengths[longest]} target tokens{', with every BPE merge skipped' if dropout else ''}); "
            "raise it, or lower --max_source_length / --max_target_length"
        )


# -- 6. train ---------------------------------------------------------------------------------------------------


def collate(
    parallel: ParallelData,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_dataset,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
):
    """The training set and the collator of its batches; with --alignment_file, each training pair carries its word
    alignment and the collator pads it (guided alignment training, training/alignment.py)."""
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    if recipe.alignment_file and training_args.do_train:
        return guided_alignment(recipe, model, tokenizer, parallel.splits["train"], train_dataset, collator)
    return train_dataset, collator


def build_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_dataset,
    eval_dataset,
    collator,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
    repo_id: str | None,
) -> TranslationTrainer:
    """`TranslationTrainer` with token batches, BLEU/chrF/TER as `compute_metrics`, and the callbacks the flags ask
    for: the checkpoint pushes of --hub_strategy (`repo_id`: --push_to_hub) and --early_stopping_patience."""
    callbacks = [CheckpointPush(repo_id)] if repo_id is not None else []
    if recipe.early_stopping_patience is not None:
        callbacks.append(EarlyStoppingCallback(recipe.early_stopping_patience, recipe.early_stopping_threshold))
    return TranslationTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=TranslationMetrics(tokenizer),
        callbacks=callbacks,
        max_tokens_per_batch=recipe.max_tokens_per_batch or None,
        streaming_buffer_pairs=recipe.streaming_buffer_pairs,
    )


def train(trainer: TranslationTrainer, recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """Train (resuming --resume_from_checkpoint), save the model, its metrics and state, and the training curves."""
    output_dir = Path(training_args.output_dir)
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    try:
        trainer.save_model()
    except Exception as error:
        if not is_disk_full(error, output_dir):
            raise
        raise trainer.disk_full("the final model", output_dir) from error
    if recipe.model_name_or_path and trainer.is_world_process_zero():  # the card's base_model (`attn push`)
        record_origin(output_dir, recipe.model_name_or_path, "fine-tuned from")
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    if training_args.load_best_model_at_end:
        logger.info(
            f"final model: the best checkpoint, {trainer.state.best_model_checkpoint} (eval "
            f"{training_args.metric_for_best_model} {trainer.state.best_metric})"
        )
    if trainer.is_world_process_zero() and plot_history(trainer.state.log_history, output_dir / "training_curves.png"):
        logger.info(f"training curves: {output_dir / 'training_curves.png'}")


# -- 7. average -------------------------------------------------------------------------------------------------


def average(trainer: TranslationTrainer, recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """The final model: the average of the last --average_last_n checkpoints (paper, Sec. 6.1), saved into
    --output_dir and loaded for the test (under FSDP/DeepSpeed the test uses the last weights)."""
    output_dir = Path(training_args.output_dir)
    checkpoints = find_checkpoints(output_dir)[-recipe.average_last_n :]
    if recipe.average_last_n <= 1 or len(checkpoints) <= 1:
        return
    if trainer.is_world_process_zero():
        average_checkpoints(checkpoints, output_dir)
    trainer.accelerator.wait_for_everyone()
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        logger.warning("FSDP/DeepSpeed: the test below uses the last weights; the averaged model is saved")
    else:
        trainer.model.load_state_dict(load_weights(output_dir), strict=False)


# -- 8. report (and push) ---------------------------------------------------------------------------------------


def report(
    trainer: TranslationTrainer,
    parallel: ParallelData,
    tokenized: datasets.DatasetDict,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
) -> None:
    """--do_predict: the test set translated and scored (`test_results.json`, samples printed, an attention picture);
    else --do_eval: the validation scores (`eval_results.json`)."""
    if training_args.do_predict:
        if "test" in parallel.splits:
            _write_final_results(trainer, tokenized["test"], parallel, recipe, Path(training_args.output_dir))
        else:
            logger.warning(f"{recipe.data}: no test split, skipping the final test evaluation")
    elif training_args.do_eval and "validation" in tokenized:
        trainer.save_metrics("eval", trainer.evaluate())


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


def _write_final_results(
    trainer: TranslationTrainer, test_dataset, parallel: ParallelData, recipe: RecipeArguments, output_dir: Path
) -> dict:
    """The test set translated and scored: test_results.json with what the card reports, and samples printed."""
    raw_test, metrics_fn = parallel.splits["test"], trainer.compute_metrics
    output = trainer.predict(test_dataset, metric_key_prefix="test")
    hypotheses = metrics_fn.last_hypotheses
    scores = translation_scores(hypotheses, list(raw_test["target"]), lowercase=metrics_fn.lowercase)
    # What the model card (`attn push`) reports with the scores: data, languages, decoding.
    results = {
        **output.metrics,
        "test_bleu_signature": scores["bleu_signature"],
        "test_chrf_signature": scores["chrf_signature"],
        "test_ter_signature": scores["ter_signature"],
        "data": local_or_hub(recipe.data) or EMBEDDED_TASK,
        "data_config": recipe.data_config,
        "split": "test",
        "source_lang": parallel.source_lang,
        "target_lang": parallel.target_lang,
        "sentences": len(hypotheses),
        "generation": decoding_settings(trainer.model.generation_config),
    }
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


def push_final_model(trainer: TranslationTrainer, repo_id: str, training_args: Seq2SeqTrainingArguments) -> None:
    """--push_to_hub: upload --output_dir with the files of `attn push`, its test scores in the card."""
    if trainer.is_world_process_zero():
        url = push_to_hub(
            training_args.output_dir,
            repo_id,
            training_args.hub_private_repo,
            training_args.hub_revision,
            training_args.hub_token,
        )
        logger.info(f"pushed {training_args.output_dir} to {url}")


__all__ = ["build_model", "build_tokenizer", "run", "tokenize_splits"]
