"""`TranslationTrainer`: transformers' `Seq2SeqTrainer` with token batches, raw-text references, whole checkpoints.

The changes, nothing else (docs/training.md, "The recipe's modules in detail", explains each):
- the training batches come from `modeling_attn.training.batching.TokenBatchSampler` when `max_tokens_per_batch` is
  set (a BPE-dropout training set gets its `BPEDropoutBatchSampler`; a streamed one, batches packed from a buffer);
- BLEU is computed against the raw target sentences of the dataset being evaluated, not against decoded labels;
- a checkpoint is written into a staging folder (`.checkpoint-staging/`) and renamed to `checkpoint-<step>` only once
  complete, and a full disk during a save is named (`disk_full`);
- a run resumed from the checkpoint of its final step trains no further step; the end-of-training throughput counts
  the sentences and target tokens the steps consumed;
- the training loss skips the logits of padding: `label_smoothing_factor` goes to the model's own loss as
  `smoothing`, and training steps pass `skip_logits=True`; with `rdrop_alpha`, R-Drop (`_rdrop_loss`);
- under FSDP2, the tied embedding held by one module, and models saved under their own class;
- `total_flos` counted by the model's own `floating_point_ops` (ours: the FLOPs of the real tokens).
The trainer checks no flags (`modeling_attn.training.validate` does, before any work) and pushes nothing to the Hub
(`modeling_attn.training.hub_push.CheckpointPush`, a callback, does).
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
import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer
from transformers.trainer_pt_utils import LabelSmoother
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, seed_worker, sort_checkpoints

from modeling_attn.api.outputs import OutputError, is_disk_full
from modeling_attn.loss import consistency_loss, fuses_output_loss, labelled_consistency_loss

from .averaging import find_checkpoints
from .batching import StreamingTokenBatches, TokenBatchSampler, column_lengths
from .bpe_dropout import BPEDropoutBatchSampler, BPEDropoutPairs
from .metrics import TranslationMetrics

logger = logging.getLogger(__name__)

# Where checkpoints are written before they are renamed into place; not matched by `checkpoint-*`.
STAGING_DIR = ".checkpoint-staging"


def _one_module_per_tied_embedding(model) -> None:
    """Let one registered module hold the tied source/target embedding; the other places reach it as plain attributes.

    FSDP2 (torch >= 2.13) refuses a parameter held by modules of two FSDP units. Accelerate puts
    `get_input_embeddings()` and `get_output_embeddings()` in one unit, but our models tie the embedding of `shared`,
    `encoder.embed_tokens` and `decoder.embed_tokens` as separate modules, and the others would fall into the root
    unit. Registering one module under three names instead is not enough: torch's distributed state dict then saves
    three keys but loads only the first, so resuming fails. The state dict keeps `model.shared.weight` (the key
    `save_pretrained` writes anyway); `from_pretrained` ties the others to it.
    """
    weight = model.get_input_embeddings().weight
    holders = [
        (name, module)
        for name, module in model.named_modules(remove_duplicate=False)
        if isinstance(module, nn.Embedding) and module.weight is weight
    ]
    owner = holders[0][1]
    for name, _ in holders[1:]:
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        delattr(parent, attribute)
        parent.__dict__[attribute] = owner  # found before nn.Module.__getattr__ is asked, so not a child module


def _class_before_fully_shard(cls: type) -> type | None:
    """The model class that FSDP2's `fully_shard` subclassed into `cls`, or None when `cls` is not such a class."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return None
    if not issubclass(cls, FSDPModule):
        return None
    return next(base for base in cls.__bases__ if not issubclass(base, FSDPModule))


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with batches of at most `max_tokens_per_batch` padded source (and target) tokens per process.

    With `max_tokens_per_batch=None` the batches are Trainer's usual `per_device_train_batch_size` sentences.
    """

    def __init__(
        self,
        *args,
        max_tokens_per_batch: int | None = None,
        streaming_buffer_pairs: int = 100_000,
        rdrop_alpha: float = 0.0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.max_tokens_per_batch, self.streaming_buffer_pairs = max_tokens_per_batch, streaming_buffer_pairs
        self.rdrop_alpha = rdrop_alpha
        self._rdrop_parts: list[torch.Tensor] = []  # (cross-entropy, KL) of each R-Drop step since the last log
        self.token_sampler: TokenBatchSampler | None = None
        self._staging_root: Path | None = None
        self._consumed: dict | None = None  # sentences and target tokens of the training steps; set by `train`
        # looked up once here, not at every training step
        parameters = inspect.signature(self.model.forward).parameters
        self._takes_skip_logits = "skip_logits" in parameters
        self._takes_skip_output_layer = "skip_output_layer" in parameters and hasattr(self.model, "output_layer")
        self._label_smoothing = None  # passed at call time to a model that smooths its own loss
        if self.label_smoother is not None and "smoothing" in parameters:
            self._label_smoothing, self.label_smoother = self.label_smoother.epsilon, None
        if self.is_fsdp_enabled:
            _one_module_per_tied_embedding(self.model)

    def _issue_warnings_after_load(self, load_result) -> None:
        """Trainer's warning of missing keys after resuming, without the tied matrices: a checkpoint stores a tied
        matrix once (safetensors keeps no aliases), so its other names (`lm_head.weight`, the decoder's embeddings) are
        never in the file, and are not missing. Keys missing for real are still warned of."""
        names_by_tensor: dict[int, set[str]] = {}
        for name, parameter in self.model.named_parameters(remove_duplicate=False):
            names_by_tensor.setdefault(id(parameter), set()).add(name)
        missing = set(load_result.missing_keys)
        tied = {name for names in names_by_tensor.values() if names - missing for name in names & missing}
        if tied:
            self.model.tie_weights()
        load_result = load_result._replace(missing_keys=[key for key in load_result.missing_keys if key not in tied])
        super()._issue_warnings_after_load(load_result)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Trainer's, with `skip_logits=True` for a loss-only call of a model that takes it, and Trainer's
        `label_smoothing_factor` as the model's `smoothing`."""
        if self._label_smoothing is not None and "labels" in inputs:
            inputs = {**inputs, "smoothing": self._label_smoothing}
        if self.rdrop_alpha and model.training and "labels" in inputs:
            return self._rdrop_loss(model, inputs, return_outputs, num_items_in_batch)
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

    def _rdrop_loss(self, model, inputs, return_outputs, num_items_in_batch):
        """R-Drop (Liang et al. 2021): the batch twice in one forward pass (each copy gets its own dropout masks), the
        model's label-smoothed loss over both copies plus `rdrop_alpha` x `loss.consistency_loss` of the two copies'
        token distributions; the parts are logged as `rdrop_cross_entropy` and `rdrop_kl` (`log`). Where the fused
        loss applies (`_fused_output_layer`), the model returns its decoder's output and
        `loss.labelled_consistency_loss` computes both parts at the labelled positions without the logits (about
        the cost of two plain steps); elsewhere they come from the full logits of the doubled batch."""
        doubled = {
            key: torch.cat([value, value]) if torch.is_tensor(value) else value for key, value in inputs.items()
        }
        output_layer = None if return_outputs else self._fused_output_layer(model, inputs)
        if output_layer is not None:
            outputs = model(**doubled, skip_output_layer=True)
            loss, cross_entropy, divergence = labelled_consistency_loss(
                outputs.last_hidden_state,
                inputs["labels"],
                *output_layer,
                num_items_in_batch,
                inputs.get("smoothing", 0.0),
                self.rdrop_alpha,
            )
        else:
            twice = None if num_items_in_batch is None else 2 * num_items_in_batch
            cross_entropy, outputs = super().compute_loss(
                model, doubled, return_outputs=True, num_items_in_batch=twice
            )
            first, second = outputs.logits.chunk(2)
            divergence = consistency_loss(first, second, inputs["labels"], num_items_in_batch)
            divergence = divergence * self._token_average_scale(num_items_in_batch)  # as Trainer scaled the CE
            loss = cross_entropy + self.rdrop_alpha * divergence
        self._rdrop_parts.append(torch.stack([cross_entropy.detach(), divergence.detach()]))
        return (loss, outputs) if return_outputs else loss

    def _token_average_scale(self, num_items_in_batch) -> int:
        """The factor Trainer's `compute_loss` multiplies a loss divided by the token count of all processes with
        (`average_tokens_across_devices`: the processes' gradients are then averaged), 1 where it does not."""
        if not (
            self.args.average_tokens_across_devices
            and (self.model_accepts_loss_kwargs or self.compute_loss_func)
            and num_items_in_batch is not None
        ):
            return 1
        tensor_parallel = getattr(self, "get_tp_size", lambda: 1)()  # transformers 5.4 has no tensor parallel size
        return self.accelerator.num_processes // tensor_parallel if self.args.n_gpu <= 1 else self.args.n_gpu

    def _fused_output_layer(self, model, inputs) -> tuple[nn.Module, torch.Tensor | None] | None:
        """The model's output layer and logits bias when R-Drop's loss may be computed outside the model's forward,
        fused (`loss.fuses_output_loss`: the CPU, no autocast, a plain layer), else None: the model must be our own
        and bare (no DDP or compile wrapper, no sharding: they expect every use of a weight inside forward), with
        its own loss (no Trainer label smoother or loss function), and no guided alignment (the model's loss)."""
        if (
            not self._takes_skip_output_layer
            or self.label_smoother is not None
            or self.compute_loss_func is not None
            or "alignment" in inputs
            or self.is_fsdp_enabled
            or self.is_deepspeed_enabled
            or model is not self.accelerator.unwrap_model(model)
        ):
            return None
        output_layer, bias = model.output_layer()
        # the weight stands in for the decoder's output: it is on the same device (offloading hooks are refused)
        return (output_layer, bias) if fuses_output_loss(output_layer, output_layer.weight) else None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Seq2SeqTrainer's, with the evaluation loss label-smoothed as the training loss is. Its generating branch
        calls the model itself, not `compute_loss`, and smooths only through Trainer's `LabelSmoother` (the same
        loss as the model's own), which is back in place for that call; the other branch goes through
        `compute_loss`, which passes `smoothing` to the model."""
        generating = self.args.predict_with_generate and not prediction_loss_only  # Seq2SeqTrainer's own test
        if self._label_smoothing is None or not generating:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        self.label_smoother = LabelSmoother(epsilon=self._label_smoothing)
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            self.label_smoother = None

    def train(self, *args, **kwargs):
        """Trainer's, counting the sentences and target tokens the training steps consume (see `log`)."""
        self._consumed = {"sentences": 0, "target_tokens": 0}
        return super().train(*args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        labels = inputs.get("labels")
        if labels is not None and self._consumed is not None:
            self._consumed["sentences"] += labels.shape[0]
            # a tensor on the batch's device: no host sync at each step (label padding is -100)
            self._consumed["target_tokens"] = self._consumed["target_tokens"] + (labels != -100).sum()
        return super().training_step(model, inputs, num_items_in_batch)

    def floating_point_ops(self, inputs: dict) -> float:
        """The model's own count (ours: the project's formula on real tokens, `modeling_attn.flops`), which Trainer's
        documentation promises but its code skips for the generic 6 x weights x padded `input_ids` positions."""
        model = self.accelerator.unwrap_model(self.model)
        if hasattr(model, "floating_point_ops"):
            return model.floating_point_ops(inputs)
        return super().floating_point_ops(inputs)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Trainer's, with the end-of-training throughput counted from the batches consumed.

        Trainer counts `per_device_train_batch_size` sentences per batch, which token batches do not have: here
        `train_samples` / `train_samples_per_second` are the sentences the training steps of this call consumed (all
        processes), `train_target_tokens` / `train_target_tokens_per_second` their target tokens (end token included,
        padding excluded). Every process calls `log` at the end of training, so the sum over processes is collective.
        """
        if "loss" in logs and self._rdrop_parts:  # the means since the last log (logged with the training loss)
            cross_entropy, divergence = torch.stack(self._rdrop_parts).mean(dim=0).tolist()
            logs.update(rdrop_cross_entropy=round(cross_entropy, 4), rdrop_kl=round(divergence, 4))
            self._rdrop_parts = []
        if "train_runtime" in logs and self._consumed is not None:
            counts = torch.tensor(
                [self._consumed["sentences"], int(self._consumed["target_tokens"])], device=self.args.device
            )
            sentences, tokens = (int(value) for value in self.accelerator.reduce(counts, reduction="sum"))
            runtime = logs["train_runtime"]
            logs.update(
                train_samples=sentences,
                train_samples_per_second=round(sentences / runtime, 3),
                train_target_tokens=tokens,
                train_target_tokens_per_second=round(tokens / runtime, 3),
            )
        super().log(logs, start_time)

    def get_train_dataloader(self) -> DataLoader:
        if not self.max_tokens_per_batch:
            return super().get_train_dataloader()
        if isinstance(self.train_dataset, datasets.IterableDataset):
            return self._streaming_train_dataloader()
        dataset = self.train_dataset
        if isinstance(dataset, datasets.Dataset):  # not `BPEDropoutPairs`, whose rows hold model inputs only
            dataset = self._remove_unused_columns(dataset, description="Training")
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        if isinstance(dataset, BPEDropoutPairs):  # one process, no workers: the recipe's `validate` refuses others
            self.token_sampler = BPEDropoutBatchSampler(dataset, self.max_tokens_per_batch, seed=seed)
        else:  # numpy arrays read from the Arrow columns
            lengths = column_lengths(dataset, "input_ids"), column_lengths(dataset, "labels")
            self.token_sampler = TokenBatchSampler(*lengths, self.max_tokens_per_batch, seed=seed)
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

    # No public hook: the public `save_model` also gathers the sharded state dict, which needs the FSDP class; `_save`
    # is the step that only writes the files.
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Trainer's, with the model's own class during the save: FSDP2 gives a sharded model a class of its own
        (`FSDP<Name>`, defined in torch's `_fsdp_init`), which `save_pretrained` would write into `config.auto_map`
        while copying torch's FSDP files in place of the model code."""
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        sharded_class = type(model)
        own_class = _class_before_fully_shard(sharded_class)
        if own_class is None:
            return super()._save(output_dir, state_dict)
        model.__class__ = own_class
        try:
            return super()._save(output_dir, state_dict)
        finally:
            model.__class__ = sharded_class

    def _streaming_train_dataloader(self) -> DataLoader:
        """Token batches of a streamed training set, packed a buffer of `streaming_buffer_pairs` pairs at a time (in
        this process: the recipe's `validate` refuses more processes or DataLoader workers)."""
        dataset = self._remove_unused_columns(self.train_dataset, description="Training")
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        batches = StreamingTokenBatches(
            dataset, self.max_tokens_per_batch, self.streaming_buffer_pairs, self.data_collator, seed
        )
        logger.info(
            f"token batches of at most {self.max_tokens_per_batch} padded tokens per side, packed from a buffer of "
            f"{self.streaming_buffer_pairs} streamed pairs at a time"
        )
        loader = DataLoader(batches, batch_size=None, pin_memory=self.args.dataloader_pin_memory)
        return self.accelerator.prepare(loader)

    # No public hook: Trainer 5.23 checks max_steps, and a callback's `should_training_stop`, only after an optimizer
    # step, so a run resumed from the checkpoint of its last step (a job killed after that save) would train one step
    # more than the run that was never interrupted; this stops before the epoch's first step.
    def _run_epoch(self, *args, **kwargs):
        if 0 < self.state.max_steps <= self.state.global_step:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    # No public hook for where a checkpoint is written (`on_save` comes after the writing): `_save_checkpoint` writes
    # into the staging folder that `_get_output_dir` names while it runs, then renames the finished checkpoint.
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
        except Exception as error:
            if not is_disk_full(error, run_dir):
                raise
            shutil.rmtree(staging_root, ignore_errors=True)  # the partial checkpoint: no half folder, its space back
            raise self.disk_full(name, run_dir) from error
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

    def disk_full(self, what: str, folder: Path) -> OutputError:
        """The error of a full disk while saving `what` into `folder`: the folder, and the last whole checkpoint (a
        `checkpoint-*` folder is whole by construction) with the flag that resumes from it."""
        checkpoints = find_checkpoints(folder)
        way_out = (
            f"the last whole checkpoint is {checkpoints[-1]}: free some space and resume from it with "
            f"--resume_from_checkpoint {checkpoints[-1]}"
            if checkpoints
            else "no checkpoint of this run was saved yet"
        )
        return OutputError(f"No space left on device while saving {what} into {folder}; {way_out}")

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
