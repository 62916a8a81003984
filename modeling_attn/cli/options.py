"""The flags and loaders that several `attn` commands share: decoding, device and speed, ensembles, `load_models`.

`attn translate`, `attn evaluate`, `attn serve` and `attn explain` declare their own flags in their own modules and
take these from here (as fairseq keeps its shared argument groups in `options.py`), so that no command module
imports another. `parse_flags` parses a command's dataclasses into one namespace (`parser.CommandParser`);
`load_models` loads the `--model` flags as one model or an ensemble (`modeling_attn.api.ensemble`), quantized by
`--quantize` (`modeling_attn.api.quantize`); `load_engine` opens them on the `--engine` (`modeling_attn.api.engines`).
The flags import no torch (their choices: `modeling_attn.api.choices`); the loaders import it when they run.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..api.choices import COMBINATIONS, ENGINES, INT8_ENGINES, QUANTIZE_CHOICES
from ..api.values import COUNT, POSITIVE
from .parser import CommandParser

if TYPE_CHECKING:
    from ..api.engines import Engine


@dataclass
class DecodingArguments:
    """Flags shared by `attn translate` and `attn evaluate`."""

    _argument_group_name = "decoding"

    batch_size: int = field(default=32, metadata={"help": "Sentences per generate() call.", "range": COUNT})
    num_beams: int | None = field(
        default=None, metadata={"help": "Beam size (default: the model's generation_config).", "range": COUNT}
    )
    length_penalty: float | None = field(
        default=None, metadata={"help": "Beam search length penalty (default: the model's generation_config)."}
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Longest translation in tokens (default: the model's generation_config).", "range": COUNT},
    )
    no_repeat_ngram_size: int | None = field(
        default=None,
        metadata={"help": "No n-gram of this many tokens twice in a translation (generate()'s).", "range": COUNT},
    )
    repetition_penalty: float | None = field(
        default=None,
        metadata={
            "help": "Penalize the tokens a translation already has by this factor (above 1: fewer repeats; CTRL's "
            "penalty, generate()'s).",
            "range": POSITIVE,
        },
    )
    min_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Shortest translation in tokens, the end token not counted.", "range": COUNT},
    )
    bad_words: str | None = field(
        default=None,
        metadata={
            "help": "File of words or phrases no translation may contain, one per line (UTF-8; each tokenized as "
            "target text, so a word bans its tokens in that order).",
            "metavar": "FILE",
        },
    )
    progress: bool = field(default=True, metadata={"help": "A progress bar on stderr (--no_progress: none)."})


@dataclass
class ConstraintArguments:
    _argument_group_name = "constraints (docs/translate-evaluate.md, 'Constraints and glossaries')"

    constraints: str | None = field(
        default=None,
        metadata={
            "help": "File of target phrases each translation must contain: one line per input line, phrases "
            "tab-separated (an empty line: none).",
            "metavar": "FILE",
        },
    )
    glossary: str | None = field(
        default=None,
        metadata={
            "help": "TSV of `source term<TAB>target term`: a source sentence with the term (case-sensitive, whole "
            "words) must have the target term in its translation.",
            "metavar": "FILE",
        },
    )


@dataclass
class RuntimeArguments:
    """Where and how fast the model runs: flags shared by `attn translate`, `attn evaluate` and `attn serve`."""

    _argument_group_name = "device and speed"

    engine: str = field(
        default="auto",
        metadata={
            "help": "What decodes (modeling_attn.api.engines): torch, the model itself; ctranslate2 or onnxruntime, "
            "an export of it made once per weights and kept in attn's cache; auto: the fastest installed engine that "
            "can do what was asked, torch for the rest.",
            "choices": list(ENGINES),
        },
    )
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1... (default: cuda if available)."})
    threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads for every call (torch.set_num_threads, CTranslate2's and onnxruntime's intra-op "
            "threads). Default: chosen per engine (docs/speed.md, 'Threads'): CTranslate2 one thread per core, each "
            "with its share of a batch; torch one thread per 64 decoder rows of a batch, at most its own count.",
            "range": COUNT,
        },
    )
    quantize: str | None = field(
        default=None,
        metadata={
            "help": "int8: dynamic int8 Linear layers, on the CPU (modeling_attn.api.quantize); int8_rowwise: "
            "one scale per row: slower, translations (nearly) independent of the batch.",
            "choices": list(QUANTIZE_CHOICES),
        },
    )
    int8_engine: str | None = field(
        default=None,
        metadata={
            "help": "torch's int8 kernels for --quantize int8 (default: auto, onednn on a CPU with AMX, else "
            "torch's own).",
            "choices": list(INT8_ENGINES),
        },
    )

    def __post_init__(self) -> None:
        if self.quantize is not None:  # a GPU with --quantize: one line, before any loading
            from ..api.quantize import quantize_device

            quantize_device(self.device, self.quantize)
        if self.int8_engine is not None and self.quantize != "int8":
            raise ValueError(
                f"--int8_engine {self.int8_engine}: picks the kernels of --quantize int8, which is not given; "
                "add --quantize int8 or drop --int8_engine"
            )


@dataclass
class EnsembleArguments:
    """Several models decoding as one (`modeling_attn.api.ensemble`): flags shared by `attn translate`, `attn evaluate`
    and `attn serve`."""

    _argument_group_name = "ensembles (several --model)"

    ensemble_weights: str | None = field(
        default=None,
        metadata={"help": "One weight per model, comma-separated (2,1; default: equal).", "metavar": "W,W,..."},
    )
    ensemble_combine: str = field(
        default="log_linear",
        metadata={
            "help": "How the members' next-token distributions combine: log_linear, the weighted mean of the "
            "log-probabilities (renormalised); linear, the log of the weighted mean of the probabilities.",
            "choices": list(COMBINATIONS),
        },
    )
    last_checkpoints: int | None = field(
        default=None,
        metadata={
            "help": "Decode with the last K checkpoint-<step> folders of the training run --model as the members.",
            "range": COUNT,
            "metavar": "K",
        },
    )


def shown_defaults(parser: CommandParser) -> CommandParser:
    """`parser` with "(default: False)" also left out of `--help` (CommandParser leaves out None): a switch not given
    is off, as its help says. (argparse appends the default to any help without a `%(default)` field; an empty
    `%(default).0s` is one.)"""
    for action in parser._actions:
        if action.help and "%(default" not in action.help and action.default is False:
            action.help += "%(default).0s"
        if "--no_progress" in action.option_strings:
            action.help = "No progress bar.%(default).0s"
    return parser


def parse_flags(parser: CommandParser, argv: list[str] | None) -> SimpleNamespace:
    """The command's dataclasses (and positional arguments) as one namespace."""
    values: dict[str, Any] = {}
    # the dataclasses, then a Namespace of the positional arguments if any
    for parsed in parser.parse(argv):
        values.update(vars(parsed))
    return SimpleNamespace(**values)


