"""The attention explainer: one model (or two) run on one sentence, as one self-contained HTML page.

`write_explainer` gathers every number of the models' attention into the page (the package file `explain_page.html`,
filled with the data), all from the models' own forward passes: the beam search step by step (`explain_search`),
the translation token by token with its next-token probabilities, the attention of every layer and head, one head
computed from its layer's W^Q, W^K, W^V, and the RNN's alignment step (`explain_attention`), rounded as
`explain_numbers` says. This module loads the models, runs them on the sentence (`explain_model`, `explain`) and
writes the page. docs/explain.md, "Where the numbers come from", says how each number is gathered and rounded.

A Transformer runs with eager attention while it is explained; a model given as an object is put back as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .. import __version__
from ..registry import MODEL_TYPES
from .errors import ExplainError
from .explain_attention import ATTENTION_KINDS, attention_module, attention_stack, rnn_data, transformer_data
from .explain_numbers import probability
from .explain_search import SearchRecorder, beam_tree, greedy_tree, run_search
from .outputs import OutputError, check_apart, output_file
from .translation import eager_attention, load_model

PAGE_TEMPLATE = "explain_page.html"
DATA_PLACEHOLDER = "/*__EXPLAIN_DATA__*/"
GENERATOR_MARK = '<meta name="generator" content="modeling-attn explain">'
TOP_ALTERNATIVES = 5  # next-token probabilities shown per step
ModelSpec = str | os.PathLike | tuple[PreTrainedModel, PreTrainedTokenizerBase]


# -- models and inputs -----------------------------------------------------------------------------------------


def _specs(models: ModelSpec | Sequence[ModelSpec]) -> list[ModelSpec]:
    return [models] if isinstance(models, (str, os.PathLike, tuple)) else list(models)


def load_models(
    models: ModelSpec | Sequence[ModelSpec], device: str | None = None
) -> list[tuple[str, PreTrainedModel, PreTrainedTokenizerBase]]:
    """(name, model, tokenizer) for one model or two: folders / Hub ids (loaded with `translation.load_model`) or
    (model, tokenizer) pairs."""
    specs = _specs(models)
    if not 1 <= len(specs) <= 2:
        raise ExplainError(f"the explainer shows one model, or two side by side; got {len(specs)}")
    loaded = []
    for number, spec in enumerate(specs, start=1):
        if isinstance(spec, tuple):
            if len(spec) != 2 or not isinstance(spec[0], PreTrainedModel):
                raise ExplainError(f"model {number}: give a folder, a Hub id or a (model, tokenizer) pair")
            model, tokenizer = spec
            name = str(getattr(model.config, "name_or_path", "") or f"model {number}")
        else:
            model, tokenizer = load_model(str(spec), device, eager=True)
            name = Path(spec).name or str(spec)
        if model.config.model_type not in MODEL_TYPES:
            raise ExplainError(
                f"model {number} ({name}) is a {model.config.model_type!r} model; the explainer "
                f"knows {' and '.join(MODEL_TYPES)}"
            )
        loaded.append((name, model, tokenizer))
    return loaded


@contextlib.contextmanager
def prepared(model: PreTrainedModel) -> Iterator[None]:
    """The model in eval mode and, for a Transformer, with eager attention; put back afterwards."""
    training = model.training
    model.eval()
    try:
        with eager_attention(model):
            yield
    finally:
        model.train(training)


def encode(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sentence: str) -> dict[str, torch.Tensor]:
    """The sentence's input_ids and attention_mask (1, S) on the model's device; refused when empty or longer than
    the Transformer's position table."""
    if not sentence.strip():
        raise ExplainError("the sentence is empty: there is nothing to translate")
    encoded = tokenizer([sentence], return_tensors="pt", return_token_type_ids=False)
    length, limit = encoded["input_ids"].shape[1], getattr(model.config, "max_position_embeddings", None)
    if limit is not None and length > limit:
        raise ExplainError(f"the sentence has {length} tokens, more than the model's max_position_embeddings={limit}")
    return {key: value.to(model.device) for key, value in encoded.items()}


