"""`attn translate`: translate text with a trained model, one translation (or an n-best block) per input line.

Built on `modeling_attn.api.translation` (`load_model`, `translate_batch`, `translate_nbest`: the model's own
`generation_config` unless a setting is given on the command line); the flags follow the `attn` convention
(`modeling_attn.cli.parser.CommandParser`). `attn translate --model DIR_OR_REPO [TEXT ... | --input FILE | stdin]`
writes one translation per input line, on stdout or atomically to `--output FILE`; besides:
- `--num_return_sequences N`: an n-best list, `i ||| hypothesis ||| score` (`translation.translate_nbest`);
- `--do_sample` with `--top_k/--top_p/--temperature`, repeatable with `--seed`;
- `--threads N` (torch's CPU threads) and `--quantize int8` (`modeling_attn.api.quantize`);
- attention pictures (`--attention-png`, `--self-attention-png`) and a bertviz JSON (`--attention-json`);
- `--align`: word alignments as Pharaoh pairs `i-j` after ` ||| `, or a JSON line with soft weights
  (`modeling_attn.api.alignment`).
docs/translate-evaluate.md and docs/alignment.md describe each. Bad input (a missing or corrupt model folder, a
tokenizer larger than the vocabulary, a missing device, a file that is not UTF-8, a sentence longer than the
position table) stops with a message naming it.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..api.choices import ALIGN_FORMATS, ALIGNMENT_MODES, STACKS, WORD_PATTERNS
from ..api.corpus import decode_lines
from ..api.outputs import check_output_file, output_file
from ..api.values import COUNT, POSITIVE, Range
from .document import DocumentArguments, check_document_flags, document_mode, translate_document_input
from .options import (
    ConstraintArguments,
    DecodingArguments,
    EnsembleArguments,
    RuntimeArguments,
    check_constraints,
    load_engine,
    model_inputs,
    parse_flags,
    read_lines,
    shown_defaults,
    steering_options,
    terminated_as_exit,
)
from .parser import CommandParser
from .report import run_command

if TYPE_CHECKING:  # the rest of the API imports torch: imported where the command runs, after parsing
    from ..api.heatmaps import TranslationAttention

SAMPLING_FLAGS = ("top_k", "top_p", "temperature", "seed")
PICTURE_FLAGS = ("attention_png", "self_attention_png", "attention_json")
TOP_P = Range(low=0, high=1, low_open=True)  # nucleus mass: (0, 1]


@dataclass
class TranslateArguments:
    """`attn translate`'s own flags."""

    _argument_group_name = "input and output"

    model: str = field(
        metadata={
            "help": "Model folder or Hub repo (with its tokenizer); repeat it (--model A --model B) for an ensemble.",
            "aliases": ["--model_name_or_path"],
            "action": "append",
        }
    )
    input: str | None = field(
        default=None,
        metadata={"help": "File of sentences, one per line ('-': stdin; default: the TEXT arguments, else stdin)."},
    )
    output: str | None = field(
        default=None, metadata={"help": "Write the translations to this file (atomically) instead of stdout."}
    )
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Replace an existing --output or attention picture file that attn did not write (its own "
            "earlier outputs are replaced without it)."
        },
    )
    num_return_sequences: int | None = field(
        default=None,
        metadata={
            "help": "Write an n-best list: N lines `i ||| hypothesis ||| score` per input line, best first.",
            "range": COUNT,
        },
    )
    prefix: str | None = field(
        default=None,
        metadata={"help": "Every translation starts with this text; the search goes on after it.", "metavar": "TEXT"},
    )
    prefix_file: str | None = field(
        default=None,
        metadata={
            "help": "File of target prefixes, one per input line (an empty line: none), as --prefix for that line.",
            "metavar": "FILE",
        },
    )


