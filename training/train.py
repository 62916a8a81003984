"""The paper's training recipe on Trainer as one run object, `TrainingRun`, whose steps each read only their flags.

`run` is what `attn train`, `python -m modeling_attn.training` and `accelerate launch -m modeling_attn.training`
call; torchtune's recipe classes are the model. The flags (`modeling_attn.training.arguments`) arrive checked, once,
by `modeling_attn.training.validate`, and no step changes them. The steps, in the order `run` calls them: `setup`
(logging, the Hub repository of --push_to_hub, --overwrite_output_dir, the seed), `load_data`, `build_tokenizer` (a
joint BPE vocabulary, or a reused tokenizer), `build_model` (a preset or --model_name_or_path, with the one decoding),
`tokenize`, `build_trainer_arguments` (the arguments Trainer gets, built once: the paper's learning rate, Eq. 3),
`build_training_set` (BPE-dropout, the token budget), `collate` (guided alignment), `build_trainer`, `train`,
`average` (the last --average_last_n checkpoints), `report` (the test: test_results.json, an attention picture),
`push` (the final model, its scores in the card), and `cleanup`. Each step reads the run's state (what the steps
before it built) and the flags it uses: docs/architecture.md has the table, tests/test_training_run.py keeps it true.
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
import torch
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
from transformers.utils.import_utils import enable_tf32

from modeling_attn.api.errors import FlagError
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

from .alignment import guided_alignment
from .arguments import RecipeArguments, paper_learning_rate, paper_warmup_steps
from .averaging import average_checkpoints, find_checkpoints, load_weights
from .batching import column_lengths
from .bpe_dropout import BPEDropoutPairs
from .data import ParallelData, load_parallel_data, require_splits
from .hub_push import CheckpointPush, create_hub_repo
from .metrics import TranslationMetrics
from .plot import plot_history
from .prepare import bpe_cache_folder, iter_texts, release_free_memory, tokenized_fingerprint
from .throughput import cpu_compile_warning, mfu_line
from .tokenizer import splits_punctuation, train_bpe_tokenizer, truncate
from .trainer import STAGING_DIR, TranslationTrainer
from .validate import check_hub_names, config_overrides, new_model_preset

logger = logging.getLogger("modeling_attn.training")


def run(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> int:
    """Train (and evaluate) with the flags `parse_args` returned and `validate` checked: the run's steps, in order.

    What the run writes into --output_dir is recorded there (at each checkpoint and at the end, also after an
    error), so that a later run tells it from files it did not write (`validate.check_output_dir`)."""
    training = TrainingRun(recipe, training_args)
    try:
        training.setup()
        training.load_data()
        training.build_tokenizer()
        training.build_model()
        training.tokenize()
        training.build_trainer_arguments()
        training.build_training_set()
        training.collate()
        training.build_trainer()
        training.train()
        training.average()
        training.report()
        training.push()
    finally:
        training.cleanup()
    return 0


class RecordWrites(TrainerCallback):
    """After each checkpoint save: record what the run has written into --output_dir (`record_written`)."""

    def __init__(self, output_dir: Path, started: int):
        self.output_dir, self.started = output_dir, started

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            record_written(self.output_dir, self.started)


class TrainingRun:
    """One `attn train` run: the checked flags, read and never changed, and what each step builds from them.

    `recipe` (our flags) and `args` (Trainer's, `Seq2SeqTrainingArguments`) are the flags as `validate` left them.
    Trainer gets its own copy of `args`, built once by `build_trainer_arguments`. The other attributes are the run's
    state, each set by one step and read by the steps after it. The process-group helpers of `args`
    (`main_process_first`, `process_index`) are read where a step needs them; they are not flags.
    """

    def __init__(self, recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments):
        self.recipe, self.args = recipe, training_args
        self.output_dir = Path(self.args.output_dir)
        self.started = _run_start(self.output_dir)
        self.repo_id: str | None = None  # setup: the Hub repository of --push_to_hub
        self.parallel: ParallelData | None = None  # load_data
        self.tokenizer: PreTrainedTokenizerBase | None = None  # build_tokenizer
        self.model: PreTrainedModel | None = None  # build_model
        self.tokenized: datasets.DatasetDict | None = None  # tokenize
        self.trainer_args: Seq2SeqTrainingArguments | None = None  # build_trainer_arguments
        self.threads_before: int | None = None  # setup: torch's threads before --threads
        self.speed_settings: dict | None = None  # build_trainer_arguments: what makes the training fast, as chosen
        self.train_dataset = None  # build_training_set; with guided alignment, collate
        self.collator = None  # collate
        self.trainer: TranslationTrainer | None = None  # build_trainer

    # -- 1. setup -----------------------------------------------------------------------------------------------

    def setup(self) -> None:
        """Logging, the Hub names the run reads answered for (`check_hub_names`), the Hub repository of --push_to_hub
        (created before any work; its id is `repo_id`), the checkpoints --overwrite_output_dir deletes, the seed,
        torch's threads (--threads), and TF32 matmuls under --tf32 (which `validate` may have chosen on a GPU:
        `resolve_cuda_fast_path`).

        With --push_to_hub the recipe pushes the files of `attn push` (code, card), not Trainer's raw folder: Trainer's
        own pushes are off (`build_trainer_arguments`), `CheckpointPush` pushes the checkpoints of --hub_strategy and
        `push` the final model after the test, with its scores in the card.
        """
        _setup_logging(self.args.get_process_log_level(), self.args.should_log)
        # a Hub id given with no Hub: one line now, not transformers' retries later
        check_hub_names(self.recipe.data, self.recipe.tokenizer_name_or_path, self.recipe.model_name_or_path)
        if self.args.push_to_hub:
            self.repo_id = self.args.hub_model_id or self.output_dir.name
            if self.args.process_index == 0:
                create_hub_repo(self.repo_id, self.args.hub_private_repo, self.args.hub_revision, self.args.hub_token)
        if self.recipe.overwrite_output_dir and self.args.do_train:
            self._clear_output_dir()
        set_seed(self.args.seed)
        self.threads_before = torch.get_num_threads()
        if self.recipe.threads:
            torch.set_num_threads(self.recipe.threads)  # for this run; `cleanup` restores the process's setting
        if self.args.tf32:
            enable_tf32(True)

    def _clear_output_dir(self) -> None:
        """--overwrite_output_dir: delete the checkpoints (and any staging folder) an earlier run left behind."""
        with self.args.main_process_first(desc="clearing --output_dir"):
            if self.args.process_index == 0:
                for checkpoint in find_checkpoints(self.output_dir) if self.output_dir.is_dir() else []:
                    logger.warning(f"--overwrite_output_dir: deleting {checkpoint} of an earlier run")
                    shutil.rmtree(checkpoint)
                shutil.rmtree(self.output_dir / STAGING_DIR, ignore_errors=True)

    # -- 2. data ------------------------------------------------------------------------------------------------

    def load_data(self) -> None:
        """The parallel data, read and checked, with the splits this run needs, each cut to its --max_*_samples."""
        start = time.perf_counter()
        # The first process writes the Arrow cache; the others then open what it wrote.
        with self.args.main_process_first(desc="reading the data"):
            parallel = load_parallel_data(
                self.recipe.data,
                self.recipe.source_lang,
                self.recipe.target_lang,
                self.recipe.data_config,
                self.recipe.drop_empty_pairs,
                self.recipe.streaming,
            )
        needed = ["train"] if self.args.do_train else []
        needed += ["validation"] if self.args.eval_strategy != "no" else []
        require_splits(parallel, needed, self.recipe.data)
        limits = {
            "train": self.recipe.max_train_samples,
            "validation": self.recipe.max_eval_samples,
            "test": self.recipe.max_predict_samples,
        }
        for split, limit in limits.items():
            if limit is not None and split in parallel.splits:
                parallel.splits[split] = _first(parallel.splits[split], limit)
        logger.info(
            f"data {self.recipe.data or 'embedded dates task'} ({parallel.source_lang} -> {parallel.target_lang}): "
            + ", ".join(
                f"{split} {len(table) if isinstance(table, datasets.Dataset) else 'streamed'} pairs"
                for split, table in parallel.splits.items()
            )
            + f"; read and checked in {time.perf_counter() - start:.1f} s"
        )
        self.parallel = parallel

    # -- 3. tokenizer -------------------------------------------------------------------------------------------

    def build_tokenizer(self) -> None:
        """An existing tokenizer (given, of the fine-tuned model, or of the resumed checkpoint) or a new joint BPE."""
        existing = self.recipe.tokenizer_name_or_path or self.recipe.model_name_or_path
        resumed = self.args.resume_from_checkpoint
        if existing is None and resumed and (Path(resumed) / "tokenizer_config.json").is_file():
            existing = resumed
        if existing is not None:
            self.tokenizer = _reused_tokenizer(existing, self.recipe.lowercase, self.recipe.split_punctuation)
            return
        settings = {
            "vocab_size": self.recipe.vocab_size,
            "lowercase": self.recipe.lowercase,
            "split_punctuation": self.recipe.split_punctuation,
        }
        saved = self.output_dir / "tokenizer"
        with self.args.main_process_first(desc="training the BPE vocabulary"):
            if self.args.process_index != 0:  # the other processes load what the first one trained
                self.tokenizer = AutoTokenizer.from_pretrained(saved)
                return
            self.tokenizer = _new_bpe_tokenizer(self.parallel.splits["train"], settings)
            release_free_memory()  # the BPE trainer's counts, freed but kept by the C heap
            self.tokenizer.save_pretrained(saved)
            logger.info(f"tokenizer saved in {saved}")

    # -- 4. model -----------------------------------------------------------------------------------------------

    def build_model(self) -> None:
        """The model to fine-tune (--model_name_or_path, its config changed by --config_overrides), or a new one from
        --preset sized to the tokenizer; with the one decoding of the validation during training, the test, every
        saved folder and `attn push`: the paper's (`paper_generation_config`) under --generation_num_beams,
        --length_penalty, and --generation_max_length as a fixed output limit instead of source length + 50."""
        overrides = config_overrides(self.recipe.config_overrides)
        if self.recipe.model_name_or_path is not None:
            model = _pretrained_model(self.recipe.model_name_or_path, self.recipe.model_type, overrides)
        else:
            preset = new_model_preset(self.recipe.preset, self.recipe.model_type)
            model = _new_model(preset, self.tokenizer, overrides)
        asked = {"num_beams": self.args.generation_num_beams, "length_penalty": self.recipe.length_penalty}
        if self.args.generation_max_length is not None:
            asked.update({SOURCE_LIMIT_FIELD: None, "max_length": self.args.generation_max_length})
        model.generation_config = paper_generation_config(model, asked)
        for field_name in ("source_lang", "target_lang"):  # read by `attn translate --document` (sentence rules)
            language = getattr(self.parallel, field_name, None)  # no data read: a model built alone
            if language not in (None, "src", "tgt"):  # "src"/"tgt": a TSV's columns, no language named
                setattr(model.config, field_name, language)
        self.model = model

    # -- 5. tokenized data, and the arguments Trainer gets ------------------------------------------------------

    def tokenize(self) -> None:
        """`tokenize_splits`, by the first process first (the others open what it cached)."""
        start = time.perf_counter()
        with self.args.main_process_first(desc="tokenizing"):
            tokenized = tokenize_splits(
                self.parallel,
                self.tokenizer,
                self.recipe.max_source_length,
                self.recipe.max_target_length,
                self.recipe.preprocessing_num_workers,
            )
        prepared = [table for table in tokenized.values() if isinstance(table, datasets.Dataset)]
        logger.info(f"tokenized {sum(map(len, prepared))} pairs in {time.perf_counter() - start:.1f} s")
        release_free_memory()
        self.tokenized = tokenized

    def build_trainer_arguments(self) -> None:
        """The `Seq2SeqTrainingArguments` Trainer gets, built once from the flags and never changed: the paper's
        peak learning rate for this model (Eq. 3) unless --learning_rate, and Trainer's own Hub pushes off (`setup`
        says why). The only step that reads `args` whole: every other flag of Trainer's goes to Trainer as given."""
        learning_rate = self.args.learning_rate
        if learning_rate is None:
            d_model = getattr(self.model.config, "d_model", None) or self.model.config.hidden_size
            learning_rate = paper_learning_rate(d_model, paper_warmup_steps(self.args))
        self.trainer_args = dataclasses.replace(self.args, learning_rate=learning_rate, push_to_hub=False)
        self.speed_settings = {
            "device": self.trainer_args.device.type,
            "mixed_precision": "bf16" if self.args.bf16 else "fp16" if self.args.fp16 else "no",
            "optim": str(getattr(self.args.optim, "value", self.args.optim)),
            "tf32": bool(self.args.tf32),
            "torch_compile": self.args.torch_compile,
            "cpu_threads": torch.get_num_threads(),  # --threads, or torch's own choice
        }
        logger.info(
            f"model {self.model.config.model_type}: {self.model.num_parameters() / 1e6:.2f}M parameters, "
            f"peak learning rate {learning_rate:.3g} (warmup {self.args.warmup_steps}); training settings "
            + ", ".join(f"{key} {value}" for key, value in self.speed_settings.items())
        )
        if warning := cpu_compile_warning(self.speed_settings):
            logger.warning(warning)

    def build_training_set(self) -> None:
        """The tokenized training split, or with --bpe_dropout its pairs segmented anew at each epoch; None without
        --do_train. Its longest pair is checked against --max_tokens_per_batch here, where the lengths are known."""
        if not self.args.do_train:
            return
        train_dataset = self.tokenized["train"]
        if dropout := self.recipe.bpe_dropout:
            train_dataset = _bpe_dropout_pairs(
                self.parallel.splits["train"],
                self.tokenized["train"],
                self.tokenizer,
                dropout,
                self.recipe.max_source_length,
                self.recipe.max_target_length,
            )
        max_tokens = self.recipe.max_tokens_per_batch
        if max_tokens and not isinstance(train_dataset, datasets.IterableDataset):
            _check_token_budget(train_dataset, max_tokens)
        self.train_dataset = train_dataset

    # -- 6. train -----------------------------------------------------------------------------------------------

    def collate(self) -> None:
        """The collator of the batches; with --alignment_file, each training pair carries its word alignment and the
        collator pads it (guided alignment training, training/alignment.py)."""
        self.collator = DataCollatorForSeq2Seq(self.tokenizer, model=self.model)
        if self.recipe.alignment_file and self.args.do_train:
            self.train_dataset, self.collator = guided_alignment(
                self.model,
                self.tokenizer,
                self.parallel.splits["train"],
                self.train_dataset,
                self.collator,
                alignment_file=self.recipe.alignment_file,
                words=self.recipe.alignment_words,
                weight=self.recipe.guided_alignment_weight,
                complete=self.recipe.max_train_samples is None,
            )

    def build_trainer(self) -> None:
        """`TranslationTrainer` with token batches, BLEU/chrF/TER as `compute_metrics`, and the callbacks the flags ask
        for: the checkpoint pushes of --hub_strategy (--push_to_hub) and --early_stopping_patience; and the record of
        what the run writes, at each checkpoint."""
        callbacks = [CheckpointPush(self.repo_id)] if self.repo_id is not None else []
        if (patience := self.recipe.early_stopping_patience) is not None:
            callbacks.append(EarlyStoppingCallback(patience, self.recipe.early_stopping_threshold))
        self.trainer = TranslationTrainer(
            model=self.model,
            args=self.trainer_args,
            train_dataset=self.train_dataset,
            eval_dataset=self.tokenized.get("validation"),
            processing_class=self.tokenizer,
            data_collator=self.collator,
            compute_metrics=TranslationMetrics(self.tokenizer),
            callbacks=[*callbacks, RecordWrites(self.output_dir, self.started)],
            max_tokens_per_batch=self.recipe.max_tokens_per_batch or None,
            streaming_buffer_pairs=self.recipe.streaming_buffer_pairs,
            rdrop_alpha=self.recipe.rdrop_alpha,
        )

    def how_to_go_on(self, step: int) -> str:
        """What to do after the run stopped at `step` (Ctrl-C): rerun it, or resume from its last checkpoint."""
        checkpoints = find_checkpoints(self.output_dir)
        if not checkpoints:
            return f"at step {step}, before the first checkpoint: no checkpoint was written; rerun the same command"
        return (
            f"at step {step}; the last checkpoint is {checkpoints[-1]}: continue with the same command and "
            "--resume_from_checkpoint last"
        )

    def train(self) -> None:
        """--do_train: train (resuming --resume_from_checkpoint), save the model, its metrics and state, and the
        training curves."""
        if not self.args.do_train:
            return
        trainer = self.trainer
        try:
            result = trainer.train(resume_from_checkpoint=self.args.resume_from_checkpoint)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(self.how_to_go_on(trainer.state.global_step)) from None
        try:
            trainer.save_model()
        except Exception as error:
            if not is_disk_full(error, self.output_dir):
                raise
            raise trainer.disk_full("the final model", self.output_dir) from error
        if (base := self.recipe.model_name_or_path) and trainer.is_world_process_zero():  # the card's base_model
            record_origin(self.output_dir, base, "fine-tuned from")
        metrics = {**result.metrics, **{f"train_{key}": value for key, value in self.speed_settings.items()}}
        # printed as true/false: Trainer's table formats a bool as the integer it also is
        trainer.log_metrics(
            "train", {key: str(value).lower() if isinstance(value, bool) else value for key, value in metrics.items()}
        )
        trainer.save_metrics("train", metrics)
        if trainer.is_world_process_zero() and (
            line := mfu_line(trainer.state.total_flos, metrics["train_runtime"], self.args.world_size)
        ):
            logger.info(line)
        trainer.save_state()
        if self.args.load_best_model_at_end:
            logger.info(
                f"final model: the best checkpoint, {trainer.state.best_model_checkpoint} (eval "
                f"{self.args.metric_for_best_model} {trainer.state.best_metric})"
            )
        curves = self.output_dir / "training_curves.png"
        if trainer.is_world_process_zero() and plot_history(trainer.state.log_history, curves):
            logger.info(f"training curves: {curves}")

    # -- 7. average ---------------------------------------------------------------------------------------------

    def average(self) -> None:
        """--do_train: the final model is the average of the last --average_last_n checkpoints (paper, Sec. 6.1),
        saved into --output_dir and loaded for the test (under FSDP/DeepSpeed the test uses the last weights)."""
        last_n = self.recipe.average_last_n
        if not self.args.do_train or last_n <= 1:
            return
        checkpoints = find_checkpoints(self.output_dir)[-last_n:]
        if len(checkpoints) <= 1:
            return
        trainer = self.trainer
        if trainer.is_world_process_zero():
            average_checkpoints(checkpoints, self.output_dir)
        trainer.accelerator.wait_for_everyone()
        if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
            logger.warning("FSDP/DeepSpeed: the test below uses the last weights; the averaged model is saved")
        else:
            trainer.model.load_state_dict(load_weights(self.output_dir), strict=False)

    # -- 8. report, push and cleanup ----------------------------------------------------------------------------

    def report(self) -> None:
        """--do_predict: the test set translated and scored (test_results.json, samples printed, an attention
        picture); else --do_eval: the validation scores (eval_results.json)."""
        if self.args.do_predict:
            if "test" not in self.parallel.splits:
                logger.warning(f"{self.recipe.data}: no test split, skipping the final test evaluation")
                return
            origin = {"data": local_or_hub(self.recipe.data) or EMBEDDED_TASK, "data_config": self.recipe.data_config}
            self._write_test_results(origin, self.recipe.num_samples_to_print)
        elif self.args.do_eval and "validation" in self.tokenized:
            self.trainer.save_metrics("eval", self.trainer.evaluate())

    def _write_test_results(self, origin: dict, num_samples: int) -> None:
        """The test set translated and scored: test_results.json with what the card reports (the scores, `origin`:
        the data, and the decoding), and `num_samples` of them printed."""
        trainer, raw_test, metrics_fn = self.trainer, self.parallel.splits["test"], self.trainer.compute_metrics
        output = trainer.predict(self.tokenized["test"], metric_key_prefix="test")
        hypotheses = metrics_fn.last_hypotheses
        scores = translation_scores(hypotheses, list(raw_test["target"]), lowercase=metrics_fn.lowercase)
        results = {
            **output.metrics,
            "test_bleu_signature": scores["bleu_signature"],
            "test_chrf_signature": scores["chrf_signature"],
            "test_ter_signature": scores["ter_signature"],
            **origin,
            "split": "test",
            "source_lang": self.parallel.source_lang,
            "target_lang": self.parallel.target_lang,
            "sentences": len(hypotheses),
            "generation": decoding_settings(trainer.model.generation_config),
            "training_settings": self.speed_settings,
        }
        if not trainer.is_world_process_zero():
            return
        samples = [
            {"source": s, "reference": r, "hypothesis": h}
            for s, r, h in zip(raw_test["source"], raw_test["target"], hypotheses, strict=True)
        ][:num_samples]
        path = self.output_dir / "test_results.json"
        path.write_text(json.dumps({**results, "samples": samples}, indent=2) + "\n")
        print("\nSample test translations:")
        for sample in samples:
            print(f"  {sample['source']}\n    -> {sample['hypothesis']}    (reference: {sample['reference']})")
        print(
            f"\nTest BLEU {results['test_bleu']:.2f}  chrF {results['test_chrf']:.2f}  "
            f"exact match {results['test_exact_match']:.1f}%  ({len(hypotheses)} sentences)\n"
            f"BLEU signature: {results['test_bleu_signature']}\nResults: {path}"
        )
        _write_alignment_picture(trainer, raw_test["source"][0], self.output_dir / "attention.png")

    def push(self) -> None:
        """--push_to_hub: upload --output_dir with the files of `attn push`, its test scores in the card."""
        if self.repo_id is None or not self.trainer.is_world_process_zero():
            return
        output_dir = self.args.output_dir
        url = push_to_hub(
            output_dir, self.repo_id, self.args.hub_private_repo, self.args.hub_revision, self.args.hub_token
        )
        logger.info(f"pushed {output_dir} to {url}")

    def cleanup(self) -> None:
        """Record what the run wrote into --output_dir (`record_written`), also after an error; torch's threads as
        they were before --threads."""
        if self.args.process_index == 0:
            record_written(self.output_dir, self.started)
        if self.threads_before is not None:
            torch.set_num_threads(self.threads_before)