def _labels(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> list[str]:
    return [str(token) for token in tokenizer.convert_ids_to_tokens(list(ids))]


# -- one model, one sentence -----------------------------------------------------------------------------------


def describe(model: PreTrainedModel) -> str:
    config = model.config
    millions = sum(parameter.numel() for parameter in model.parameters()) / 1e6
    if MODEL_TYPES[config.model_type].per_head_attention:
        return (
            f"Transformer: {config.encoder_layers} encoder and {config.decoder_layers} decoder layers, "
            f"{config.num_heads} heads, d_model {config.d_model}, {millions:.2f}M parameters"
        )
    return (
        f"RNN: bidirectional {config.rnn_type.upper()} encoder, {config.decoder_style.capitalize()} decoder, "
        f"{config.attention_score} score, {millions:.2f}M parameters"
    )


@torch.no_grad()
def explain_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentence: str,
    name: str,
    walkthrough: tuple[str, int | None] = ("cross", None),
    **generate_kwargs: Any,
) -> dict[str, Any]:
    """Everything the page shows of one model on one sentence (see the module docstring). `walkthrough` is the
    Transformer attention computed step by step: its kind and layer (0-based; None: the last layer)."""
    transformer = MODEL_TYPES[model.config.model_type].per_head_attention  # layers of heads to show
    if transformer:  # checked before any work
        kind, layer = walkthrough
        if kind in ATTENTION_KINDS and layer is None:
            layer = len(attention_stack(model, kind).layers) - 1
        attention_module(model, kind, -1 if layer is None else layer)  # ExplainError: a kind or layer it lacks
    with prepared(model):
        encoded = encode(model, tokenizer, sentence)
        sequence, recorder = run_search(model, encoded, **generate_kwargs)
        if transformer:
            outputs, attention = transformer_data(model, encoded, sequence, (kind, layer))
        else:
            outputs, attention = rnn_data(model, encoded, sequence)
    generated = sequence[1:].tolist()
    log_probs = torch.log_softmax(outputs.logits[0].double(), dim=-1).cpu()  # (T, V)
    vocabulary = {*generated, *log_probs.topk(TOP_ALTERNATIVES, dim=-1).indices.flatten().tolist()}
    labels = dict(zip(sorted(vocabulary), _labels(tokenizer, sorted(vocabulary)), strict=True))
    if recorder is not None:
        labels.update(zip(*_path_tokens(recorder, tokenizer), strict=True))
        search = beam_tree(recorder, generated, labels)
    else:
        search = greedy_tree(log_probs, generated, labels)
    top = log_probs.exp().topk(TOP_ALTERNATIVES, dim=-1)
    steps = [
        {
            "p": probability(log_probs[step, token].exp()),
            "top": [
                [labels[int(i)], probability(p)] for p, i in zip(top.values[step], top.indices[step], strict=True)
            ],
        }
        for step, token in enumerate(generated)
    ]
    return {
        "name": name,
        "model_type": model.config.model_type,
        "description": describe(model),
        "config": {
            key: getattr(model.config, key, None)
            for key in ("encoder_layers", "decoder_layers", "num_heads", "d_model")
        },
        "source_tokens": _labels(tokenizer, encoded["input_ids"][0].tolist()),
        "target_tokens": [labels[token] for token in generated],
        "decoder_input_tokens": _labels(tokenizer, sequence[:-1].tolist()),
        "translation": tokenizer.decode(generated, skip_special_tokens=True),
        "steps": steps,
        "search": search,
        **attention,
    }


def _path_tokens(recorder: SearchRecorder, tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[str]]:
    """Every token id of the recorded search and its label."""
    ids = sorted({candidate.path[-1] for step in recorder.steps for candidate in step})
    return ids, _labels(tokenizer, ids)


def explain(
    models: ModelSpec | Sequence[ModelSpec],
    sentence: str,
    device: str | None = None,
    walkthrough: tuple[str, int | None] = ("cross", None),
    **generate_kwargs: Any,
) -> dict[str, Any]:
    """The page's data for one model or two on `sentence` (`load_models` says what a model may be)."""
    loaded = load_models(models, device)
    return {
        "format": 1,
        "generator": f"modeling-attn {__version__}",
        "sentence": sentence,
        "models": [
            explain_model(model, tokenizer, sentence, name, walkthrough, **generate_kwargs)
            for name, model, tokenizer in loaded
        ],
    }


# -- the page --------------------------------------------------------------------------------------------------


def page_template() -> str:
    return resources.files(__package__).joinpath(PAGE_TEMPLATE).read_text(encoding="utf-8")


def render_page(data: dict[str, Any]) -> str:
    """The page with `data` inside it, as JSON in a <script type="application/json"> (`<`, `>`, `&` escaped, so
    that no token can close the script element)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    template = page_template()
    if template.count(DATA_PLACEHOLDER) != 1 or GENERATOR_MARK not in template:
        raise RuntimeError(f"{PAGE_TEMPLATE}: the template lost its data placeholder or generator mark")
    return template.replace(DATA_PLACEHOLDER, text)


def written_by_explainer(path: Path) -> bool:
    """Whether the file at `path` is a page this module wrote (it carries the generator mark near its top)."""
    with open(path, "rb") as handle:
        return GENERATOR_MARK.encode() in handle.read(4096)


def write_explainer(
    model_dirs_or_models: ModelSpec | Sequence[ModelSpec],
    sentence: str,
    output_path: str | os.PathLike,
    force: bool = False,
    device: str | None = None,
    walkthrough: tuple[str, int | None] = ("cross", None),
    **generate_kwargs: Any,
) -> Path:
    """Write the explainer page of one model or two on `sentence` to `output_path` (one HTML file, no network).

    An existing file is replaced only if it is an explainer page, or with `force`; the page appears whole or not at
    all (written to a temporary file beside it, then renamed). `generate_kwargs` (num_beams, length_penalty,
    max_new_tokens...) override the models' generation_config.
    """
    path = Path(output_path)
    if path.is_dir():
        raise ExplainError(f"{path}: is a folder, not a file to write")
    if not path.parent.is_dir():
        raise ExplainError(f"{path}: the folder {path.parent} does not exist")
    if path.exists() and not force and not written_by_explainer(path):
        raise ExplainError(f"{path}: exists and is not an explainer page; pass force=True (--force) to replace it")
    for spec in _specs(model_dirs_or_models):  # a model folder given by path: the page is never written into it
        if isinstance(spec, str | os.PathLike) and Path(spec).exists():
            try:
                check_apart(path, {"--model": spec})
            except OutputError as error:
                raise ExplainError(str(error)) from None
    page = render_page(explain(model_dirs_or_models, sentence, device, walkthrough, **generate_kwargs))
    with output_file(path, overwrite=True) as handle:  # whole or not at all (outputs.py), the checks done above
        handle.write(page)
    return path


__all__ = [
    "ATTENTION_KINDS",
    "ExplainError",
    "encode",
    "explain",
    "explain_model",
    "load_models",
    "render_page",
    "write_explainer",
]