@dataclass
class SamplingArguments:
    _argument_group_name = "sampling"

    do_sample: bool = field(
        default=False, metadata={"help": "Sample instead of searching (with one beam unless --num_beams is given)."}
    )
    top_k: int | None = field(default=None, metadata={"help": "Sample from the k most likely tokens.", "range": COUNT})
    top_p: float | None = field(
        default=None, metadata={"help": "Nucleus sampling: the smallest set with mass p.", "range": TOP_P}
    )
    temperature: float | None = field(
        default=None, metadata={"help": "Divide the logits by this before sampling.", "range": POSITIVE}
    )
    seed: int | None = field(
        default=None,
        metadata={
            "help": "Random seed: the same seed gives the same samples.",
            "range": Range(0, 2**32 - 1, integer=True),
        },
    )

    def __post_init__(self) -> None:
        given = [f"--{name}" for name in SAMPLING_FLAGS if getattr(self, name) is not None]
        if given and not self.do_sample:
            raise ValueError(f"{', '.join(given)}: a sampling setting, with no --do_sample; add --do_sample")


@dataclass
class PictureArguments:
    _argument_group_name = "attention pictures (FILE pictures the first non-empty sentence; {n} in FILE: sentence n)"

    attention_png: str | None = field(default=None, metadata={"help": "Cross-attention heatmap.", "metavar": "FILE"})
    attention_mode: str = field(
        default="average",
        metadata={
            "help": "Average over layers and heads, or one panel per layer averaged over heads.",
            "choices": ALIGNMENT_MODES,
        },
    )
    self_attention_png: str | None = field(
        default=None,
        metadata={
            "help": "Transformer self-attention head grids, as FILE's name + .encoder / .decoder.",
            "metavar": "FILE",
        },
    )
    attention_json: str | None = field(
        default=None, metadata={"help": "Tokens and attention in bertviz's layout.", "metavar": "FILE"}
    )


@dataclass
class AlignmentArguments:
    _argument_group_name = "word alignments"

    align: bool = field(
        default=False,
        metadata={"help": "Write each translation with its word alignment, in the --align_format."},
    )
    align_format: str = field(
        default="hard",
        metadata={
            "help": "hard: `translation ||| i-j ...` (Pharaoh pairs: source word i, target word j); soft: JSON lines "
            "with the weights.",
            "choices": ALIGN_FORMATS,
        },
    )
    align_words: str = field(
        default="whitespace",
        metadata={
            "help": "What a word is: text between spaces, or runs of letters and digits with the punctuation "
            "around them (alnum).",
            "choices": tuple(WORD_PATTERNS),
        },
    )


TRANSLATE_ARGUMENTS = (
    TranslateArguments,
    DecodingArguments,
    SamplingArguments,
    RuntimeArguments,
    EnsembleArguments,
    PictureArguments,
    AlignmentArguments,
    ConstraintArguments,
    DocumentArguments,
)


def translate_parser() -> CommandParser:
    parser = CommandParser(
        TRANSLATE_ARGUMENTS,
        prog="attn translate",
        description="Translate sentences (arguments, --input FILE, or one per line on stdin), one per output line.",
    )
    parser.add_argument(
        "text", nargs="*", metavar="TEXT", help="sentences to translate (default: --input, else stdin)"
    )
    return shown_defaults(parser)


