"""`attn evaluate`: BLEU, chrF and TER (sacreBLEU, with their signatures) of a model on a test set, or of a file of
existing translations, printed as JSON.

Three ways to give the test set:
- `--model M [--data D] [--split test]`: a split of the data `attn train --data` reads. In a folder of plain files
  only that split's files are read (`{split}.{src}`/`{split}.{tgt}`, `{split}.tsv` as source TAB target with no
  header line, `{split}.jsonl`; `.gz` too; a test set may be any one `test*` stem such as `test_2016_flickr`), so a
  folder holding only test files works and the training data is not read. Other data (a `save_to_disk` folder, a
  dataset name, none: the embedded dates task) goes through the recipe's loader, `modeling_attn.training.data.load_parallel_data`.
- `--model M --sources_file S --references_file R`: translate S, score against R (one sentence per line).
- `--hypotheses_file H --references_file R`: score existing translations; no model is loaded.

`evaluate(model, tokenizer, sources, references)` is the Python function behind the first two; `--quantize int8`
scores the model with dynamic int8 Linear layers (`modeling_attn.api.quantize.quantize_int8`). The flags follow the
`attn` convention (`modeling_attn.cli.parser.CommandParser`); bad data ends with one line naming the file and line, and
exit status 2.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from modeling_attn.cli.parser import CommandParser, run_command

from ..api.corpus import SPLIT_STEMS, DataError, find_split_file, jsonl_rows, text_pair_rows, tsv_rows
from ..api.hub import EMBEDDED_TASK, decoding_settings, local_or_hub
from ..api.outputs import OutputError, check_output_file, output_file
from ..api.quantize import quantize, quantize_device
from ..api.translation import SentenceTooLong, TranslateError, batches, load_model, translate_batch
from ..api.values import COUNT
from .translate import DecodingArguments, RuntimeArguments, generation_overrides, parse_flags, shown_defaults

_TEXT_FORMATS = ("tsv", "jsonl")


@dataclass
class EvaluateArguments:
    """`attn evaluate`'s flags besides the decoding ones."""

    _argument_group_name = "test set and output"

    model: str | None = field(
        default=None,
        metadata={
            "help": "Model folder or Hub repo to translate with (not needed with --hypotheses_file).",
            "aliases": ["--model_name_or_path"],
        },
    )
    data: str | None = field(
        default=None,
        metadata={
            "help": "Data as `attn train --data` reads it (folder of {split}.{lang} / .tsv / .jsonl files, "
            "save_to_disk folder, dataset name); default: the embedded dates task.",
            "aliases": ["--dataset_name"],
        },
    )
    data_config: str | None = field(
        default=None,
        metadata={"help": "Dataset configuration, e.g. de-en for wmt14.", "aliases": ["--dataset_config_name"]},
    )
    source_lang: str | None = field(default=None, metadata={"help": "Source language code (file suffix / JSON key)."})
    target_lang: str | None = field(default=None, metadata={"help": "Target language code."})
    split: Literal["train", "validation", "test"] = field(default="test", metadata={"help": "The split to score."})
    max_samples: int | None = field(default=None, metadata={"help": "Score only the first N pairs.", "range": COUNT})
    sources_file: str | None = field(
        default=None, metadata={"help": "Translate this file (one sentence per line) instead of --data."}
    )
    references_file: str | None = field(
        default=None,
        metadata={"help": "Reference translations, one per line, for --sources_file / --hypotheses_file."},
    )
    hypotheses_file: str | None = field(
        default=None, metadata={"help": "Score these translations (one per line) against --references_file; no model."}
    )
    lowercase: bool = field(
        default=False,
        metadata={"help": "Score case-insensitively (always so for a model whose tokenizer lowercases)."},
    )
    output: str | None = field(default=None, metadata={"help": "Also write the JSON to this file."})
    hypotheses: str | None = field(default=None, metadata={"help": "Write the model's translations to this file."})
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Replace existing --output / --hypotheses files that attn did not write (its own earlier "
            "outputs are replaced without it)."
        },
    )

    def __post_init__(self) -> None:
        data_flags = [f"--{name}" for name in ("data", "data_config") if getattr(self, name) is not None]
        if self.hypotheses_file is not None:
            if self.references_file is None:
                raise ValueError("--hypotheses_file needs --references_file (the reference translations)")
            clashing = [f"--{name}" for name in ("model", "sources_file", "hypotheses") if getattr(self, name)]
            if clashing + data_flags:
                raise ValueError(
                    f"--hypotheses_file scores existing translations: drop {', '.join(clashing + data_flags)}"
                )
            return
        if self.model is None:
            raise ValueError("give --model (to translate a test set) or --hypotheses_file with --references_file")
        if (self.sources_file is None) != (self.references_file is None):
            raise ValueError("--sources_file and --references_file go together (the sentences and their references)")
        if self.sources_file is not None and data_flags:
            raise ValueError(f"--sources_file is the test set: drop {', '.join(data_flags)}")