def read_lines(path: str, flag: str, blank: str | None = None) -> list[str]:
    """The lines of the file a flag names (UTF-8); FlagError for a missing file, DataError for bad bytes, and, unless
    `blank` says what a blank line means, FlagError naming the first blank line."""
    from pathlib import Path

    from ..api.corpus import decode_lines
    from ..api.errors import FlagError

    if not Path(path).is_file():
        raise FlagError(f"{flag} {path}: {'a folder' if Path(path).is_dir() else 'no such file'}")
    with open(path, "rb") as handle:
        lines = [line for _, line in decode_lines(handle, path)]
    if blank is None and (empty := next((n for n, line in enumerate(lines, 1) if not line.strip()), None)):
        raise FlagError(f"{flag} {path}:{empty}: an empty line; give one word or phrase per line")
    return lines


def steering_options(args: SimpleNamespace) -> dict[str, Any]:
    """generate()'s options from the command-line flags (`translation.generation_overrides`) with the banned words
    of `--bad_words FILE`."""
    from ..api.translation import generation_overrides

    overrides = generation_overrides(args)
    if getattr(args, "bad_words", None) is not None:
        overrides["bad_words"] = tuple(read_lines(args.bad_words, "--bad_words"))
    return overrides


def check_constraints(args: SimpleNamespace, model: Any, overrides: dict[str, Any]) -> None:
    """TranslateError before any work for --constraints/--glossary with settings that are not a beam search (or with
    --align, which does not take constraints)."""
    from ..api.translation import TranslateError

    flag = "--constraints" if args.constraints else "--glossary"
    if getattr(args, "do_sample", False):
        raise TranslateError(f"{flag}: constrained decoding is a beam search; drop --do_sample")
    if getattr(args, "align", None):
        raise TranslateError(f"{flag}: --align does not take constraints; drop one of them")
    beams = overrides.get("num_beams") or model.generation_config.num_beams or 1
    if beams < 2:
        raise TranslateError(
            f"{flag}: constrained decoding is a beam search and the model decodes with num_beams={beams}; give "
            "--num_beams 2 or more"
        )


