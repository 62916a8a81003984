"""The attention explainer: one model (or two) run on one sentence, as one self-contained HTML page.

`write_explainer` gathers every number of the models' attention into the page (the package file `explain_page.html`,
filled with the data), all from the models' own forward passes: the beam search step by step
(`beam_search_observer`), the translation token by token with its next-token probabilities, the Transformer's
attentions of every layer and head (eager attention), one head computed from its layer's W^Q, W^K, W^V (Vaswani
et al. 2017, Eq. 1 and Sec. 3.2.2; captured by forward hooks), and the RNN's alignment step (Bahdanau et al. 2015,
Sec. 3.1; Luong et al. 2015, Sec. 3). Recomputed values are checked against the model's own. docs/explain.md, "Where
the numbers come from", says how each is gathered and rounded.

A Transformer runs with eager attention while it is explained; a model given as an object is put back as it was.

Shapes: L layers, H heads, S source length, T target length (generated tokens, end token included), D head dim,
E d_model, A annotation size (RNN).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .. import __version__
from ..beam_search import NEG
from ..registry import MODEL_TYPES
from .errors import UserError
from .outputs import OutputError, check_apart, output_file
from .translation import eager_attention, load_model

PAGE_TEMPLATE = "explain_page.html"
DATA_PLACEHOLDER = "/*__EXPLAIN_DATA__*/"
GENERATOR_MARK = '<meta name="generator" content="modeling-attn explain">'
ATTENTION_KINDS = ("cross", "encoder", "decoder")
TOP_ALTERNATIVES = 5  # next-token probabilities shown per step
ModelSpec = str | os.PathLike | tuple[PreTrainedModel, PreTrainedTokenizerBase]


class ExplainError(UserError, ValueError):
    """Bad input to the explainer; the message names what is wrong."""


# -- numbers for the page --------------------------------------------------------------------------------------


def _nested(values: list, shape: Sequence[int]) -> list:
    if len(shape) <= 1:
        return values
    size = len(values) // shape[0]
    return [_nested(values[i * size : (i + 1) * size], shape[1:]) for i in range(shape[0])]


def _compact(value: float) -> float | int:
    return int(value) if value.is_integer() else value  # "0" rather than "0.0"


def weights_data(tensor: torch.Tensor) -> list:
    """Probabilities or attention weights as nested lists, rounded to 4 decimals."""
    flat = [_compact(round(value, 4)) for value in tensor.detach().double().cpu().flatten().tolist()]
    return _nested(flat, tensor.shape)


def values_data(tensor: torch.Tensor) -> list:
    """Any other numbers as nested lists, rounded to 4 significant digits."""
    flat = [_compact(float(f"{value:.4g}")) for value in tensor.detach().double().cpu().flatten().tolist()]
    return _nested(flat, tensor.shape)


def _number(value: float) -> float | int:
    return _compact(float(f"{value:.4g}"))


def _probability(value: float) -> float | int:
    return _compact(round(float(value), 4))


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


# -- the search ------------------------------------------------------------------------------------------------


class Candidate(NamedTuple):
    """One continuation considered at one step: its tokens (after the start token), summed log-probability, whether
    it hit a stopping criterion, whether it runs on, and its length-penalised score if it joined the finished ones."""

    path: tuple[int, ...]
    score: float
    stops: bool
    kept: bool
    finished_score: float | None


class SearchRecorder:
    """A `beam_search_observer` (beam_search.py) that keeps every step's candidates of one sentence's search, and
    the finished hypotheses after the last step."""

    def __init__(self) -> None:
        self.steps: list[list[Candidate]] = []
        self.finished: list[tuple[tuple[int, ...], float]] = []
        self.settings = None

    def __call__(self, settings, cur_len, state, scores, sequences, origins, stops) -> None:
        if state.running.shape[0] != 1:
            raise ExplainError("the search recorder follows one sentence at a time")
        self.settings, prompt = settings, settings.prompt_length
        running = {tuple(row.tolist()) for row in state.running[0, :, prompt : cur_len + 1]}
        self.finished = []
        for slot in state.is_finished[0].nonzero().flatten().tolist():
            length = int((state.finished_origins[0, slot] != -1).sum())
            path = tuple(state.finished[0, slot, prompt : prompt + length].tolist())
            self.finished.append((path, float(state.finished_scores[0, slot])))
        finished = dict(self.finished)  # a path of this step's length in it finished at this step
        candidates = []
        for index in range(scores.shape[1]):
            score = float(scores[0, index])
            if score <= NEG / 2:  # a continuation of an empty beam (a vocabulary smaller than the candidates)
                continue
            path = tuple(sequences[0, index, prompt : cur_len + 1].tolist())
            candidates.append(Candidate(path, score, bool(stops[0, index]), path in running, finished.get(path)))
        self.steps.append(candidates)


def run_search(model: PreTrainedModel, encoded: dict[str, torch.Tensor], **generate_kwargs: Any):
    """generate()'s translation (start token first) and, for beam search, the recorder of its search. The search is
    beam search or greedy search: a generation_config that samples is overridden, and sampling asked for refused."""
    if generate_kwargs.get("do_sample"):
        raise ExplainError("the explainer shows beam search or greedy search; do_sample=True is not supported")
    generate_kwargs["do_sample"] = False
    num_beams = generate_kwargs.get("num_beams") or model.generation_config.num_beams or 1
    recorder = SearchRecorder() if num_beams > 1 else None
    model.beam_search_observer = recorder
    try:
        with torch.no_grad():
            sequences = model.generate(**encoded, **generate_kwargs)
    finally:
        model.__dict__.pop("beam_search_observer", None)
    if recorder is not None and not recorder.steps:
        raise ExplainError(
            "generate() ran transformers' own beam search (settings the model's search passes on), which cannot "
            "be recorded; use the model's default decoding settings"
        )
    sequence = sequences[0]
    eos = _eos_ids(model)
    ends = [position for position, token in enumerate(sequence.tolist()) if position > 0 and token in eos]
    return (sequence[: ends[0] + 1] if ends else sequence), recorder


def _eos_ids(model: PreTrainedModel) -> set[int]:
    eos = model.generation_config.eos_token_id
    eos = model.config.eos_token_id if eos is None else eos
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def beam_tree(recorder: SearchRecorder, generated: Sequence[int], labels: dict[int, str]) -> dict[str, Any]:
    """The recorded search as nodes (a root, then every candidate of every step) for the page."""
    best = tuple(generated)
    ranked = sorted(recorder.finished, key=lambda item: -item[1])
    if best not in dict(ranked):
        raise RuntimeError("the recorded search does not end with the translation generate() returned")
    ranks = {path: rank for rank, (path, _) in enumerate(ranked)}
    nodes: list[dict[str, Any]] = [
        {"parent": None, "step": -1, "token": "<start>", "score": 0, "status": "start", "best": True}
    ]
    ids = {(): 0}
    for step, candidates in enumerate(recorder.steps):
        for candidate in sorted(candidates, key=lambda c: -c.score):
            if candidate.path[:-1] not in ids:
                raise RuntimeError(f"step {step}: a candidate continues a hypothesis that was not kept")
            ids[candidate.path] = len(nodes)
            status = "finished" if candidate.finished_score is not None else "kept" if candidate.kept else "dropped"
            nodes.append(
                {
                    "parent": ids[candidate.path[:-1]],
                    "step": step,
                    "token": labels[candidate.path[-1]],
                    "score": _number(candidate.score),
                    "status": status,
                    "stops": candidate.stops,
                    "final_score": None if candidate.finished_score is None else _number(candidate.finished_score),
                    "rank": ranks.get(candidate.path),
                    "best": best[: len(candidate.path)] == candidate.path,
                }
            )
    settings = recorder.settings
    return {
        "method": "beam",
        "num_beams": settings.num_beams,
        "candidates": settings.candidates,
        "length_penalty": settings.length_penalty,
        "nodes": nodes,
    }


def greedy_tree(log_probs: torch.Tensor, generated: Sequence[int], labels: dict[int, str]) -> dict[str, Any]:
    """Greedy search as a tree: per step the token kept (generate()'s) and the most likely other token, dropped."""
    nodes: list[dict[str, Any]] = [
        {"parent": None, "step": -1, "token": "<start>", "score": 0, "status": "start", "best": True}
    ]
    total, parent = 0.0, 0
    for step, token in enumerate(generated):
        runner_up = next(int(i) for i in log_probs[step].topk(2).indices if int(i) != token)
        kept_id = None
        for candidate in (token, runner_up):
            score = total + float(log_probs[step, candidate])
            last = step == len(generated) - 1
            status = ("finished" if last else "kept") if candidate == token else "dropped"
            nodes.append(
                {
                    "parent": parent,
                    "step": step,
                    "token": labels[candidate],
                    "score": _number(score),
                    "status": status,
                    "stops": last and candidate == token,
                    "final_score": _number(score) if status == "finished" else None,
                    "rank": 0 if status == "finished" else None,
                    "best": candidate == token,
                }
            )
            if candidate == token:
                kept_id = len(nodes) - 1
        total, parent = total + float(log_probs[step, token]), kept_id
    return {"method": "greedy", "num_beams": 1, "candidates": 2, "length_penalty": None, "nodes": nodes}


# -- one forward pass over the translation ---------------------------------------------------------------------


def _keep(store: list, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
    store.append((args, kwargs, output))


@contextlib.contextmanager
def captured_calls(modules: dict[str, nn.Module]) -> Iterator[dict[str, list]]:
    """The (args, kwargs, output) of every call of each module while the block runs, by name."""
    calls: dict[str, list] = {name: [] for name in modules}
    handles = [
        module.register_forward_hook(functools.partial(_keep, calls[name]), with_kwargs=True)
        for name, module in modules.items()
    ]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def forward_pass(model: PreTrainedModel, encoded: dict, sequence: torch.Tensor, modules: dict[str, nn.Module]):
    """The teacher-forced forward over the translation (decoder input: start token + all but the last token), with
    attention weights, and the calls of `modules` during it."""
    with torch.no_grad(), captured_calls(modules) as calls:
        outputs = model(**encoded, decoder_input_ids=sequence[None, :-1], output_attentions=True, use_cache=False)
    return outputs, calls


def _stack(model: PreTrainedModel, kind: str) -> nn.Module:
    return model.model.encoder if kind == "encoder" else model.model.decoder


def attention_module(model: PreTrainedModel, kind: str, layer: int) -> nn.Module:
    """The Transformer's attention layer of one kind ("cross", "encoder", "decoder") in layer `layer` (0-based)."""
    if kind not in ATTENTION_KINDS:
        raise ExplainError(f"the attention to compute is one of {list(ATTENTION_KINDS)}, got {kind!r}")
    stack = _stack(model, kind)
    if not 0 <= layer < len(stack.layers):
        raise ExplainError(f"layer {layer + 1}: the {kind} attention has layers 1..{len(stack.layers)}")
    block = stack.layers[layer]
    return block.encoder_attn if kind == "cross" else block.self_attn


def _visible(mask: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """(queries, keys) True where the attention layer's mask lets a query see a key (masks.py convention)."""
    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    mask = mask[0, 0].cpu()
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return visible.expand(shape)


def head_walkthrough(module: nn.Module, call: tuple, kind: str, layer: int) -> dict[str, Any]:
    """Multi-head attention recomputed from the layer's own weights and inputs (Eq. 1, Sec. 3.2.2), in float64."""
    args, kwargs, (output, weights) = call
    hidden = args[0][0].double().cpu()  # (T, E) the queries' input
    source = kwargs["encoder_hidden_states"][0].double().cpu() if module.is_cross_attention else hidden  # (S, E)
    d_model, head_dim = hidden.shape[-1], module.head_dim
    num_heads = d_model // head_dim

    def project(linear: nn.Linear, states: torch.Tensor) -> torch.Tensor:  # x W^T + b
        return states @ linear.weight.double().cpu().T + linear.bias.double().cpu()

    def split(states: torch.Tensor) -> torch.Tensor:  # (L, E) -> (H, L, D)
        return states.view(states.shape[0], num_heads, head_dim).transpose(0, 1)

    query, key, value = (
        split(project(p, x)) for p, x in ((module.q_proj, hidden), (module.k_proj, source), (module.v_proj, source))
    )
    dots = query @ key.transpose(-1, -2)  # (H, T, S) q.k
    visible = _visible(kwargs.get("attention_mask"), dots.shape[-2:])
    probabilities = torch.softmax((dots * module.scaling).masked_fill(~visible, float("-inf")), dim=-1)  # Eq. 1
    heads = probabilities @ value  # (H, T, D)
    merged = heads.transpose(0, 1).reshape(-1, d_model)  # Concat(head_1, ..., head_H), (T, E)
    projected = project(module.out_proj, merged)  # MultiHead(Q, K, V) = Concat(...) W^O, (T, E)
    return {
        "kind": kind,
        "layer": layer,
        "num_heads": num_heads,
        "head_dim": head_dim,
        "d_model": d_model,
        "scaling": module.scaling,
        "q": values_data(query),
        "k": values_data(key),
        "v": values_data(value),
        "dots": values_data(dots),
        "visible": visible.int().tolist(),
        "heads": values_data(heads),
        "output": values_data(projected),
        "check": {
            "weights": float((probabilities - weights[0].double().cpu()).abs().max()),
            "output": float((projected - output[0].double().cpu()).abs().max()),
        },
    }


def transformer_data(model: PreTrainedModel, encoded: dict, sequence: torch.Tensor, walkthrough: tuple[str, int]):
    """The forward pass's outputs and the Transformer's attention for the page."""
    kind, layer = walkthrough
    module = attention_module(model, kind, layer)
    modules = {"head": module, "mask": model.model.decoder.layers[0].self_attn}
    outputs, calls = forward_pass(model, encoded, sequence, modules)

    def stacked(weights: tuple[torch.Tensor, ...]) -> torch.Tensor:  # (L, H, queries, keys)
        return torch.stack([layer_weights[0] for layer_weights in weights])

    decoder = stacked(outputs.decoder_attentions)
    return outputs, {
        "cross": weights_data(stacked(outputs.cross_attentions)),
        "encoder": weights_data(stacked(outputs.encoder_attentions)),
        "decoder": weights_data(decoder),
        "decoder_visible": _visible(calls["mask"][0][1].get("attention_mask"), decoder.shape[-2:]).int().tolist(),
        "walkthrough": head_walkthrough(module, calls["head"][0], kind, layer),
    }


def rnn_data(model: PreTrainedModel, encoded: dict, sequence: torch.Tensor):
    """The forward pass's outputs and the RNN's alignment steps for the page: e_ij, alpha_ij, h_j, c_i."""
    config, decoder = model.config, model.model.decoder
    bahdanau = config.decoder_style == "bahdanau"
    # the context enters Bahdanau's RNN as [E y_{i-1}; c_i] and Luong's W_c as [c_t; h_t]
    modules = {"score": decoder.score, "context": decoder.rnn if bahdanau else decoder.attentional_proj}
    outputs, calls = forward_pass(model, encoded, sequence, modules)
    energies = torch.cat([output for _, _, output in calls["score"]], dim=1)[0].double().cpu()  # (T, S) e_ij
    queries = torch.cat([args[0] for args, _, _ in calls["score"]], dim=1)[0]  # (T, Q) s_{i-1} or h_t
    inputs = torch.cat([args[0] for args, _, _ in calls["context"]], dim=1)[0].double().cpu()
    used = inputs[:, config.embedding_size :] if bahdanau else inputs[:, : config.annotation_size]  # (T, A)
    annotations = outputs.encoder_last_hidden_state[0].double().cpu()  # (S, A) h_j
    visible = encoded["attention_mask"][0].bool().cpu()
    alignment = torch.softmax(energies.masked_fill(~visible, float("-inf")), dim=-1)  # alpha_ij
    context = alignment @ annotations  # c_i
    model_alignment = outputs.cross_attentions[0][0].double().cpu()
    return outputs, {
        "cross": weights_data(model_alignment[None, None]),  # one "layer" with one "head"
        "rnn": {
            "style": config.decoder_style,
            "score": config.attention_score,
            "rnn_type": config.rnn_type,
            "energies": values_data(energies),
            "query": values_data(queries),
            "annotations": values_data(annotations),
            "context": values_data(context),
            "check": {
                "alignment": float((alignment - model_alignment).abs().max()),
                "context": float((context - used).abs().max()),
            },
        },
    }


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
            layer = len(_stack(model, kind).layers) - 1
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
            "p": _probability(log_probs[step, token].exp()),
            "top": [
                [labels[int(i)], _probability(p)] for p, i in zip(top.values[step], top.indices[step], strict=True)
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
    "ExplainError",
    "SearchRecorder",
    "beam_tree",
    "encode",
    "explain",
    "explain_model",
    "greedy_tree",
    "head_walkthrough",
    "load_models",
    "render_page",
    "write_explainer",
]