def deprecated_align(prog: str, argv: list[str] | None) -> list[str]:
    """The old spelling `--align hard` / `--align soft` (--align took the format as an optional value) as `--align
    --align_format FORMAT`, with a deprecation message on stderr."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for index, argument in enumerate(argv[:-1]):
        if argument == "--align" and argv[index + 1] in ALIGN_FORMATS:
            form = argv[index + 1]
            print(f"{prog}: --align {form} is deprecated; write --align --align_format {form}", file=sys.stderr)
            return [*argv[:index], "--align", "--align_format", form, *argv[index + 2 :]]
    return argv


# -- input -----------------------------------------------------------------------------------------------------


def _reads_stdin(args: SimpleNamespace) -> bool:
    return not args.text and args.input in (None, "-")


def _input_lines(args: SimpleNamespace, files: contextlib.ExitStack) -> tuple[Iterable[str], int | None]:
    """The sentences and, when known, their count (for the progress bar)."""
    if args.text:
        return args.text, len(args.text)
    if not _reads_stdin(args):
        handle = files.enter_context(open(args.input, "rb"))  # noqa: SIM115 (the stack closes it)
        total = sum(1 for _ in handle)
        handle.seek(0)
        return (line for _, line in decode_lines(handle, args.input)), total
    if (stream := getattr(sys.stdin, "buffer", None)) is None:  # a text stream put in sys.stdin's place
        return (line.rstrip("\r\n") for line in sys.stdin), None
    return (line for _, line in decode_lines(stream, "stdin")), None


# -- attention pictures ----------------------------------------------------------------------------------------


class Pictures:
    """Which sentences get attention pictures: with `{n}` in a file name, every non-empty sentence n (0-based);
    without, the first non-empty sentence. An empty sentence has no attention: it is skipped with a note on stderr."""

    def __init__(self, args: SimpleNamespace):
        self.args = args
        self.templates = [t for t in (args.attention_png, args.self_attention_png, args.attention_json) if t]
        self.first_pending = any("{n}" not in template for template in self.templates)

    def wanted(self) -> bool:
        """Whether the next batch needs attention weights."""
        return self.first_pending or any("{n}" in template for template in self.templates)

    def _path(self, template: str | None, number: int, first: bool) -> Path | None:
        if template is None:
            return None
        if "{n}" in template:
            return Path(template.replace("{n}", str(number)))
        return Path(template) if first else None

    def files(self, number: int, first: bool) -> list[tuple[str, Path, str | None]]:
        """The (flag, file, self-attention stack) of each file written for sentence `number` (`first`: the first
        non-empty sentence)."""
        found = []
        for flag in PICTURE_FLAGS:
            if not (path := self._path(getattr(self.args, flag), number, first)):
                continue
            if flag != "self_attention_png":
                found.append((flag, path, None))
                continue
            found += [(flag, path.with_name(f"{path.stem}.{stack}{path.suffix}"), stack) for stack in STACKS]
        return found

    def check(self, inputs: dict[str, str | None]) -> None:
        """Before any work: a picture flag's format, and each file it would write as `output_file` checks it (never
        an input or inside one, never over a file attn did not write unless --overwrite; its folder exists)."""
        from ..api.heatmaps import picture_formats
        from ..api.translation import TranslateError

        for flag in ("attention_png", "self_attention_png"):
            if template := getattr(self.args, flag):
                suffix = Path(template).suffix.lstrip(".").lower()
                if suffix not in (formats := picture_formats()):
                    raise TranslateError(
                        f"--{flag} {template}: {suffix or 'no suffix'} is not a picture format; "
                        f"end the name with one of .{', .'.join(sorted(formats))}"
                    )
        for flag, path, _ in self.files(0, first=True):
            check_output_file(path, inputs, self.args.overwrite, f"--{flag}")

    def write(self, number: int, attention: TranslationAttention | None, inputs: dict[str, str | None]) -> None:
        from ..api.heatmaps import bertviz_json, plot_alignment, plot_self_attention, save_figure

        if attention is None:
            if any("{n}" in template for template in self.templates):
                print(f"attn translate: sentence {number} is empty: no attention picture for it", file=sys.stderr)
            return
        first, self.first_pending = self.first_pending, False
        for flag, path, stack in self.files(number, first):
            with output_file(path, inputs, self.args.overwrite, f"--{flag}", binary=True) as handle:
                if flag == "attention_json":
                    handle.write(bertviz_json(attention).encode("utf-8"))
                    continue
                figure = (
                    plot_alignment(attention, mode=self.args.attention_mode)
                    if stack is None
                    else plot_self_attention(attention, stack)
                )
                save_figure(figure, handle, path.suffix.lstrip(".").lower())

    def finish(self) -> None:
        if self.first_pending:
            print("attn translate: every sentence was empty: no attention picture written", file=sys.stderr)


# -- attn translate --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`attn translate`: see the module docstring and `attn translate --help`."""
    return run_command("attn translate", lambda: translate(argv))


def translate(argv: list[str] | None) -> int:
    args = parse_flags(translate_parser(), deprecated_align("attn translate", argv))
    with terminated_as_exit() if args.output else contextlib.nullcontext():
        return _translate(args)