# -- what the steps call: values in, no flags read ------------------------------------------------------------------


def _run_start(output_dir: Path) -> int:
    """When this run began, as a file-system time: the mtime of the folder lock `attn train` holds, else now."""
    with contextlib.suppress(OSError):
        return (output_dir / LOCK).stat().st_mtime_ns
    return time.time_ns()


def _setup_logging(level: int, should_log: bool) -> None:
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler()],
    )
    # Our own summary lines (data, vocabulary, token batches and padding, learning rate) show on the main process.
    logging.getLogger("modeling_attn").setLevel(min(level, logging.INFO) if should_log else level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)


def _first(table: datasets.Dataset | datasets.IterableDataset, limit: int):
    """The first `limit` pairs of a split (--max_train_samples, --max_eval_samples, --max_predict_samples)."""
    if isinstance(table, datasets.IterableDataset):
        return table.take(limit)
    return table.select(range(min(limit, len(table))))


def _reused_tokenizer(existing: str, lowercase: bool, split_punctuation: bool) -> PreTrainedTokenizerBase:
    """The tokenizer of `existing`, which must do what --lowercase and --split_punctuation ask (checked here: they
    can be checked only against the loaded tokenizer)."""
    tokenizer = AutoTokenizer.from_pretrained(existing)
    asked = {
        "--lowercase": (lowercase, writes_lowercase),
        "--split_punctuation": (split_punctuation, splits_punctuation),
    }
    if unmet := [flag for flag, (wanted, has) in asked.items() if wanted and not has(tokenizer)]:
        raise FlagError(
            f"{' and '.join(unmet)}: the reused tokenizer of {existing} does not do that (these flags shape a "
            "new BPE vocabulary); leave them out, or train a new vocabulary"
        )
    return tokenizer