def evaluate_parser() -> CommandParser:
    return shown_defaults(
        CommandParser(
            (EvaluateArguments, DecodingArguments, RuntimeArguments),
            prog="attn evaluate",
            description="BLEU, chrF and TER (sacreBLEU, with signatures) of a model's translations of a test set, or "
            "of a file of translations, as JSON.",
        )
    )


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    references: list[str],
    batch_size: int = 32,
    progress: bool = False,
    lowercase: bool = False,
    **generate_kwargs: Any,
) -> tuple[dict[str, Any], list[str]]:
    """BLEU, chrF, TER, exact match and the sacreBLEU signatures of the model's translations of `sources`, and the
    translations themselves. A model whose tokenizer lowercases is scored case-insensitively (signatures `case:lc`),
    as is any model with `lowercase`."""
    from ..api.metrics import translation_scores, writes_lowercase

    chunks = batches(sources, batch_size)
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, total=-(-len(sources) // batch_size), unit="batch", desc="translating", file=sys.stderr)
    hypotheses: list[str] = []
    for batch in chunks:
        try:
            hypotheses += translate_batch(model, tokenizer, batch, **generate_kwargs)[0]
        except SentenceTooLong as error:  # its index among all the sources, not in the batch
            raise SentenceTooLong(error.detail, len(hypotheses) + error.row) from None
    lowercase = lowercase or writes_lowercase(tokenizer)
    return translation_scores(hypotheses, references, lowercase=lowercase), hypotheses


# -- the test set ----------------------------------------------------------------------------------------------


@dataclass
class EvaluationSet:
    """What `attn evaluate` scores: sources to translate, or translations already made, and their references."""

    sources: list[str] | None  # None: `hypotheses` are given
    references: list[str]
    where: str  # for messages: "pair N" is appended
    details: dict[str, Any]  # what the JSON says about the test set
    hypotheses: list[str] | None = None

    def first(self, count: int) -> None:
        """Keep the first `count` pairs."""
        self.references = self.references[:count]
        self.sources = None if self.sources is None else self.sources[:count]
        self.hypotheses = None if self.hypotheses is None else self.hypotheses[:count]


def _file(folder: Path, name: str) -> Path | None:
    stem, _, suffix = name.partition(".")
    return find_split_file(folder, stem, suffix)  # DataError when both NAME and NAME.gz exist


def _split_stems(folder: Path, split: str) -> list[str]:
    """The file stems of `split` present in `folder`: its names (`SPLIT_STEMS`), else for test any one `test*`."""

    def present(stem: str) -> bool:
        return any(path.name.startswith(f"{stem}.") for path in folder.iterdir())

    stems = [stem for stem in SPLIT_STEMS[split] if present(stem)]
    if len(stems) > 1:
        raise DataError(
            f"{folder}: files {' and '.join(f'{stem}.*' for stem in stems)} could both be the {split} "
            "split; keep one of them, or choose with --sources_file/--references_file"
        )
    if stems or split != "test":
        return stems
    found = sorted({path.name.split(".")[0] for path in folder.glob("test*.*")})
    if len(found) > 1:
        raise DataError(f"{folder}: several test sets {found}; choose one with --sources_file/--references_file")
    return found


def _pairs(
    rows: Iterator[tuple[str, str, int]], where: Callable[[int], str], empty_targets: bool = False
) -> tuple[list[str], list[str]]:
    """Sources and references of the recipe's row readers (`modeling_attn.api.corpus`: stripped, file and line checked);
    an empty source or reference names its place (`where(line)`), unless `empty_targets` allows empty second sides."""
    firsts, seconds = [], []
    for first, second, number in rows:
        if not first or (not second and not empty_targets):
            side = "source" if not first else "reference"
            raise DataError(f"{where(number)}: empty {side} sentence (a test pair needs both)")
        firsts.append(first)
        seconds.append(second)
    return firsts, seconds


def _read_folder_split(folder: Path, stem: str, args: SimpleNamespace) -> EvaluationSet | None:
    """The pairs of files `{stem}.*` in `folder` (TSV, JSONL or one plain file per language), or None if none."""
    details = {"data": local_or_hub(str(folder)), "split": args.split, "file_stem": stem}
    where = f"the {args.split} split of {folder}"
    if path := _file(folder, f"{stem}.tsv"):
        sources, references = _pairs(tsv_rows(str(path)), lambda number: f"{path}:{number}")
        return EvaluationSet(
            sources,
            references,
            where,
            {**details, "source_lang": args.source_lang or "src", "target_lang": args.target_lang or "tgt"},
        )
    if path := _file(folder, f"{stem}.jsonl"):
        if not (args.source_lang and args.target_lang):
            raise DataError(f"{path}: JSONL data needs --source_lang and --target_lang (the JSON keys)")
        rows = jsonl_rows(str(path), args.source_lang, args.target_lang)
        sources, references = _pairs(rows, lambda number: f"{path}:{number}")
        return EvaluationSet(
            sources, references, where, {**details, "source_lang": args.source_lang, "target_lang": args.target_lang}
        )
    languages = sorted(
        {path.name.removesuffix(".gz").split(".", 1)[1] for path in folder.glob(f"{stem}.*")} - set(_TEXT_FORMATS)
    )
    if not languages:
        return None
    source_lang, target_lang = args.source_lang, args.target_lang
    if not (source_lang and target_lang):
        if len(languages) != 2:
            raise DataError(
                f"{folder}: files {stem}.{{{','.join(languages)}}}; choose with --source_lang/--target_lang"
            )
        source_lang, target_lang = languages
    source_path, target_path = _file(folder, f"{stem}.{source_lang}"), _file(folder, f"{stem}.{target_lang}")
    if source_path is None or target_path is None:
        missing = f"{stem}.{source_lang}" if source_path is None else f"{stem}.{target_lang}"
        raise DataError(f"{folder}: {missing}[.gz] is missing (the {args.split} split needs one file per language)")
    rows = text_pair_rows(str(source_path), str(target_path))
    sources, references = _pairs(rows, lambda number: f"{source_path}:{number} / {target_path}:{number}")
    return EvaluationSet(
        sources, references, where, {**details, "source_lang": source_lang, "target_lang": target_lang}
    )


def _loaded_split(args: SimpleNamespace) -> EvaluationSet:
    """The split through the training recipe's loader (embedded task, save_to_disk folder, dataset name)."""
    from ..training.data import load_parallel_data, require_splits

    parallel = load_parallel_data(args.data, args.source_lang, args.target_lang, args.data_config)
    require_splits(parallel, [args.split], args.data)
    table = parallel.splits[args.split]
    name = args.data or "the embedded dates task"
    details = {
        "data": local_or_hub(args.data) or EMBEDDED_TASK,
        "data_config": args.data_config,
        "split": args.split,
        "source_lang": parallel.source_lang,
        "target_lang": parallel.target_lang,
    }
    return EvaluationSet(list(table["source"]), list(table["target"]), f"the {args.split} split of {name}", details)


def load_evaluation_set(args: SimpleNamespace) -> EvaluationSet:
    """The sentences and references `args` name (see the module docstring); DataError naming what is wrong."""
    if args.hypotheses_file or args.sources_file:
        first = Path(args.hypotheses_file or args.sources_file)
        key = "hypotheses_file" if args.hypotheses_file else "sources_file"
        details = {key: str(first), "references_file": args.references_file}
        if args.hypotheses_file:  # a translation may be empty; a reference may not
            references, hypotheses = _pairs(
                text_pair_rows(args.references_file, str(first)),
                lambda number: f"{args.references_file}:{number}",
                empty_targets=True,
            )
            return EvaluationSet(None, references, str(first), details, hypotheses=hypotheses)
        sources, references = _pairs(
            text_pair_rows(str(first), args.references_file),
            lambda number: f"{first}:{number} / {args.references_file}:{number}",
        )
        return EvaluationSet(sources, references, str(first), details)
    folder = Path(args.data) if args.data else None
    if folder is not None and folder.is_dir() and not (folder / "dataset_dict.json").is_file():
        for stem in _split_stems(folder, args.split):
            if (found := _read_folder_split(folder, stem, args)) is not None:
                return found
    return _loaded_split(args)


# -- attn evaluate ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`attn evaluate`: see the module docstring and `attn evaluate --help`."""
    args = parse_flags(evaluate_parser(), argv)
    return run_command("attn evaluate", lambda: _evaluate(args), (OSError, DataError, TranslateError, OutputError))


def _inputs(args: SimpleNamespace) -> dict[str, str | None]:
    """The files and folders `attn evaluate` reads, by flag: its outputs may be none of them."""
    names = ("model", "data", "sources_file", "references_file", "hypotheses_file")
    return {f"--{name}": getattr(args, name) for name in names}


def _evaluate(args: SimpleNamespace) -> int:
    from ..api.metrics import translation_scores

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    inputs = _inputs(args)
    for path, flag in ((args.output, "--output"), (args.hypotheses, "--hypotheses")):
        if path:  # before any work: never an input, never a file attn did not write unless --overwrite
            check_output_file(path, inputs, args.overwrite, flag)
    if args.output and args.hypotheses and Path(args.output).resolve() == Path(args.hypotheses).resolve():
        raise OutputError(f"--output and --hypotheses are both {args.output}; give two files")
    tests = load_evaluation_set(args)
    if args.max_samples is not None:
        tests.first(args.max_samples)
    start = time.perf_counter()
    if tests.hypotheses is not None:  # a file of translations
        hypotheses = tests.hypotheses
        scores = translation_scores(hypotheses, tests.references, lowercase=args.lowercase)
        result = {**tests.details, "sentences": len(hypotheses), **scores}
    else:
        model, tokenizer = load_model(args.model, quantize_device(args.device, args.quantize))
        model = quantize(model, args.quantize, args.int8_engine)
        overrides = generation_overrides(args)
        try:
            scores, hypotheses = evaluate(
                model,
                tokenizer,
                tests.sources,
                tests.references,
                args.batch_size,
                progress=args.progress,
                lowercase=args.lowercase,
                **overrides,
            )
        except SentenceTooLong as error:
            raise TranslateError(f"{tests.where}, pair {error.row + 1}: the source sentence {error.detail}") from None
        settings = decoding_settings(model.generation_config, overrides)  # as attn train records it, for attn push
        result = {"model": args.model, **tests.details, "sentences": len(hypotheses), **scores, "generation": settings}
    result["seconds"] = round(time.perf_counter() - start, 2)
    text = json.dumps(result, indent=2)
    inputs = _inputs(args)
    with contextlib.ExitStack() as files:  # every file is complete, or none is written
        outputs = [
            (args.output, "--output", text + "\n"),
            (args.hypotheses, "--hypotheses", "".join(f"{h}\n" for h in hypotheses)),
        ]
        outputs = [
            (files.enter_context(output_file(path, inputs, args.overwrite, flag)), content)
            for path, flag, content in outputs
            if path
        ]
        for handle, content in outputs:
            handle.write(content)
    print(text)
    return 0


__all__ = ["EvaluateArguments", "EvaluationSet", "evaluate", "main", "evaluate_parser", "load_evaluation_set"]
