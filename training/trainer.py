"""`TranslationTrainer`: transformers' `Seq2SeqTrainer` with token-budget batches, raw-text references and
checkpoints that are never half-written.

Five changes, nothing else: the training batches come from `training.batching.TokenBatchSampler` when
`max_tokens_per_batch` is set (Accelerate shards them over processes as it shards any batch sampler; a
`training.bpe_dropout.BPEDropoutPairs` training set gets its `BPEDropoutBatchSampler`, one process only); BLEU is
computed against the raw target sentences of the dataset being evaluated, not against decoded labels; and a
checkpoint is written into a staging folder (`.checkpoint-staging/`) and renamed to `checkpoint-<step>` only once
complete. Trainer 5.23 writes weights, optimizer, scheduler, RNG and trainer state straight into `checkpoint-<step>`
and deletes old checkpoints with `shutil.rmtree`, so a job killed during a save or a rotation leaves a folder that
`get_last_checkpoint` (and `--resume_from_checkpoint last`) would pick and fail on. Here a `checkpoint-*` folder
appears whole (one `os.replace`) and disappears whole (renamed away before it is deleted). The guarantee is against
killed processes; the files are not fsync'ed, so a power cut can still lose what the OS had not yet written.
Last, a run resumed from the checkpoint of its final step trains no further step (Trainer 5.23 would train one).

And the training loss skips the logits of padding: with a model whose forward takes `label_smoothing` (ours), the
`label_smoothing_factor` is passed to the model's own loss at every call (the same loss as Trainer's
`LabelSmoother`, tests/test_padding_free.py; nothing is written into the model's config, so a saved checkpoint
trains later with whatever its next Trainer says), and training steps call the model with `skip_logits=True` when
it takes it, so the output projection runs on labelled positions only. Evaluation and prediction still get the
full logits.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import shutil
from functools import partial
from pathlib import Path

import datasets
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, seed_worker, sort_checkpoints

from .batching import TokenBatchSampler
from .bpe_dropout import BPEDropoutBatchSampler, BPEDropoutPairs
from .metrics import TranslationMetrics

logger = logging.getLogger(__name__)

# Where checkpoints are written before they are renamed into place; not matched by `checkpoint-*`.
STAGING_DIR = ".checkpoint-staging"


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with batches of at most `max_tokens_per_batch` padded source (and target) tokens per process.

    With `max_tokens_per_batch=None` the batches are Trainer's usual `per_device_train_batch_size` sentences.
    """

    def __init__(self, *args, max_tokens_per_batch: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens_per_batch = max_tokens_per_batch
        self.token_sampler: TokenBatchSampler | None = None
        self._staging_root: Path | None = None
        # looked up once here, not at every training step
        parameters = inspect.signature(self.model.forward).parameters
        self._takes_skip_logits = "skip_logits" in parameters
        self._label_smoothing = None  # passed at call time to a model that smooths its own loss
        if self.label_smoother is not None and "label_smoothing" in parameters:
            self._label_smoothing, self.label_smoother = self.label_smoother.epsilon, None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Trainer's, with `skip_logits=True` for a loss-only call of a model that takes it, and Trainer's
        `label_smoothing_factor` as the model's `label_smoothing`."""
        if self._label_smoothing is not None and "labels" in inputs:
            inputs = {**inputs, "label_smoothing": self._label_smoothing}
        if (
            not return_outputs
            and self.label_smoother is None
            and self.compute_loss_func is None
            and "labels" in inputs
            and self._takes_skip_logits
        ):
            inputs = {**inputs, "skip_logits": True}
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )

    def get_train_dataloader(self) -> DataLoader:
        if not self.max_tokens_per_batch:
            return super().get_train_dataloader()
        dataset = self.train_dataset
        if isinstance(dataset, datasets.Dataset):  # not `BPEDropoutPairs`, whose rows hold model inputs only
            dataset = self._remove_unused_columns(dataset, description="Training")
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        if isinstance(dataset, BPEDropoutPairs):
            if self.args.world_size > 1 or self.args.dataloader_num_workers > 0:
                raise ValueError(
                    "--bpe_dropout segments the training set anew in this process at each epoch: it needs one "
                    f"training process and --dataloader_num_workers 0 (got {self.args.world_size} processes and "
                    f"{self.args.dataloader_num_workers} workers)"
                )
            source_lengths, target_lengths = dataset.longest_lengths()  # what any epoch's segmentation may reach
        else:
            source_lengths = [len(ids) for ids in dataset["input_ids"]]
            target_lengths = [len(ids) for ids in dataset["labels"]]
        longest = max(range(len(source_lengths)), key=lambda i: max(source_lengths[i], target_lengths[i]), default=0)
        if source_lengths and max(source_lengths[longest], target_lengths[longest]) > self.max_tokens_per_batch:
            raise ValueError(
                f"--max_tokens_per_batch {self.max_tokens_per_batch} cannot hold training pair {longest} "
                f"({source_lengths[longest]} source / {target_lengths[longest]} target tokens"
                f"{', with every BPE merge skipped' if isinstance(dataset, BPEDropoutPairs) else ''}); raise it, or lower "
                "--max_source_length / --max_target_length"
            )
        if isinstance(dataset, BPEDropoutPairs):
            self.token_sampler = BPEDropoutBatchSampler(dataset, self.max_tokens_per_batch, seed=seed)
        else:
            self.token_sampler = TokenBatchSampler(
                source_lengths, target_lengths, self.max_tokens_per_batch, seed=seed
            )
        logger.info(
            f"token batches: {len(self.token_sampler)} batches of at most {self.max_tokens_per_batch} padded tokens "
            f"per side, padding {100 * self.token_sampler.padding_fraction:.1f}% of positions"
        )
        loader = DataLoader(
            dataset,
            batch_sampler=self.token_sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers,
            worker_init_fn=partial(
                seed_worker, num_workers=self.args.dataloader_num_workers, rank=self.args.process_index
            ),
        )
        return self.accelerator.prepare(loader)

    def _run_epoch(self, *args, **kwargs):
        # Trainer 5.23 checks max_steps only after an optimizer step, so a run resumed from the checkpoint of its last
        # step (a job killed after that save) would train one step more than the run that was never interrupted.
        if 0 < self.state.max_steps <= self.state.global_step:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def _get_output_dir(self, trial) -> str:
        staging_root = getattr(self, "_staging_root", None)  # set only while _save_checkpoint runs
        return str(staging_root) if staging_root is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        """Trainer's checkpoint, written into the staging folder and renamed to `checkpoint-<step>` when complete."""
        run_dir = Path(super()._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging_root = run_dir / STAGING_DIR
        staged, final = staging_root / name, run_dir / name
        if self.args.should_save:
            shutil.rmtree(staging_root, ignore_errors=True)  # what a killed save or rotation left behind
        self.accelerator.wait_for_everyone()
        self._staging_root = staging_root
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()  # every process has written its part (RNG states, shards)
        if self.state.best_model_checkpoint == str(staged):
            self.state.best_model_checkpoint = str(final)
            if self.args.should_save:
                self.state.save_to_json(str(staged / "trainer_state.json"))
        if self.args.should_save:
            if final.exists():  # the same step saved again: move the old one out of the way first
                os.replace(final, staging_root / f"replaced-{name}")
            os.replace(staged, final)
            self._rotate_checkpoints_atomically(run_dir, staging_root)
            shutil.rmtree(staging_root, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def _rotate_checkpoints_atomically(self, run_dir: Path, staging_root: Path) -> None:
        """Trainer's `rotate_checkpoints` (keep `save_total_limit`, the newest and the best), but each deleted folder
        is first renamed out of `checkpoint-*`, so a kill during the deletion leaves no partial checkpoint."""
        limit = self.args.save_total_limit
        if limit is None or limit <= 0:
            return
        checkpoints = sort_checkpoints(str(run_dir), PREFIX_CHECKPOINT_DIR, use_mtime=False)
        protected = {checkpoints[-1]} if checkpoints else set()
        if self.state.best_model_checkpoint is not None:
            protected.add(str(Path(self.state.best_model_checkpoint)))
        remaining, keep = len(checkpoints), max(limit, len(protected))
        for checkpoint in checkpoints:
            if remaining <= keep:
                break
            if checkpoint not in protected:
                doomed = staging_root / f"deleted-{Path(checkpoint).name}"
                os.replace(checkpoint, doomed)
                shutil.rmtree(doomed, ignore_errors=True)
                remaining -= 1

    @contextlib.contextmanager
    def _references_of(self, dataset):
        """Give `compute_metrics` the raw target sentences of `dataset` while it is evaluated."""
        metrics = self.compute_metrics
        if not isinstance(metrics, TranslationMetrics) or not hasattr(dataset, "column_names"):
            yield
            return
        metrics.references = list(dataset["target"]) if "target" in dataset.column_names else None
        try:
            yield
        finally:
            metrics.references = None

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", **gen_kwargs):
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(dataset, dict):  # Trainer calls evaluate once per named dataset
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)
        with self._references_of(dataset):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test", **gen_kwargs):
        with self._references_of(test_dataset):
            return super().predict(test_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)
