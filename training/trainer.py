"""`TranslationTrainer`: transformers' `Seq2SeqTrainer` with token-budget batches and raw-text references.

Two changes, nothing else: the training batches come from `training.batching.TokenBatchSampler` when
`max_tokens_per_batch` is set (Accelerate shards them over processes as it shards any batch sampler), and BLEU is
computed against the raw target sentences of the dataset being evaluated, not against decoded labels.
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial

from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer
from transformers.trainer_utils import seed_worker

from .batching import TokenBatchSampler
from .metrics import TranslationMetrics

logger = logging.getLogger(__name__)


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with batches of at most `max_tokens_per_batch` padded source (and target) tokens per process.

    With `max_tokens_per_batch=None` the batches are Trainer's usual `per_device_train_batch_size` sentences.
    """

    def __init__(self, *args, max_tokens_per_batch: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens_per_batch = max_tokens_per_batch
        self.token_sampler: TokenBatchSampler | None = None

    def get_train_dataloader(self) -> DataLoader:
        if not self.max_tokens_per_batch:
            return super().get_train_dataloader()
        dataset = self._remove_unused_columns(self.train_dataset, description="Training")
        self.token_sampler = TokenBatchSampler(
            [len(ids) for ids in dataset["input_ids"]],
            [len(ids) for ids in dataset["labels"]],
            self.max_tokens_per_batch,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
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