def _check_combinations(args: SimpleNamespace) -> None:
    from ..api.ensemble import member_paths
    from ..api.translation import TranslateError

    if args.text and args.input is not None:
        raise TranslateError("give the sentences as arguments or with --input, not both")
    if args.input not in (None, "-") and not Path(args.input).is_file():
        state = "a folder" if Path(args.input).is_dir() else "no such file"
        raise TranslateError(f"--input {args.input}: {state}; give a file of sentences, one per line ('-': stdin)")
    if args.prefix is not None and args.prefix_file is not None:
        raise TranslateError("--prefix gives every sentence one prefix, --prefix_file one per line: give one of them")
    pictures = [flag for flag in PICTURE_FLAGS if getattr(args, flag)]
    if pictures and args.num_return_sequences is not None:
        raise TranslateError(f"--{pictures[0]} pictures one translation per sentence; drop --num_return_sequences")
    if args.align and args.num_return_sequences is not None:
        raise TranslateError("--align aligns one translation per sentence; drop --num_return_sequences")
    if pictures and len(member_paths(args.model, args.last_checkpoints)) > 1:
        raise TranslateError(
            f"--{pictures[0]}: pictures show one model's attention, and an ensemble decodes with several; give one "
            "--model (an ensemble's --align averages its members' alignment attention)"
        )
    check_document_flags(args)


def _torch_only(args: SimpleNamespace) -> str | None:
    """The first flag given that only the torch engine serves (attention pictures, constraints), or None. (`--align`
    is the engine's to refuse: ctranslate2 has word alignments, onnxruntime has not.)"""
    if args.constraints or args.glossary:
        return "constraints (--constraints/--glossary)"
    return next((f"--{flag.replace('_', '-')}" for flag in PICTURE_FLAGS if getattr(args, flag)), None)


class Prefixes:
    """The target prefix of each input line: `--prefix` for every line, or `--prefix_file`'s line (checked against
    the input's line count: before any work where it is known, else when the input or the file runs out)."""

    def __init__(self, args: SimpleNamespace, total: int | None):
        from ..api.translation import TranslateError

        self.args, self.lines = args, None
        if args.prefix_file is not None:
            self.lines = read_lines(args.prefix_file, "--prefix_file", blank="no prefix")
            if total is not None and total != len(self.lines):
                raise TranslateError(self.mismatch(total))

    def mismatch(self, total: int) -> str:
        where = "arguments" if self.args.text else "lines on stdin" if _reads_stdin(self.args) else "lines"
        source = "" if self.args.text or _reads_stdin(self.args) else f" in {self.args.input}"
        return (
            f"--prefix_file {self.args.prefix_file} has {len(self.lines)} line(s), the input {total} {where}{source}: "
            "give one prefix per input line (an empty line: none)"
        )

    def options(self, number: int, count: int) -> dict[str, Any]:
        """The `target_prefix` option of the `count` sentences from sentence `number` (none without the flags)."""
        from ..api.translation import TranslateError

        if self.args.prefix is not None:
            return {"target_prefix": [self.args.prefix] * count}
        if self.lines is None:
            return {}
        if number + count > len(self.lines):
            raise TranslateError(self.mismatch(number + count) + " (or more)")
        return {"target_prefix": self.lines[number : number + count]}

    def finish(self, total: int) -> None:
        from ..api.translation import TranslateError

        if self.lines is not None and total != len(self.lines):
            raise TranslateError(self.mismatch(total))


