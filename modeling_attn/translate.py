"""`attn translate` and `attn evaluate`: translate text with a trained model, and score it with sacreBLEU.

- `translate` streams translations of sentences in batches, in input order, with the model's own
  `generation_config` (beam size, length penalty, maximum length) unless a setting is overridden. With
  `output_attentions` it also returns the attention of each translation (`heatmaps.TranslationAttention`).
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
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .heatmaps import ALIGNMENT_MODES, TranslationAttention, attention_from_generate

GENERATION_FLAGS = ("num_beams", "length_penalty", "max_new_tokens")


class TranslateError(ValueError):
    """Bad input to `attn translate` / `attn evaluate`; the message names the file, line or sentence."""


class SentenceTooLong(TranslateError):
    """A sentence has more tokens than the model's position table. `row` is its index among the sentences given
    (`translate_batch`'s batch, `evaluate`'s sources); `detail` is the message without that position."""

    def __init__(self, detail: str, row: int):
        super().__init__(f"sentence {row} of the batch {detail}")
        self.row = row
        self.detail = detail


def _looks_local(name: str) -> bool:
    """Whether `name` can only be a local path (a Hub repo id is `name` or `namespace/name`)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).is_absolute()


def check_tokenizer_fits(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """Raise if the tokenizer can produce ids the model has no embedding for."""
    sizes = {"vocab_size": model.config.vocab_size}
    if getattr(model.config, "decoder_vocab_size", None) is not None:
        sizes["decoder_vocab_size"] = model.config.decoder_vocab_size
    for field, size in sizes.items():
        if len(tokenizer) > size:
            raise TranslateError(
                f"{where}: the tokenizer has {len(tokenizer)} tokens but the model's config.{field} is {size}; ids "
                f"{size}..{len(tokenizer) - 1} have no embedding. Use the tokenizer the model was trained with."
            )


def load_model(
    model_name_or_path: str, device: str | None = None, eager: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer saved in a folder or Hub repo, in eval mode on `device` (default: CUDA if any).

    `eager` loads a Transformer with the eager attention, the backend that returns attention weights.
    """
    import modeling_attn  # noqa: F401  (registers the model types with the Auto classes)

    folder = Path(model_name_or_path).expanduser()
    if not folder.exists() and _looks_local(str(model_name_or_path)):
        raise FileNotFoundError(f"{model_name_or_path}: no such model folder")
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{model_name_or_path}: no config.json (a folder written by save_pretrained or attn train)"
        )
    config = AutoConfig.from_pretrained(model_name_or_path)
    kwargs = {"attn_implementation": "eager"} if eager and config.model_type == "attn_transformer" else {}
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(model_name_or_path, **kwargs)
    except SafetensorError as error:  # its own message names no file
        raise OSError(f"{model_name_or_path}: the safetensors weights are corrupt or truncated ({error})") from error
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    check_tokenizer_fits(model, tokenizer, str(model_name_or_path))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


def generation_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The generation settings given on the command line; the others come from the model's generation_config."""
    return {name: getattr(args, name) for name in GENERATION_FLAGS if getattr(args, name) is not None}


def _batches(items: Iterable[str], batch_size: int) -> Iterator[list[str]]:
    iterator = iter(items)
    while batch := list(islice(iterator, batch_size)):
        yield batch


@torch.no_grad()
def translate_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    output_attentions: bool = False,
    **generate_kwargs: Any,
) -> tuple[list[str], list[TranslationAttention] | None]:
    """Translations of `sentences` (one generate() call) and, with `output_attentions`, their attention.

    Empty sentences translate to empty strings without reaching the model.
    """
    translations = [""] * len(sentences)
    rows = [row for row, sentence in enumerate(sentences) if sentence.strip()]
    attentions: list[TranslationAttention] | None = [] if output_attentions else None
    if not rows:
        return translations, attentions
    encoded = tokenizer(
        [sentences[row] for row in rows], padding=True, return_tensors="pt", return_token_type_ids=False
    ).to(model.device)
    # Sentences are never cut: a sentence longer than the position table is refused, naming it.
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and encoded["input_ids"].shape[1] > limit:
        lengths = encoded["attention_mask"].sum(dim=1).tolist()
        index = max(range(len(rows)), key=lambda i: lengths[i])
        sentence = sentences[rows[index]]
        raise SentenceTooLong(
            f"({sentence[:40]!r}{'...' if len(sentence) > 40 else ''}) has {lengths[index]} tokens, more than the "
            f"model's max_position_embeddings={limit}; split it",
            rows[index],
        )
    new_tokens = generate_kwargs.get("max_new_tokens")  # asked for (--max_new_tokens); the config's is the model's
    if limit is not None and new_tokens is not None and new_tokens > limit:
        raise TranslateError(
            f"max_new_tokens={new_tokens} is more than the model's max_position_embeddings={limit}: the decoder has "
            f"no position for a longer translation; use at most {limit}"
        )
    if output_attentions:
        generate_kwargs.update(output_attentions=True, return_dict_in_generate=True)
    outputs = model.generate(
        input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"], **generate_kwargs
    )
    sequences = outputs.sequences if output_attentions else outputs
    for row, text in zip(rows, tokenizer.batch_decode(sequences, skip_special_tokens=True), strict=True):
        translations[row] = text
    if output_attentions:
        attention_by_row = {
            row: attention_from_generate(outputs, encoded["input_ids"], encoded["attention_mask"], index, tokenizer)
            for index, row in enumerate(rows)
        }
        attentions = [attention_by_row.get(row) for row in range(len(sentences))]
    return translations, attentions


def translate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Iterable[str],
    batch_size: int = 32,
    **generate_kwargs: Any,
) -> Iterator[str]:
    """Translations of `sentences`, in order, computed `batch_size` at a time as the input arrives."""
    for batch in _batches(sentences, batch_size):
        yield from translate_batch(model, tokenizer, batch, **generate_kwargs)[0]


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
    from .heatmaps import plot_alignment, plot_self_attention, save_bertviz_json

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
        from .heatmaps import _figure_class

        _figure_class()  # fail before translating when matplotlib is missing
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
        for batch in _batches(lines, batch_size):
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

    batches = _batches(sources, batch_size)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(
            batches, total=-(-len(sources) // batch_size), unit="batch", desc="translating", file=sys.stderr
        )
    hypotheses: list[str] = []
    for batch in batches:
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


__all__ = [
    "TranslateError",
    "check_tokenizer_fits",
    "evaluate",
    "evaluate_main",
    "load_model",
    "translate",
    "translate_batch",
    "translate_main",
]
