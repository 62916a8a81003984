"""`attn translate` and `attn evaluate`: translate text with a trained model, and score it with sacreBLEU.

Both are built on `modeling_attn.translation` (`load_model`, `translate_batch`: the model's own
`generation_config` unless a setting is given on the command line).
- `translate_main(argv)` is `attn translate --model DIR_OR_REPO [TEXT ... | --input FILE | stdin]`: one
  translation per line on stdout (a progress bar on stderr for files), optionally attention pictures
  (`--attention-png`, `--self-attention-png`) and a bertviz JSON (`--attention-json`) of chosen sentences.
- `evaluate_main(argv)` is `attn evaluate --model M --data D --split test`: translates a split read by the
  training recipe's loader (`training.data.load_parallel_data`, same formats as `attn train --data`) and prints
  BLEU and chrF with their sacreBLEU signatures (`training.metrics.translation_scores`) as JSON.

Bad input stops with a message naming it: a model folder that does not exist or holds a corrupt weights file, a
tokenizer with more tokens than the model's vocabulary, an input file that is not UTF-8 (file and line), a sentence
longer than the Transformer's position table (`max_position_embeddings`; it is refused, never cut silently). On the
command line these end with `attn translate: error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..heatmaps import ALIGNMENT_MODES, TranslationAttention, figure_class
from ..translation import SentenceTooLong, TranslateError, batches, load_model, translate_batch

GENERATION_FLAGS = ("num_beams", "length_penalty", "max_new_tokens")


def generation_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The generation settings given on the command line; the others come from the model's generation_config."""
    return {name: getattr(args, name) for name in GENERATION_FLAGS if getattr(args, name) is not None}


# -- attn translate --------------------------------------------------------------------------------------------


def _picture_path(template: str | None, number: int) -> Path | None:
    """Where the picture of sentence `number` (0-based) goes: every sentence if the template has `{n}`, else the
    first sentence only."""
    if template is None:
        return None
    if "{n}" in template:
        return Path(template.replace("{n}", str(number)))
    return Path(template) if number == 0 else None


def _write_pictures(args: argparse.Namespace, number: int, attention: TranslationAttention | None) -> None:
    from ..heatmaps import plot_alignment, plot_self_attention, save_bertviz_json

    if attention is None:  # an empty line
        return
    if path := _picture_path(args.attention_png, number):
        plot_alignment(attention, mode=args.attention_mode, path=path)
    if path := _picture_path(args.self_attention_png, number):
        for stack in ("encoder", "decoder"):
            plot_self_attention(attention, stack, path=path.with_name(f"{path.stem}.{stack}{path.suffix}"))
    if path := _picture_path(args.attention_json, number):
        save_bertviz_json(attention, path)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder or Hub repo (with its tokenizer)")
    parser.add_argument("--batch_size", type=_positive_int, default=32, help="sentences per generate() call (32)")
    parser.add_argument("--num_beams", type=_positive_int, help="beam size (default: the model's generation_config)")
    parser.add_argument("--length_penalty", type=float, help="beam length penalty (default: generation_config)")
    parser.add_argument(
        "--max_new_tokens", type=_positive_int, help="longest translation (default: generation_config)"
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:1... (default: cuda if available)")


def translate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attn translate",
        description="Translate sentences (arguments, --input FILE, or one per line on stdin), one per output line.",
    )
    parser.add_argument("text", nargs="*", help="sentences to translate (default: --input, else stdin)")
    parser.add_argument("--input", help="file of sentences, one per line ('-' for stdin)")
    _add_model_flags(parser)
    pictures = parser.add_argument_group(
        "attention pictures", "FILE pictures the first sentence; put {n} in FILE to picture every sentence n (0-based)"
    )
    pictures.add_argument("--attention-png", dest="attention_png", metavar="FILE", help="cross-attention heatmap")
    pictures.add_argument(
        "--attention-mode",
        dest="attention_mode",
        choices=ALIGNMENT_MODES,
        default="average",
        help="average over layers and heads (default), or one panel per layer averaged over heads",
    )
    pictures.add_argument(
        "--self-attention-png",
        dest="self_attention_png",
        metavar="FILE",
        help="Transformer self-attention head grids, written as FILE's name + .encoder / .decoder",
    )
    pictures.add_argument(
        "--attention-json", dest="attention_json", metavar="FILE", help="tokens and attention in bertviz's layout"
    )
    return parser


def _input_lines(args: argparse.Namespace, files: contextlib.ExitStack) -> tuple[Iterable[str], int | None]:
    """The sentences and, when known, their count (for the progress bar)."""
    if args.text:
        return args.text, len(args.text)
    if args.input and args.input != "-":
        handle = files.enter_context(open(args.input, "rb"))  # noqa: SIM115 (the stack closes it)
        total = sum(1 for _ in handle)
        handle.seek(0)
        return _decoded_lines(handle, args.input), total
    if (stream := getattr(sys.stdin, "buffer", None)) is None:  # a text stream put in sys.stdin's place
        return (line.rstrip("\r\n") for line in sys.stdin), None
    return _decoded_lines(stream, "stdin"), None