def per_sentence_constraints(args: SimpleNamespace, sources: list[str]) -> list[list[str]] | None:
    """Each source's target phrases from `--constraints` (its line; ConstraintError unless one line per source) and
    `--glossary` (the target terms of the source terms it contains); None without either flag."""
    if not (args.constraints or args.glossary):
        return None
    from ..api.constraints import Glossary, read_constraints

    lines = read_constraints(args.constraints, len(sources)) if args.constraints else [[] for _ in sources]
    glossary = Glossary.read(args.glossary) if args.glossary else None
    return [line + (glossary.targets(source) if glossary else []) for line, source in zip(lines, sources, strict=True)]


def model_inputs(args: SimpleNamespace) -> dict[str, str]:
    """The model folders an output must keep away from, by flag (`--model`, `--model 2`, ... for an ensemble)."""
    return {f"--model{f' {n + 1}' if n else ''}": path for n, path in enumerate(args.model or [])}


def load_models(args: SimpleNamespace, eager: bool = False, quantized: bool = True) -> tuple[Any, Any]:
    """The model and tokenizer of the --model flags (one model, or an `AttnEnsemble` of several or of the run's
    --last_checkpoints), each member quantized by --quantize unless not `quantized` (`quantize_members` later)."""
    from ..api.ensemble import load_ensemble, member_paths, parse_weights
    from ..api.quantize import quantize_device
    from ..api.translation import load_model

    paths = member_paths(args.model, args.last_checkpoints)
    device = quantize_device(args.device, args.quantize)
    if len(paths) == 1 and args.ensemble_weights is None:
        model, tokenizer = load_model(paths[0], device, eager=eager)
    else:
        weights = parse_weights(args.ensemble_weights, len(paths))
        model, tokenizer = load_ensemble(paths, device, weights, args.ensemble_combine, eager=eager)
    return (quantize_members(model, args) if quantized else model), tokenizer


def load_engine(args: SimpleNamespace, eager: bool = False, torch_only: str | None = None) -> Engine:
    """The --model flags loaded as by `load_models` and opened on the --engine (`engine_for`)."""
    model, tokenizer = load_models(args, eager=eager, quantized=False)
    return engine_for(args, model, tokenizer, torch_only)


def engine_for(
    args: SimpleNamespace, model: Any, tokenizer: Any, torch_only: str | None = None, say: Any = None
) -> Engine:
    """`model` (loaded by `load_models(args, quantized=False)`) on the --engine (`engines.open_engine`), quantized
    by --quantize on that engine. `torch_only`: a flag given that only the torch engine serves (auto then opens
    torch; a named export engine refuses it). `say(line)` is told of an export being made (it takes seconds) and of
    auto's choice; by default a person at a terminal is, and anyone of why auto fell back to torch (one line on
    stderr, a terminal or not: a log or a script sees why it runs slower)."""
    from ..api.engines import TorchEngine, open_engine
    from ..api.ensemble import member_paths

    paths = member_paths(args.model, args.last_checkpoints)
    name = paths[0] if len(paths) == 1 and args.ensemble_weights is None else None
    told = say is not None or sys.stderr.isatty()
    say = say or (lambda line: print(f"attn: {line}", file=sys.stderr))
    flags = (args.engine, args.quantize, args.int8_engine, args.threads)
    engine = open_engine(model, tokenizer, name, *flags, torch_only=torch_only, **({"say": say} if told else {}))
    # auto's fallback to torch, which open_engine tells `say`: said off a terminal too
    if not told and isinstance(engine, TorchEngine) and engine.why is not None:
        say(f"engine: torch (auto: {engine.why})")
    return engine


def quantize_members(model: Any, args: SimpleNamespace) -> Any:
    """The model, or each member of an ensemble, quantized by --quantize (and --int8_engine)."""
    from ..api.ensemble import each_member
    from ..api.quantize import quantize

    return each_member(model, lambda member: quantize(member, args.quantize, args.int8_engine))


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM (kill, a job scheduler) raises SystemExit(143) while the block runs, so that `atomic_output` removes
    its temporary file as it does on Ctrl-C."""

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave the signal alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = [
    "DecodingArguments",
    "EnsembleArguments",
    "RuntimeArguments",
    "engine_for",
    "load_engine",
    "load_models",
    "model_inputs",
    "parse_flags",
    "quantize_members",
    "shown_defaults",
    "terminated_as_exit",
]
