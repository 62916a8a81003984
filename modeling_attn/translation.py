"""Translate text with a saved model, in Python: `load_model`, `translate_batch`, `translate`.

- `load_model(path)` loads a model folder or Hub repository with its tokenizer, in eval mode, and checks that the
  tokenizer fits the model's vocabulary (`check_tokenizer_fits`).
- `translate_batch(model, tokenizer, sentences)` is one `generate()` call with the model's own `generation_config`
  (or the settings given); with `output_attentions` it also returns each translation's attention
  (`heatmaps.TranslationAttention`).
- `translate(...)` streams translations of any number of sentences, `batch_size` at a time, in input order.

A sentence longer than the Transformer's position table (`max_position_embeddings`) is refused, never cut
(`SentenceTooLong` names its row). The `attn translate` / `attn evaluate` commands (`app/translate.py`) and the
training recipe's attention picture are built on these functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .heatmaps import TranslationAttention, attention_from_generate


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


def batches(items: Iterable[str], batch_size: int) -> Iterator[list[str]]:
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
    for batch in batches(sentences, batch_size):
        yield from translate_batch(model, tokenizer, batch, **generate_kwargs)[0]


__all__ = [
    "SentenceTooLong",
    "TranslateError",
    "batches",
    "check_tokenizer_fits",
    "load_model",
    "translate",
    "translate_batch",
]
