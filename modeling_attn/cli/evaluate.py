"""`attn evaluate`: BLEU, chrF and TER (sacreBLEU) of a model on a test set, or of existing translations, as JSON.

Three ways to give the test set (docs/translate-evaluate.md, "`attn evaluate`"):
- `--model M [--data D] [--split test]`: a split of the data `attn train --data` reads. In a folder of plain files
  only that split's files are read (`{split}.{src}`/`{split}.{tgt}`, `{split}.tsv`, `{split}.jsonl`, `.gz` too; a
  test set may be any one `test*` stem such as `test_2016_flickr`). Other data (a `save_to_disk` folder, a dataset
  name, none: the embedded dates task) goes through `modeling_attn.training.data.load_parallel_data`.
- `--model M --sources_file S --references_file R`: translate S, score against R (one sentence per line).
- `--hypotheses_file H --references_file R`: score existing translations; no model is loaded.

`evaluate(model, tokenizer, sources, references)` is the Python function behind the first two; `--quantize int8`
scores the model with dynamic int8 Linear layers (`modeling_attn.api.quantize.quantize_int8`). Bad data ends with one
line naming the file and line, and exit status 2.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Literal

from ..api.corpus import SPLIT_STEMS, DataError, paired_sentences, read_folder_split, split_stems, text_pair_rows
from ..api.outputs import OutputError, check_output_file, output_file
from ..api.values import COUNT
from . import options
from .parser import CommandParser
from .report import run_command

if TYPE_CHECKING:  # the rest of the API imports torch: imported where the command runs, after parsing
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ..api.engines import Engine


@dataclass
class EvaluateArguments:
    """`attn evaluate`'s flags besides the decoding ones."""

    _argument_group_name = "test set and output"

    model: str | None = field(
        default=None,
        metadata={
            "help": "Model folder or Hub repo to translate with (not needed with --hypotheses_file); repeat it for "
            "an ensemble.",
            "aliases": ["--model_name_or_path"],
            "action": "append",
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
    return options.shown_defaults(
        CommandParser(
            (
                EvaluateArguments,
                options.DecodingArguments,
                options.RuntimeArguments,
                options.EnsembleArguments,
                options.ConstraintArguments,
            ),
            prog="attn evaluate",
            description="BLEU, chrF and TER (sacreBLEU, with signatures) of a model's translations of a test set, or "
            "of a file of translations, as JSON.",
        )
    )


def evaluate(
    model: PreTrainedModel | Engine,
    tokenizer: PreTrainedTokenizerBase | None,
    sources: list[str],
    references: list[str],
    batch_size: int = 32,
    progress: bool = False,
    lowercase: bool = False,
    constraints: list[list[str]] | None = None,
    **generate_kwargs: Any,
) -> tuple[dict[str, Any], list[str]]:
    """BLEU, chrF, TER, exact match and the sacreBLEU signatures of the model's translations of `sources`, and the
    translations themselves. A model whose tokenizer lowercases is scored case-insensitively (signatures `case:lc`),
    as is any model with `lowercase`. `model` is a model (with its `tokenizer`), or an engine of
    `modeling_attn.api.engines` (`tokenizer` None: the engine's). `constraints`: each source's target phrases
    (constrained decoding); the scores then say how many translations hold all of theirs (`constraints_met`)."""
    from ..api.constraints import ConstraintWarning, missing_phrases
    from ..api.engines import as_engine
    from ..api.metrics import translation_scores, writes_lowercase
    from ..api.translation import SentenceTooLong, batches

    engine = as_engine(model, tokenizer)
    tokenizer = engine.tokenizer
    chunks = batches(sources, batch_size)
    asked = {} if constraints is None else {"constraints": []}  # the request as the engine chooses by it
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(
            chunks,
            total=-(-len(sources) // batch_size),
            unit="batch",
            desc=f"translating with {engine.label_for({**generate_kwargs, **asked})}",
            file=sys.stderr,
        )
    hypotheses: list[str] = []
    for batch in chunks:
        done = len(hypotheses)
        phrases = {} if constraints is None else {"constraints": constraints[done : done + len(batch)]}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConstraintWarning)  # counted below
                hypotheses += engine.translate_batch(batch, **generate_kwargs, **phrases)
        except SentenceTooLong as error:  # its index among all the sources, not in the batch
            raise SentenceTooLong(error.detail, len(hypotheses) + error.row) from None
    lowercase = lowercase or writes_lowercase(tokenizer)
    scores = translation_scores(hypotheses, references, lowercase=lowercase)
    if constraints is not None:
        wanted = [(text, phrases) for text, phrases in zip(hypotheses, constraints, strict=True) if phrases]
        met = sum(not missing_phrases(tokenizer, text, phrases) for text, phrases in wanted)
        scores["constraints_met"] = {"sentences_with_constraints": len(wanted), "met": met}
    return scores, hypotheses


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


def _read_folder_split(folder: Path, stem: str, args: SimpleNamespace) -> EvaluationSet | None:
    """The pairs of files `{stem}.*` in `folder` (`api.corpus.read_folder_split`), or None if none."""
    from ..api.hub import local_or_hub

    found = read_folder_split(folder, stem, args.split, args.source_lang, args.target_lang)
    if found is None:
        return None
    sources, references, source_lang, target_lang = found
    details = {"data": local_or_hub(str(folder)), "split": args.split, "file_stem": stem}
    details |= {"source_lang": source_lang, "target_lang": target_lang}
    return EvaluationSet(sources, references, f"the {args.split} split of {folder}", details)


def _loaded_split(args: SimpleNamespace) -> EvaluationSet:
    """The split through the training recipe's loader (embedded task, save_to_disk folder, dataset name)."""
    from ..api.hub import EMBEDDED_TASK, local_or_hub
    from ..training.data import load_parallel_data

    parallel = load_parallel_data(args.data, args.source_lang, args.target_lang, args.data_config)
    if args.split not in parallel.splits:
        raise DataError(_no_split(args.data, args.split, sorted(parallel.splits)))
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


def _no_split(data: str | None, split: str, present: list[str]) -> str:
    stems = "/".join(SPLIT_STEMS[split])
    return (
        f"--data {data}: no {split} split (looked for files {stems}.*, or a dataset split named {stems}; "
        f"{'it has ' + ', '.join(present) if present else 'it has none'}); choose another --split, or give "
        "--sources_file and --references_file"
    )


def load_evaluation_set(args: SimpleNamespace) -> EvaluationSet:
    """The sentences and references `args` name (see the module docstring); DataError naming what is wrong."""
    if args.hypotheses_file or args.sources_file:
        first = Path(args.hypotheses_file or args.sources_file)
        key = "hypotheses_file" if args.hypotheses_file else "sources_file"
        details = {key: str(first), "references_file": args.references_file}
        if args.hypotheses_file:  # a translation may be empty; a reference may not
            references, hypotheses = paired_sentences(
                text_pair_rows(args.references_file, str(first)),
                lambda number: f"{args.references_file}:{number}",
                empty_targets=True,
            )
            return EvaluationSet(None, references, str(first), details, hypotheses=hypotheses)
        sources, references = paired_sentences(
            text_pair_rows(str(first), args.references_file),
            lambda number: f"{first}:{number} / {args.references_file}:{number}",
        )
        return EvaluationSet(sources, references, str(first), details)
    folder = Path(args.data) if args.data else None
    if folder is not None and folder.is_dir() and not (folder / "dataset_dict.json").is_file():
        for stem in split_stems(folder, args.split):
            if (found := _read_folder_split(folder, stem, args)) is not None:
                return found
        if not any(folder.iterdir()):
            raise DataError(_no_split(args.data, args.split, []))
    return _loaded_split(args)


# -- attn evaluate ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`attn evaluate`: see the module docstring and `attn evaluate --help`."""
    return run_command("attn evaluate", lambda: _evaluate(options.parse_flags(evaluate_parser(), argv)))


def _inputs(args: SimpleNamespace) -> dict[str, str | None]:
    """The files and folders `attn evaluate` reads, by flag: its outputs may be none of them."""
    names = ("data", "sources_file", "references_file", "hypotheses_file")
    return {**options.model_inputs(args), **{f"--{name}": getattr(args, name) for name in names}}


def _evaluate(args: SimpleNamespace) -> int:
    from ..api.ensemble import AttnEnsemble, describe_ensemble
    from ..api.hub import decoding_settings
    from ..api.metrics import translation_scores
    from ..api.translation import SentenceTooLong, TranslateError

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
        overrides = options.steering_options(args)  # --bad_words read before the model loads
        constraints = options.per_sentence_constraints(args, tests.sources)
        engine = options.load_engine(args)
        model = engine.model
        if constraints is not None:
            options.check_constraints(args, model, overrides)
        engine.check({**overrides, **({} if constraints is None else {"constraints": []})})
        try:
            scores, hypotheses = evaluate(
                engine,
                None,
                tests.sources,
                tests.references,
                args.batch_size,
                progress=args.progress,
                lowercase=args.lowercase,
                constraints=constraints,
                **overrides,
            )
        except SentenceTooLong as error:
            raise TranslateError(f"{tests.where}, pair {error.row + 1}: the source sentence {error.detail}") from None
        settings = decoding_settings(model.generation_config, overrides)  # as attn train records it, for attn push
        named = describe_ensemble(model) if isinstance(model, AttnEnsemble) else args.model[0]
        result = {"model": named, **tests.details, "sentences": len(hypotheses), **scores, "generation": settings}
        result["engine"] = engine.describe(overrides)  # the engine that ran, and under auto why
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