def _decoded_lines(handle, path: str) -> Iterator[str]:
    """The lines of a binary file as UTF-8 text (a leading byte-order mark dropped), naming file and line on bad
    bytes."""
    for number, raw in enumerate(handle, 1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as error:
            raise TranslateError(
                f"{path}:{number}: not valid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1}); "
                "re-encode it as UTF-8"
            ) from None
        yield line.rstrip("\r\n")


def translate_main(argv: list[str] | None = None) -> int:
    """`attn translate`: see `translate_parser`."""
    args = translate_parser().parse_args(argv)
    try:
        return _translate(args)
    except BrokenPipeError:  # the reader went away (`attn translate ... | head`): stop quietly, as Unix tools do
        # Python's recipe: point stdout at devnull so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE
    except (OSError, TranslateError) as error:
        print(f"attn translate: error: {error}", file=sys.stderr)
        return 2


def _translate(args: argparse.Namespace) -> int:
    templates = (args.attention_png, args.self_attention_png, args.attention_json)
    if args.attention_png or args.self_attention_png:
        figure_class()  # fail before translating when matplotlib is missing
    model, tokenizer = load_model(args.model, args.device, eager=any(templates))
    overrides = generation_overrides(args)
    # A person typing at a terminal wants each line back at once, not after a full batch.
    batch_size = 1 if (args.input is None and not args.text and sys.stdin.isatty()) else args.batch_size
    with contextlib.ExitStack() as files:
        lines, total = _input_lines(args, files)
        progress = None
        if total is not None and args.input:
            from tqdm.auto import tqdm

            progress = files.enter_context(tqdm(total=total, unit="sent", desc="translating", file=sys.stderr))
        number = 0
        for batch in batches(lines, batch_size):
            wanted = [_picture_path(template, number + i) for template in templates for i in range(len(batch))]
            try:
                translations, attentions = translate_batch(
                    model, tokenizer, batch, output_attentions=any(wanted), **overrides
                )
            except SentenceTooLong as error:
                line = number + error.row + 1
                from_file = args.input and args.input != "-"
                where = f"{args.input}:{line}" if from_file else f"argument {line}" if args.text else f"stdin:{line}"
                raise TranslateError(f"{where}: the sentence {error.detail}") from None
            for offset, translation in enumerate(translations):
                print(translation, flush=True)
                if attentions is not None:
                    _write_pictures(args, number + offset, attentions[offset])
            number += len(batch)
            if progress is not None:
                progress.update(len(batch))
    return 0


# -- attn evaluate ---------------------------------------------------------------------------------------------


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    references: list[str],
    batch_size: int = 32,
    progress: bool = False,
    **generate_kwargs: Any,
) -> tuple[dict[str, Any], list[str]]:
    """BLEU, chrF, exact match and the sacreBLEU signatures of the model's translations of `sources`, and the
    translations themselves. A model whose tokenizer lowercases is scored case-insensitively (signature `case:lc`)."""
    from training.metrics import translation_scores
    from training.tokenizer import writes_lowercase

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
    return translation_scores(hypotheses, references, lowercase=writes_lowercase(tokenizer)), hypotheses


def evaluate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attn evaluate",
        description="Translate a data split and print BLEU and chrF (sacreBLEU, with signatures) as JSON.",
    )
    _add_model_flags(parser)
    parser.add_argument(
        "--data",
        help="data as `attn train --data` reads it (folder of {split}.{lang} / .tsv / .jsonl, save_to_disk folder, "
        "dataset name); default: the embedded dates task",
    )
    parser.add_argument("--data_config", help="dataset configuration, e.g. de-en for wmt14")
    parser.add_argument("--source_lang", help="source language code (file suffix / JSON key)")
    parser.add_argument("--target_lang", help="target language code")
    parser.add_argument("--split", default="test", choices=["train", "validation", "test"], help="split (test)")
    parser.add_argument("--max_samples", type=_positive_int, help="score only the first N pairs")
    parser.add_argument("--output", help="also write the JSON to this file")
    parser.add_argument("--hypotheses", help="write the translations to this file, one per line")
    return parser


def evaluate_main(argv: list[str] | None = None) -> int:
    """`attn evaluate`: see `evaluate_parser`."""
    from training.data import DataError, load_parallel_data, require_splits

    args = evaluate_parser().parse_args(argv)
    try:
        parallel = load_parallel_data(args.data, args.source_lang, args.target_lang, args.data_config)
        require_splits(parallel, [args.split], args.data)
    except DataError as error:
        print(f"attn evaluate: error: {error}", file=sys.stderr)
        return 2
    table = parallel.splits[args.split]
    if args.max_samples is not None:
        table = table.select(range(min(args.max_samples, len(table))))
    try:
        model, tokenizer = load_model(args.model, args.device)
    except (OSError, TranslateError) as error:
        print(f"attn evaluate: error: {error}", file=sys.stderr)
        return 2
    overrides = generation_overrides(args)
    start = time.perf_counter()
    try:
        scores, hypotheses = evaluate(
            model, tokenizer, list(table["source"]), list(table["target"]), args.batch_size, progress=True, **overrides
        )
    except SentenceTooLong as error:
        where = f"the {args.split} split of {args.data or 'the embedded dates task'}, pair {error.row + 1}"
        print(f"attn evaluate: error: {where}: the source sentence {error.detail}", file=sys.stderr)
        return 2
    except TranslateError as error:
        print(f"attn evaluate: error: {error}", file=sys.stderr)
        return 2
    settings = {
        key: overrides.get(key, getattr(model.generation_config, key, None))
        for key in ("num_beams", "length_penalty", "max_length", "max_new_tokens")
    }
    result = {
        "model": args.model,
        "data": args.data or "embedded dates task",
        "split": args.split,
        "source_lang": parallel.source_lang,
        "target_lang": parallel.target_lang,
        "sentences": len(hypotheses),
        **scores,
        "generation": settings,
        "seconds": round(time.perf_counter() - start, 2),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    if args.hypotheses:
        Path(args.hypotheses).write_text("".join(f"{line}\n" for line in hypotheses), encoding="utf-8")
    return 0


__all__ = ["evaluate", "evaluate_main", "translate_main"]