class Constraints:
    """Each input line's target phrases: its line of --constraints and the target terms of the --glossary entries
    its source contains (`api/constraints.py`); None without either flag. The lines of the file must match the input
    lines one for one (checked before any work when the input's length is known, else as it runs out)."""

    def __init__(self, args: SimpleNamespace, total: int | None):
        from ..api.constraints import Glossary, read_constraints

        self.args, self.total = args, total
        self.lines = read_constraints(args.constraints, total) if args.constraints else None
        self.glossary = Glossary.read(args.glossary) if args.glossary else None

    def __bool__(self) -> bool:
        return self.lines is not None or self.glossary is not None

    def for_batch(self, batch: list[str], number: int) -> list[list[str]]:
        """The phrases of the batch whose first sentence is input line `number` + 1."""
        found = []
        for offset, sentence in enumerate(batch):
            phrases = []
            if self.lines is not None:
                if number + offset >= len(self.lines):
                    self._count_error(None)
                phrases += self.lines[number + offset]
            if self.glossary is not None:
                phrases += self.glossary.targets(sentence)
            found.append(phrases)
        return found

    def finish(self, count: int) -> None:
        if self.lines is not None and count != len(self.lines):
            self._count_error(count)

    def _count_error(self, count: int | None) -> None:
        from ..api.constraints import ConstraintError

        inputs = f"{count} input sentences" if count is not None else f"more than {len(self.lines)} input sentences"
        raise ConstraintError(
            f"--constraints {self.args.constraints}: {len(self.lines)} lines for {inputs}; give one line per input "
            "sentence (an empty line: no constraint)"
        )

    def report(self, engine: Any, batch_constraints: list[list[str]], translations: list[str], where) -> None:
        """A line on stderr for each translation that lacks a phrase of its sentence (it did not fit within the
        length limit); `where(offset)` names the input line."""
        from ..api.constraints import missing_phrases

        for offset, (phrases, text) in enumerate(zip(batch_constraints, translations, strict=True)):
            if phrases and (missing := missing_phrases(engine.tokenizer, text, phrases)):
                listed = ", ".join(repr(phrase) for phrase in missing)
                print(
                    f"attn translate: {where(offset)}: the translation lacks the constraint {listed} (it did not fit "
                    "within the length limit)",
                    file=sys.stderr,
                )


def _translate_batch(
    engine: Any, batch: list[str], number: int, request: tuple[SimpleNamespace, Pictures, dict[str, Any]]
) -> tuple[str, list[TranslationAttention | None] | None]:
    """The output of one batch whose first sentence is sentence `number` (translations, n-best blocks or aligned
    lines), and the attention of each sentence when pictures want it."""
    from ..api.alignment import aligned_line
    from ..api.translation import translate_batch

    args, pictures, overrides = request  # `overrides`: this batch's options (`Prefixes.options` included)
    if args.num_return_sequences:
        nbest = engine.translate_nbest(batch, args.num_return_sequences, **overrides)
        text = "".join(
            f"{number + offset} ||| {hypothesis.text} ||| {hypothesis.score:.4f}"
            f"{_met_field(engine, overrides, offset, hypothesis.text)}\n"
            for offset, block in enumerate(nbest)
            for hypothesis in block
        )
        return text, None
    if args.align:
        aligned = engine.translate_aligned(batch, words=args.align_words, **overrides)
        return "".join(aligned_line(item, args.align_format) for item in aligned), [item.attention for item in aligned]
    if pictures.templates:  # the torch engine (`_torch_only`), asked for attention weights
        wanted = pictures.wanted()
        translations, attentions = translate_batch(
            engine.model, engine.tokenizer, batch, output_attentions=wanted, **overrides
        )
    else:
        translations, attentions = engine.translate_batch(batch, **overrides), None
    return "".join(f"{translation}\n" for translation in translations), attentions


def _met_field(engine: Any, overrides: dict[str, Any], offset: int, text: str) -> str:
    """With constraints, an n-best line's last field: ` ||| met`, or ` ||| unmet: ` and the phrases the hypothesis
    lacks, tab-separated."""
    if "constraints" not in overrides:
        return ""
    from ..api.constraints import missing_phrases

    missing = missing_phrases(engine.tokenizer, text, overrides["constraints"][offset])
    return " ||| unmet: " + "\t".join(missing) if missing else " ||| met"


