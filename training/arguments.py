"""The flags of `attn train`: ours (`RecipeArguments`), and the paper's recipe as Trainer's defaults.

`PAPER_DEFAULTS` sets the defaults of transformers' own `Seq2SeqTrainingArguments` flags (Sec. 5.3-5.4, 6.1):
- Adam with beta1 0.9, beta2 0.98, eps 1e-9 (AdamW with `--weight_decay 0` is Adam), fused (`--optim
  adamw_torch_fused`, transformers' own default with torch >= 2.8: one kernel per tensor; on the CPU the base step
  takes less time than with `--optim adamw_torch`'s per-op loop, docs/speed.md has the figures);
- lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) with warmup 4000 (Eq. 3): transformers'
  `inverse_sqrt` schedule with peak `--learning_rate` d_model^-0.5 * warmup^-0.5 (`paper_learning_rate`);
- label smoothing 0.1; batches of about `--max_tokens_per_batch` tokens, bucketed by length;
- beam search with 4 beams, length penalty 0.6 (`--length_penalty`), the average of the last 5 checkpoints
  (`--average_last_n`).
Deviations: gradients are clipped at norm 1 (Trainer's default `--max_grad_norm`; the paper does not say), and
Trainer's scheduler applies the rate of step n-1 at update n (the logged rate at step n is the paper's).
The values of the number flags are declared here (`"range"` in a field's metadata, `TRAINER_RANGES` for Trainer's
flags) and checked when the command line is parsed (`modeling_attn.cli.parser.CommandParser`); the checks of their
combinations are `modeling_attn.training.validate.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import Seq2SeqTrainingArguments
from transformers.integrations import is_tensorboard_available

from modeling_attn.api.alignment import WORD_PATTERNS
from modeling_attn.api.hub import PAPER_DECODING
from modeling_attn.api.values import COUNT, NATURAL, NON_NEGATIVE, POSITIVE, PROBABILITY, Range
from modeling_attn.loss import GUIDED_ALIGNMENT_WEIGHT
from modeling_attn.registry import MODEL_TYPES

# The paper's recipe, as defaults of transformers' own Seq2SeqTrainingArguments flags.
PAPER_DEFAULTS = {
    "output_dir": "outputs/attn",
    "optim": "adamw_torch_fused",
    "weight_decay": 0.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.98,
    "adam_epsilon": 1e-9,
    "lr_scheduler_type": "inverse_sqrt",
    "warmup_steps": 4000,
    "label_smoothing_factor": 0.1,
    "predict_with_generate": True,
    "generation_num_beams": PAPER_DECODING["num_beams"],
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

# The values of the Seq2SeqTrainingArguments flags that count or weigh something (`CommandParser.declare_ranges`; any
# other float flag must be finite). Checked once, when the command line is parsed, naming the flag.
TRAINER_RANGES = {
    "max_steps": Range(low=1, integer=True, also=(-1,), meaning="-1: train for --num_train_epochs"),
    "num_train_epochs": POSITIVE,
    "per_device_train_batch_size": COUNT,
    "per_device_eval_batch_size": COUNT,
    "gradient_accumulation_steps": COUNT,
    "eval_accumulation_steps": COUNT,
    "learning_rate": POSITIVE,
    "warmup_steps": NON_NEGATIVE,  # below 1: a ratio of the training steps
    "weight_decay": NON_NEGATIVE,
    "adam_beta1": Range(low=0, high=1, high_open=True),
    "adam_beta2": Range(low=0, high=1, high_open=True),
    "adam_epsilon": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE,  # 0: no clipping
    "label_smoothing_factor": PROBABILITY,
    "logging_steps": POSITIVE,  # below 1: a ratio of the training steps (so are the two below)
    "eval_steps": POSITIVE,
    "save_steps": POSITIVE,
    "eval_delay": NON_NEGATIVE,
    "save_total_limit": NATURAL,  # 0 or none: keep every checkpoint
    "dataloader_num_workers": NATURAL,
    "dataloader_prefetch_factor": COUNT,
    "generation_max_length": COUNT,
    "generation_num_beams": COUNT,
    "neftune_noise_alpha": NON_NEGATIVE,
    "torch_empty_cache_steps": COUNT,
}


@dataclass
class RecipeArguments:
    """Our flags; every `Seq2SeqTrainingArguments` flag is accepted too."""

    data: str | None = field(
        default=None,
        metadata={
            "help": "Folder of {split}.{lang}[.gz] / {split}.tsv / {split}.jsonl files, a save_to_disk folder, "
            "or a dataset name for datasets.load_dataset with a 'translation' column. Default: the embedded "
            "dates task (no network needed).",
            "aliases": ["--dataset_name", "--dataset-name"],
        },
    )
    data_config: str | None = field(
        default=None,
        metadata={
            "help": "Dataset configuration, e.g. de-en for wmt14.",
            "aliases": ["--dataset_config_name", "--dataset-config-name"],
        },
    )
    source_lang: str | None = field(default=None, metadata={"help": "Source language code (file suffix / JSON key)."})
    target_lang: str | None = field(default=None, metadata={"help": "Target language code."})
    drop_empty_pairs: bool = field(
        default=False,
        metadata={"help": "Drop pairs with an empty side (counted, logged) instead of stopping with an error."},
    )
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={
            "help": "Processes that tokenize the data (datasets' map num_proc). Data read from files is cached: a "
            "second run on the same files and tokenizer reuses it (training/prepare.py says where).",
            "range": COUNT,
        },
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads for torch in each training process (torch.set_num_threads; default: torch's own "
            "choice, the cores the process may run on). Two runs side by side on 2 cores: --threads 1 each.",
            "range": COUNT,
        },
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read and tokenize the data while training (datasets' IterableDataset) instead of preparing "
            "it up front: for corpora too large to prepare. Token batches from a bounded length-sorted buffer; "
            "needs --max_steps. A resumed run reads the stream again and skips the batches already trained "
            "(docs/training.md)."
        },
    )
    streaming_buffer_pairs: int = field(
        default=100_000,
        metadata={
            "help": "--streaming: pairs held at a time to sort by length and cut into token batches.",
            "range": COUNT,
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N training pairs.", "range": COUNT}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N validation pairs.", "range": COUNT}
    )
    max_predict_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N test pairs.", "range": COUNT}
    )
    model_type: str | None = field(
        default=None,
        metadata={
            "help": "Model type. Default: the type of --preset or --model_name_or_path, else attn_transformer.",
            "choices": tuple(MODEL_TYPES),
        },
    )
    preset: str | None = field(
        default=None, metadata={"help": "Model preset (`attn preset` lists them); default small / rnn-small."}
    )
    config_overrides: str | None = field(
        default=None, metadata={"help": "Config values over the preset or the fine-tuned model's, e.g. 'dropout=0.3'."}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Fine-tune this model (local folder or Hub id) and keep its tokenizer."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Reuse this tokenizer instead of training a BPE vocabulary.",
            "aliases": ["--tokenizer_name", "--tokenizer-name"],
        },
    )
    vocab_size: int = field(
        default=37000, metadata={"help": "Size of the joint BPE vocabulary to train (paper: 37000).", "range": COUNT}
    )
    lowercase: bool = field(
        default=False,
        metadata={"help": "New BPE vocabulary: lowercase all text (the model reads and writes lowercase)."},
    )
    split_punctuation: bool = field(
        default=False,
        metadata={"help": "New BPE vocabulary: punctuation marks are tokens of their own, never merged."},
    )
    max_source_length: int = field(
        default=256, metadata={"help": "Longer source sentences are truncated (counted).", "range": COUNT}
    )
    max_target_length: int = field(
        default=256, metadata={"help": "Longer target sentences are truncated (counted).", "range": COUNT}
    )
    bpe_dropout: float = field(
        default=0.0,
        metadata={
            "help": "BPE-dropout (Provilkov et al., 2020): while training, skip each BPE merge with this "
            "probability, so the training sentences are segmented anew each epoch (e.g. 0.1). 0: off.",
            "range": PROBABILITY,
        },
    )
    rdrop_alpha: float = field(
        default=0.0,
        metadata={
            "help": "R-Drop (Liang et al., 2021): each training batch passes twice (two dropout masks) and this "
            "weight times the symmetric KL divergence between the two passes' token distributions is added to the "
            "loss (modeling_attn.loss.consistency_loss); a step costs about two. 0: off.",
            "range": NON_NEGATIVE,
        },
    )
    max_tokens_per_batch: int = field(
        default=4096,
        metadata={
            "help": "Padded source (and target) tokens per batch and process; 0 batches by "
            "--per_device_train_batch_size sentences. The paper: ~25000 per step over all processes.",
            "range": NATURAL,
        },
    )
    length_penalty: float = field(
        default=PAPER_DECODING["length_penalty"],
        metadata={"help": f"Beam search length penalty alpha (paper: {PAPER_DECODING['length_penalty']})."},
    )
    average_last_n: int = field(
        default=5,
        metadata={
            "help": "Average the last N checkpoints at the end (paper: 5); 1 (no averaging) with "
            "--load_best_model_at_end, whose best checkpoint is the final model.",
            "range": COUNT,
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Delete the checkpoints an earlier run left in --output_dir before training, and write into "
            "a folder holding files attn train did not write, replacing only its own (transformers' flag of that "
            "name; without it such a folder is refused unless --resume_from_checkpoint continues the run)."
        },
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": "Stop when --metric_for_best_model has not improved for N evaluations (transformers' "
            "EarlyStoppingCallback; needs validation: --eval_strategy steps or epoch).",
            "range": COUNT,
        },
    )
    early_stopping_threshold: float = field(
        default=0.0,
        metadata={
            "help": "With --early_stopping_patience: the least change that counts as improvement.",
            "range": NON_NEGATIVE,
        },
    )
    num_samples_to_print: int = field(
        default=5, metadata={"help": "Test translations printed at the end.", "range": NATURAL}
    )
    cuda_fast_path: bool = field(
        default=True,
        metadata={
            "help": "On a CUDA GPU, train with what is fast there unless Trainer's own flag is given: bf16 mixed "
            "precision where the GPU supports it (--bf16; --bf16 false or --fp16 instead), TF32 matmuls (--tf32; "
            "--tf32 false instead). false: Trainer's defaults. CPU runs are unchanged. (Fused AdamW is the default "
            "on every device; --optim adamw_torch instead.)"
        },
    )
    # Guided alignment training (training/alignment.py)
    alignment_file: str | None = field(
        default=None,
        metadata={
            "help": "Word alignments of the training pairs, one Pharaoh line per pair (`0-0 1-2 ...`: source "
            "word - target word), e.g. from fast_align or eflomal: train with guided alignment (Garg et al. "
            "2019; Marian's --guided-alignment); the config records the supervised layer and head."
        },
    )
    guided_alignment_weight: float = field(
        default=GUIDED_ALIGNMENT_WEIGHT,
        metadata={
            "help": "--alignment_file: weight of the alignment loss added to the translation loss (Marian's "
            "default; Garg et al. use 0.05).",
            "range": POSITIVE,
        },
    )
    alignment_words: str = field(
        default="whitespace",
        metadata={
            "help": "--alignment_file: what its words are: text between spaces, or runs of letters and digits "
            "with the punctuation around them (alnum).",
            "choices": tuple(WORD_PATTERNS),
        },
    )


def paper_learning_rate(d_model: int, warmup_steps: int) -> float:
    """Peak rate d_model^-0.5 * warmup^-0.5 that makes `inverse_sqrt` equal Eq. 3 of the paper.

    `inverse_sqrt` gives peak * step / warmup before `warmup` and peak * sqrt(warmup / step) after it, which is
    d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) with this peak.
    """
    return d_model**-0.5 * max(warmup_steps, 1) ** -0.5


def paper_warmup_steps(training_args: Seq2SeqTrainingArguments) -> int:
    """The warmup steps of Eq. 3, as Trainer counts them: `--warmup_steps` below 1 is a ratio of the training steps
    (`--max_steps`)."""
    warmup = training_args.warmup_steps
    if 0 < warmup < 1:  # `validate` refuses a ratio without --max_steps
        return training_args.get_warmup_steps(training_args.max_steps)
    return int(warmup)


__all__ = ["PAPER_DEFAULTS", "TRAINER_RANGES", "RecipeArguments", "paper_learning_rate", "paper_warmup_steps"]