def _new_bpe_tokenizer(train: datasets.Dataset, settings: dict) -> PreTrainedTokenizerBase:
    """A joint BPE vocabulary of the training split (`settings`: vocab_size, lowercase, split_punctuation), or the
    one trained earlier on the same data and settings."""
    start = time.perf_counter()
    cached = bpe_cache_folder(train, settings)
    if cached is not None and (cached / "tokenizer.json").is_file():
        logger.info(f"reusing the joint BPE vocabulary trained on the same data and settings: {cached}")
        return AutoTokenizer.from_pretrained(cached)
    tokenizer = train_bpe_tokenizer(iter_texts(train), **settings)
    logger.info(f"trained a joint BPE vocabulary of {len(tokenizer)} tokens in {time.perf_counter() - start:.1f} s")
    if cached is not None:
        tokenizer.save_pretrained(cached)
    return tokenizer


def _new_model(preset: str, tokenizer: PreTrainedTokenizerBase, overrides: dict) -> PreTrainedModel:
    """A new model of `preset` with `overrides`, sized to the tokenizer and using its special tokens."""
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
    return AutoModelForSeq2SeqLM.from_config(config)


def _pretrained_model(path: str, model_type: str | None, overrides: dict) -> PreTrainedModel:
    """The model of --model_name_or_path `path`, its config changed by --config_overrides. Its config is checked
    here against --model_type and the overrides' fields: only the loaded config can say."""
    config = AutoConfig.from_pretrained(path)
    if model_type is not None and config.model_type != model_type:
        raise FlagError(f"--model_type is {model_type}, but --model_name_or_path {path} is {config.model_type}")
    if unknown := sorted(set(overrides) - {field.name for field in dataclasses.fields(type(config))}):
        raise FlagError(f"--config_overrides: {unknown} are not fields of the config of {path} ({config.model_type})")
    return AutoModelForSeq2SeqLM.from_pretrained(path, **overrides)


