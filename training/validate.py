"""`validate`: every check of `attn train`'s flags, in one step, run once before any work.

`parse_args` of `modeling_attn.cli.train` calls it; OpenNMT-py's `validate_train_opts` is the model. The recipe's
steps (`modeling_attn.training.train`) and `TranslationTrainer` check no flags. The value of each number flag on its
own (counts positive, probabilities in [0, 1], floats finite) is declared with the flag (`training.arguments`) and
checked by the parser, before this step. A value or a combination that cannot work, or that would be silently
ignored, raises ValueError naming the flags.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import zipfile
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from transformers import Seq2SeqTrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from modeling_attn.api.alignment import WORD_PATTERNS
from modeling_attn.api.errors import FlagError
from modeling_attn.api.model_folder import (
    ModelFolderError,
    check_config,
    check_hub_reachable,
    looks_local,
    no_such_folder,
)
from modeling_attn.api.outputs import check_not_in_use, describe_files, foreign_files
from modeling_attn.api.presets import available_presets, load_preset
from modeling_attn.registry import MODEL_TYPES

from .arguments import RecipeArguments
from .averaging import find_checkpoints
from .trainer import STAGING_DIR

# Trainer flags that shape sentence batches: token batches (--max_tokens_per_batch > 0) decide the batches instead.
SENTENCE_BATCH_FLAGS = (
    "per_device_train_batch_size",
    "auto_find_batch_size",
    "train_sampling_strategy",
    "dataloader_drop_last",
)
# Config fields the recipe sets from the tokenizer when it builds a new model: not for --config_overrides.
TOKENIZER_FIELDS = ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")


def validate(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, given: set[str]) -> None:
    """Every check of the flags, once, before any work. `given`: the fields the command line named (the checks of
    flags that only matter when given). Fills in what the flags imply: the resumed checkpoint of
    `--resume_from_checkpoint last`, `--average_last_n 1` under `--load_best_model_at_end`, TER's direction.

    Checked where the thing they are checked against is loaded, not here (steps of `train.TrainingRun`): the data (its
    files and splits: `training.data`; the longest training pair against --max_tokens_per_batch:
    `build_training_set`, after tokenizing; a streamed pair against it: `batching.StreamingTokenBatches`, while
    streaming), a reused tokenizer against --lowercase / --split_punctuation (`build_tokenizer`), the config of
    --model_name_or_path against --model_type and --config_overrides (`build_model`), and the Hub repository of
    --push_to_hub (created by `setup`, before the data is read).
    """
    _check_one_process_flags(recipe, training_args)
    _check_local_names(recipe)
    _check_model_flags(recipe)
    _check_batching_flags(recipe, training_args, given)
    _check_best_model_flags(recipe, training_args, given)
    if training_args.load_best_model_at_end:
        recipe.average_last_n = 1  # the best checkpoint is the final model, as Trainer documents
    if training_args.metric_for_best_model in ("ter", "eval_ter") and "greater_is_better" not in given:
        training_args.greater_is_better = False  # Trainer guesses it from the name (only a loss is lower-is-better)
    _check_alignment_flags(recipe, training_args, given)
    resolve_cuda_fast_path(recipe, training_args, given)
    if training_args.learning_rate is None and 0 < training_args.warmup_steps < 1 and training_args.max_steps <= 0:
        raise FlagError(
            f"--warmup_steps {training_args.warmup_steps} is a ratio of the training steps, "
            "which the paper's learning rate needs before training starts: "
            "give --max_steps, a whole number of --warmup_steps, or --learning_rate"
        )
    if recipe.overwrite_output_dir and training_args.resume_from_checkpoint:  # before looking for the checkpoint
        raise FlagError(
            "--overwrite_output_dir deletes the checkpoints of --output_dir, --resume_from_checkpoint "
            "continues from one: give one of them"
        )
    _resolve_resumed_checkpoint(training_args)
    check_output_dir(recipe, training_args)
    check_resumed_checkpoint(training_args)


def _check_one_process_flags(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """--bpe_dropout and --streaming read or change the training set in the training process itself."""
    processes, workers = training_args.world_size, training_args.dataloader_num_workers
    if recipe.bpe_dropout:
        if not recipe.max_tokens_per_batch:
            raise FlagError(
                "--bpe_dropout needs token batches (--max_tokens_per_batch > 0): they are packed anew "
                "for each epoch's segmentation"
            )
        if recipe.streaming:
            raise FlagError(
                "--streaming with --bpe_dropout: BPE-dropout segments the whole training set in memory at each epoch"
            )
        if training_args.do_train and (processes > 1 or workers > 0):
            raise FlagError(
                "--bpe_dropout segments the training set anew in this process at each epoch: it needs one training "
                f"process and --dataloader_num_workers 0 (got {processes} processes and {workers} workers)"
            )
    if recipe.streaming:
        if training_args.do_train and training_args.max_steps <= 0:
            raise FlagError("--streaming needs --max_steps: a stream has no length for Trainer to count epochs in")
        if processes > 1:
            raise FlagError(f"--streaming reads the stream in one training process, not {processes}")
        if training_args.do_train and recipe.max_tokens_per_batch and workers > 0:
            raise FlagError(
                "--streaming packs the token batches of the stream in this process: it needs "
                f"--dataloader_num_workers 0, got {workers}"
            )


def config_overrides(text: str | None) -> dict:
    """--config_overrides 'a=1,b=x' as a dict, each value read as JSON where it is JSON (else a string)."""
    overrides = {}
    for item in filter(None, (text or "").split(",")):
        key, _, value = item.partition("=")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value
    return overrides


def new_model_preset(preset: str | None, model_type: str | None) -> str:
    """The preset a new model is built from: --preset, else the default preset of --model_type."""
    return preset or MODEL_TYPES[model_type or next(iter(MODEL_TYPES))].default_preset


def _named_sources(data: str | None, tokenizer: str | None, model: str | None) -> dict[str, tuple[str | None, str]]:
    """--data, --tokenizer_name_or_path, --model_name_or_path: (the name given, what it names)."""
    return {
        "--data": (data, "data folder"),
        "--tokenizer_name_or_path": (tokenizer, "tokenizer folder"),
        "--model_name_or_path": (model, "model folder"),
    }


def _check_local_names(recipe: RecipeArguments) -> None:
    """A name of `_named_sources` that is no path here but can only be one (`./x`, `x/`, `/x`, `a/b/c`): a missing
    folder, with the nearest one beside it. One that could be a Hub id: `check_hub_names`, when the run starts."""
    names = _named_sources(recipe.data, recipe.tokenizer_name_or_path, recipe.model_name_or_path)
    for flag, (name, what) in names.items():
        if name is not None and not Path(name).expanduser().exists() and looks_local(name):
            raise FlagError(f"{flag} {no_such_folder(name, what)}")


def check_hub_names(data: str | None, tokenizer: str | None, model: str | None) -> None:
    """--data, --tokenizer_name_or_path, --model_name_or_path that are no path here and could be Hub ids: a Hub that
    answers within seconds (`check_hub_reachable`), else one line naming both readings. Run by `TrainingRun.setup`,
    before any work; not by `validate`, which reads no network."""
    for flag, (name, what) in _named_sources(data, tokenizer, model).items():
        if name is None or Path(name).expanduser().exists():
            continue
        try:
            check_hub_reachable(name, what)
        except ModelFolderError as error:
            raise FlagError(f"{flag} {error}") from None


def _check_model_flags(recipe: RecipeArguments) -> None:
    """--preset, --model_type and --config_overrides describe one model: a preset's config is built here with the
    overrides (its own checks run: `d_model` divisible by `num_heads`...); a fine-tuned model's is checked when it
    is loaded (`train.TrainingRun.build_model`)."""
    if recipe.preset is not None and recipe.preset not in available_presets():
        near = difflib.get_close_matches(recipe.preset, available_presets(), n=1)
        raise FlagError(
            f"--preset: unknown preset {recipe.preset!r}; "
            + (f"did you mean {near[0]!r}?" if near else f"one of {available_presets()}")
        )
    if recipe.model_name_or_path is not None:
        if recipe.preset is not None:
            raise FlagError(
                f"--preset {recipe.preset} builds a new model, --model_name_or_path fine-tunes "
                f"{recipe.model_name_or_path} with its own config: give one of them (--config_overrides changes the "
                "fine-tuned model's config)"
            )
        name = recipe.model_name_or_path
        if Path(name).expanduser().exists():  # a local folder: named with what is wrong in it (a missing one:
            # `_check_local_names`; a Hub id: `check_hub_names`, then transformers)
            try:
                check_config(recipe.model_name_or_path)
            except ModelFolderError as error:
                raise FlagError(f"--model_name_or_path {error}") from None
        return
    preset, overrides = new_model_preset(recipe.preset, recipe.model_type), config_overrides(recipe.config_overrides)
    fields = {field.name for field in dataclasses.fields(MODEL_TYPES[load_preset(preset).model_type].config_class)}
    if unknown := sorted(set(overrides) - fields):
        raise FlagError(f"--config_overrides: {unknown} are not fields of the {preset!r} preset's config")
    if from_tokenizer := [name for name in TOKENIZER_FIELDS if name in overrides]:
        raise FlagError(
            f"--config_overrides: {from_tokenizer} are set from the tokenizer (--vocab_size sizes a new "
            "BPE vocabulary)"
        )
    try:
        config = load_preset(preset, **overrides)
    except (ValueError, StrictDataclassError) as error:  # the config's own checks; the reason is on the last line
        reason = str(error).strip().splitlines()[-1].strip().removeprefix("ValueError: ")
        raise FlagError(f"--config_overrides {recipe.config_overrides}: {reason}") from error
    if recipe.model_type is not None and config.model_type != recipe.model_type:
        raise FlagError(f"preset {preset!r} is a {config.model_type} model but --model_type is {recipe.model_type}")


def _check_batching_flags(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, given: set[str]) -> None:
    if training_args.sortish_sampler:
        raise FlagError(
            "--sortish_sampler does nothing in transformers 5.x (Seq2SeqTrainer no longer reads it); batches of "
            "sentences of similar length are what --max_tokens_per_batch builds (the default)"
        )
    if recipe.max_tokens_per_batch and (ignored := [name for name in SENTENCE_BATCH_FLAGS if name in given]):
        raise FlagError(
            f"{', '.join('--' + name for name in ignored)}: these shape batches of sentences, "
            f"but the training batches are token batches (--max_tokens_per_batch {recipe.max_tokens_per_batch}, "
            "bucketed by length); give --max_tokens_per_batch 0 to batch by sentences, or leave them out"
        )
    if not training_args.remove_unused_columns:
        raise FlagError(
            "--remove_unused_columns false: the datasets keep each pair's raw target sentence (the BLEU reference), "
            "which the model does not take and the collator cannot batch; leave it at true"
        )
    if not training_args.predict_with_generate and (training_args.eval_strategy != "no" or training_args.do_predict):
        raise FlagError(
            "--predict_with_generate false: validation and test scores (BLEU, chrF) are computed on generated "
            "translations; leave it at true, or turn evaluation off (--eval_strategy no --do_predict false)"
        )
    if training_args.generation_config is not None:
        raise FlagError(
            "--generation_config: the decoding of `attn train` is set by --generation_num_beams, --length_penalty and "
            "--generation_max_length (one generation config for evaluation, the saved model and `attn push`)"
        )


def _check_best_model_flags(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, given: set[str]) -> None:
    """--load_best_model_at_end keeps the best checkpoint as the final model, as Trainer documents, instead of the
    average of the last ones; --early_stopping_patience needs the validation metric it watches."""
    if training_args.load_best_model_at_end and "average_last_n" in given and recipe.average_last_n > 1:
        raise FlagError(
            f"--load_best_model_at_end keeps the best checkpoint as the final model, --average_last_n "
            f"{recipe.average_last_n} averages the last ones into it: give one of them"
        )
    if recipe.early_stopping_patience is not None:
        if training_args.eval_strategy == "no" or not training_args.do_eval:
            raise FlagError(
                "--early_stopping_patience watches the validation metric: it needs --eval_strategy steps "
                "(or epoch) and --do_eval true"
            )
        if training_args.metric_for_best_model is None:
            raise FlagError(
                "--early_stopping_patience: name the validation metric it watches with "
                "--metric_for_best_model (bleu, chrf, ter, exact_match or loss)"
            )


def _check_alignment_flags(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, given: set[str]) -> None:
    """--alignment_file, --guided_alignment_weight and --alignment_words (guided alignment, `training.alignment`):
    a file of one line per training pair, which BPE-dropout, --streaming and --drop_empty_pairs cannot keep."""
    if recipe.alignment_file is None:
        if unused := [name for name in ("guided_alignment_weight", "alignment_words") if name in given]:
            raise FlagError(f"{', '.join('--' + name for name in unused)}: only used with --alignment_file")
        return
    if not Path(recipe.alignment_file).is_file():
        raise FlagError(f"--alignment_file {recipe.alignment_file}: no such file")
    if recipe.alignment_words not in WORD_PATTERNS:
        raise FlagError(f"--alignment_words must be one of {list(WORD_PATTERNS)}, got {recipe.alignment_words!r}")
    if not training_args.do_train:
        raise FlagError("--alignment_file guides training, but --do_train is false")
    refused = {
        "bpe_dropout": "BPE-dropout segments the words anew at each epoch",
        "streaming": "the stream is tokenized as it is read",
        "drop_empty_pairs": "dropped pairs would shift the lines of the alignment file",
    }
    for name, why in refused.items():
        if getattr(recipe, name):
            raise FlagError(f"--alignment_file with --{name}: {why}")


def resolve_cuda_fast_path(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, given: set[str]) -> None:
    """--cuda_fast_path on a CUDA GPU: bf16 mixed precision and TF32 matmuls where the GPU computes them natively
    (Ampere or newer), each unless its own Trainer flag is given (--bf16 or --fp16, --tf32: those win). Left as they
    are: CPU runs (--use_cpu, or no GPU), and the precision under DeepSpeed (its config decides it). Fused AdamW is
    not part of it: it is the default on every device (`arguments.PAPER_DEFAULTS`)."""
    if not recipe.cuda_fast_path or training_args.use_cpu or not torch.cuda.is_available():
        return
    native = torch.cuda.is_bf16_supported(including_emulation=False)  # compute capability 8.0 or newer
    if native and not {"bf16", "fp16"} & given and not training_args.deepspeed:
        training_args.bf16, training_args.mixed_precision = True, "bf16"  # as Trainer's __post_init__ sets both
    if native and "tf32" not in given:
        training_args.tf32 = True  # turned on by `TrainingRun.setup`


def _resolve_resumed_checkpoint(training_args: Seq2SeqTrainingArguments) -> None:
    """--resume_from_checkpoint last (or true): the last checkpoint of --output_dir, which must hold one."""
    if training_args.resume_from_checkpoint in ("True", "true", "last"):
        if not Path(training_args.output_dir).is_dir():
            raise FlagError(
                f"--resume_from_checkpoint: --output_dir {training_args.output_dir} does not exist, so no checkpoint "
                "was written there; check the folder, or run the command without --resume_from_checkpoint"
            )
        training_args.resume_from_checkpoint = get_last_checkpoint(training_args.output_dir)
        if training_args.resume_from_checkpoint is None:
            raise FlagError(
                f"--resume_from_checkpoint: no checkpoint was written in {training_args.output_dir} (the run stopped "
                "before its first save); rerun the same command without --resume_from_checkpoint"
            )


def damaged_file(checkpoint: Path) -> tuple[Path, str] | None:
    """The first file of `checkpoint` that its reader could not take whole, with the reason; None if none.

    What is read: a safetensors file's header and that it covers the file (`safe_open`: a cut-short file fails), a
    `torch.save` file (`.pt`, `.pth`, `.bin`: a zip archive) its central directory and every member's CRC (a cut or
    altered file fails), a JSON file parsed. Tensors are not loaded."""
    for path in sorted(checkpoint.iterdir()):
        try:
            if path.suffix == ".safetensors":
                with safe_open(path, "pt"):
                    pass
            elif path.suffix in (".pt", ".pth", ".bin"):
                with zipfile.ZipFile(path) as archive:
                    if (member := archive.testzip()) is not None:
                        return path, f"not a whole torch.save archive: {member} fails its CRC check"
            elif path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
        except (SafetensorError, zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError, OSError) as error:
            kind = {".safetensors": "safetensors file", ".json": "JSON file"}.get(path.suffix, "torch.save archive")
            return path, f"not a whole {kind}: {error}"
    return None


def check_resumed_checkpoint(training_args: Seq2SeqTrainingArguments) -> None:
    """--resume_from_checkpoint: a folder whose files are whole (`damaged_file`), else ValueError naming the damaged
    file and the way out, the previous whole checkpoint (Trainer would fail inside the file's reader, or load it in
    part)."""
    resumed = training_args.resume_from_checkpoint
    if not resumed or not training_args.do_train:
        return
    checkpoint = Path(resumed)
    if not checkpoint.is_dir():
        raise FlagError(f"--resume_from_checkpoint {checkpoint}: no such folder")
    if (damage := damaged_file(checkpoint)) is None:
        return
    file, reason = damage
    step = re.fullmatch(r"checkpoint-(\d+)", checkpoint.name)
    earlier = [path for path in find_checkpoints(checkpoint.parent) if step and int(path.name[11:]) < int(step[1])]
    whole = next((path for path in reversed(earlier) if damaged_file(path) is None), None)
    way_out = (
        f"the previous whole checkpoint is {whole}: move {checkpoint} out of {checkpoint.parent} and resume with "
        f"--resume_from_checkpoint {whole}"
        if whole is not None
        else f"no earlier checkpoint of {checkpoint.parent} is whole: start again (--overwrite_output_dir)"
    )
    raise FlagError(f"--resume_from_checkpoint {checkpoint}: {file} is damaged ({reason}); {way_out}")


def _check_foreign_files(output_dir: Path) -> None:
    """Refuse an --output_dir holding files `attn train` did not write (a README of the user's, another model...):
    what it wrote is recorded in the folder (`modeling_attn.api.outputs.record_written`). Checkpoint folders are the
    checkpoint rule's (`check_output_dir`)."""
    staged = re.compile(rf"(checkpoint-\d+|{re.escape(STAGING_DIR)})/")
    if foreign := [name for name in foreign_files(output_dir) if not staged.match(name)]:
        raise FlagError(
            f"--output_dir {output_dir} holds files that attn train did not write ({describe_files(foreign)}); "
            "choose an empty or new folder, or give --overwrite_output_dir to write into it anyway (only the files "
            "attn train writes are replaced; the others stay)"
        )


def check_output_dir(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """Refuse an --output_dir that holds checkpoints of another run: they would be averaged with this run's; or,
    holding none, files `attn train` did not write (`_check_foreign_files`).

    The way out: --resume_from_checkpoint (continue that run, in its folder), --overwrite_output_dir (delete the
    checkpoints; replace only the files attn train writes), another folder.
    """
    output_dir = Path(training_args.output_dir)
    resumed = training_args.resume_from_checkpoint
    if output_dir.exists() and not output_dir.is_dir():
        raise FlagError(f"--output_dir {output_dir}: a file, not a folder; give a new or empty folder")
    if training_args.process_index == 0 and output_dir.is_dir():  # the other processes share process 0's lock
        check_not_in_use(output_dir)
    existing = find_checkpoints(output_dir) if output_dir.is_dir() else []
    if not existing and not resumed and not recipe.overwrite_output_dir and training_args.do_train:
        _check_foreign_files(output_dir)
    if not existing or recipe.overwrite_output_dir or not training_args.do_train:
        return
    names = ", ".join(path.name for path in existing)
    if not resumed:
        raise FlagError(
            f"--output_dir {output_dir} holds checkpoints of an earlier run ({names}); they would be averaged with "
            "this run's. Continue that run with --resume_from_checkpoint last, delete them with "
            "--overwrite_output_dir, or choose another --output_dir"
        )
    resumed = Path(resumed)
    if resumed.resolve().parent != output_dir.resolve():
        raise FlagError(
            f"--resume_from_checkpoint {resumed} is not a checkpoint of --output_dir {output_dir}, which holds "
            f"checkpoints of another run ({names}); choose an empty --output_dir, or --overwrite_output_dir"
        )
    step = re.fullmatch(r"checkpoint-(\d+)", resumed.name)
    if step and (later := [path.name for path in existing if int(path.name.split("-")[1]) > int(step[1])]):
        raise FlagError(
            f"--resume_from_checkpoint {resumed}: --output_dir also holds later checkpoints ({', '.join(later)}) that "
            "this run would average with its own; resume from the last one (--resume_from_checkpoint last) or "
            "delete them"
        )


__all__ = [
    "SENTENCE_BATCH_FLAGS",
    "check_output_dir",
    "check_resumed_checkpoint",
    "config_overrides",
    "damaged_file",
    "new_model_preset",
    "resolve_cuda_fast_path",
    "validate",
]