def _engine_and_options(args: SimpleNamespace, pictures: Pictures) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The engine, opened and checked before any output: with the call's options (`steering_options`, --bad_words
    read before the model loads) and the per-sentence ones it must have (a prefix, constraints) as placeholders."""
    from ..api.translation import TranslateError, check_nbest
    from ..registry import MODEL_TYPES

    overrides = steering_options(args)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    engine = load_engine(args, eager=bool(pictures.templates or args.align), torch_only=_torch_only(args))
    model = engine.model
    if args.self_attention_png and not MODEL_TYPES[model.config.model_type].self_attention:
        raise TranslateError(
            f"--self-attention-png: {args.model[0]} is an RNN model, with no self-attention to picture"
        )
    steering = {"target_prefix": []} if args.prefix is not None or args.prefix_file is not None else {}
    if args.constraints or args.glossary:
        check_constraints(args, model, overrides)
        steering["constraints"] = []
    engine.check({**overrides, **steering})  # a setting a named engine cannot apply: before any output
    if args.num_return_sequences:
        check_nbest(model, args.num_return_sequences, overrides)  # before any output
    if args.seed is not None:
        engine.seed(args.seed)
    return engine, overrides, steering


def _translate(args: SimpleNamespace) -> int:
    from ..api.constraints import ConstraintWarning
    from ..api.heatmaps import figure_class
    from ..api.translation import SentenceTooLong, TranslateError, batches

    _check_combinations(args)
    pictures = Pictures(args)
    if args.attention_png or args.self_attention_png:
        figure_class()  # fail before translating when matplotlib is missing
    inputs = {"--input": None if args.input in (None, "-") else args.input, **model_inputs(args)}
    pictures.check({**inputs, "--output": args.output})
    engine, overrides, steering = _engine_and_options(args, pictures)
    if document_mode(args):
        return translate_document_input(args, engine, overrides, inputs)
    interactive = _reads_stdin(args) and sys.stdin.isatty()
    # A person typing at a terminal wants each line back at once, not after a full batch.
    batch_size = 1 if interactive else args.batch_size
    with contextlib.ExitStack() as files:
        lines, total = _input_lines(args, files)
        prefixes, constraints = Prefixes(args, total), Constraints(args, total)
        out = files.enter_context(output_file(args.output, inputs, args.overwrite)) if args.output else sys.stdout
        progress = None
        if args.progress and (total is not None or not interactive):
            from tqdm.auto import tqdm

            runs = engine.label_for({**overrides, **steering}, alignments=args.align)  # the engine that runs
            progress = files.enter_context(
                tqdm(total=total, unit="sent", desc=f"translating with {runs}", file=sys.stderr)
            )
        number = 0

        def where(line: int) -> str:
            return (
                f"argument {line}" if args.text else f"stdin:{line}" if _reads_stdin(args) else f"{args.input}:{line}"
            )

        for batch in batches(lines, batch_size):
            options = {**overrides, **prefixes.options(number, len(batch))}
            if constraints:
                options["constraints"] = constraints.for_batch(batch, number)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConstraintWarning)  # reported below, naming the input line
                    text, attentions = _translate_batch(engine, batch, number, (args, pictures, options))
            except SentenceTooLong as error:
                raise TranslateError(f"{where(number + error.row + 1)}: the sentence {error.detail}") from None
            if constraints and not args.num_return_sequences:
                translations = text.split("\n")[: len(batch)]
                constraints.report(
                    engine, options["constraints"], translations, lambda i, first=number: where(first + i + 1)
                )
            # The bar and the translations may share a terminal: clear the bar while writing.
            with progress.external_write_mode(file=out) if progress is not None else contextlib.nullcontext():
                out.write(text)
                if out is sys.stdout:
                    out.flush()
            for offset, attention in enumerate(attentions or []):
                pictures.write(number + offset, attention, {**inputs, "--output": args.output})
            number += len(batch)
            if progress is not None:
                progress.update(len(batch))
        prefixes.finish(number)
        constraints.finish(number)
        if pictures.templates:
            pictures.finish()
    return 0


__all__ = [
    "AlignmentArguments",
    "ConstraintArguments",
    "PictureArguments",
    "SamplingArguments",
    "TranslateArguments",
    "main",
    "translate_parser",
]