def tokenize_splits(
    parallel: ParallelData,
    tokenizer: PreTrainedTokenizerBase,
    max_source_length: int,
    max_target_length: int,
    num_proc: int | None = None,
) -> datasets.DatasetDict:
    """Token ids of every split (columns input_ids, attention_mask, labels, and the raw `target` for BLEU), each side
    cut to its --max_*_length (counted); `num_proc`: --preprocessing_num_workers."""
    limits = {"input_ids": max_source_length, "labels": max_target_length}

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
            num_proc=num_proc if len(table) > 1 else None,
            new_fingerprint=tokenized_fingerprint(table, tokenizer, limits),
            desc=f"tokenizing {split}",
        )
        if count := pc.sum(table.data.column("truncated")).as_py():  # Arrow, not a Python loop over the rows
            logger.warning(f"{split}: truncated {count} pair(s) to {max_source_length}/{max_target_length} tokens")
        tokenized[split] = table.remove_columns("truncated")
    return tokenized


def _bpe_dropout_pairs(
    train_pairs: datasets.Dataset,
    tokenized_train: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    dropout: float,
    max_source_length: int,
    max_target_length: int,
) -> BPEDropoutPairs:
    """The training pairs segmented anew at each epoch with BPE-dropout `dropout`, and how many more tokens this
    segmentation has than the plain one (logged)."""
    pairs = BPEDropoutPairs(
        train_pairs["source"], train_pairs["target"], tokenizer, dropout, max_source_length, max_target_length
    )
    growth = [
        sum(new) / sum(len(ids) for ids in tokenized_train[column])
        for new, column in zip(pairs.lengths(), ("input_ids", "labels"), strict=True)
    ]
    logger.info(
        f"BPE-dropout {dropout}: the training set is segmented anew at each epoch; this segmentation "
        f"has {100 * (growth[0] - 1):.1f}% (source) / {100 * (growth[1] - 1):.1f}% (target) more tokens"
    )
    return pairs


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
        raise FlagError(
            f"--max_tokens_per_batch {max_tokens} cannot hold training pair {longest} ({source_lengths[longest]} "
            f"source / {target_lengths[longest]} target tokens{', with every BPE merge skipped' if dropout else ''}); "
            "raise it, or lower --max_source_length / --max_target_length"
        )


def _write_alignment_picture(trainer: TranslationTrainer, sentence: str, path: Path) -> None:
    """The demo's last step: the cross-attention of one test translation as a picture (needs matplotlib)."""
    if importlib.util.find_spec("matplotlib") is None:
        logger.info("matplotlib is not installed: no attention picture (pip install 'modeling-attn[plot]')")
        return
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        logger.info("FSDP/DeepSpeed: no attention picture (the model is sharded)")
        return
    from modeling_attn.api.heatmaps import plot_alignment
    from modeling_attn.api.translation import eager_attention, translate_batch

    model = trainer.model.eval()
    with eager_attention(model):  # the backend that returns attention weights
        (translation,), (attention,) = translate_batch(model, trainer.processing_class, [sentence], True)
    plot_alignment(attention, path=path, title=f"{sentence} -> {translation}")
    logger.info(f"attention picture: {path}")


__all__ = ["TrainingRun", "run", "tokenize_splits"]
