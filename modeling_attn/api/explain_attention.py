"""The explainer's attention: one forward pass over the translation, every attention weight, one head computed.

`transformer_data` reads the Transformer's cross-, encoder and masked decoder self-attention of every layer and head
(eager attention) and `head_walkthrough` computes one head from its layer's W^Q, W^K, W^V (Vaswani et al. 2017,
Eq. 1 and Sec. 3.2.2), the inputs captured by forward hooks (`captured_calls`) and the result checked against the
model's own. `rnn_data` reads the RNN's alignment step (Bahdanau et al. 2015, Sec. 3.1; Luong et al. 2015, Sec. 3).

Shapes: L layers, H heads, S source length, T target length (generated tokens, end token included), D head dim,
E d_model, A annotation size (RNN).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from .choices import ATTENTION_KINDS
from .errors import ExplainError
from .explain_numbers import values_data, weights_data


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


def attention_stack(model: PreTrainedModel, kind: str) -> nn.Module:
    """The encoder or the decoder stack whose layers hold the `kind` attention."""
    return model.model.encoder if kind == "encoder" else model.model.decoder


def attention_module(model: PreTrainedModel, kind: str, layer: int) -> nn.Module:
    """The Transformer's attention layer of one kind ("cross", "encoder", "decoder") in layer `layer` (0-based)."""
    if kind not in ATTENTION_KINDS:
        raise ExplainError(f"the attention to compute is one of {list(ATTENTION_KINDS)}, got {kind!r}")
    stack = attention_stack(model, kind)
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


__all__ = [
    "ATTENTION_KINDS",
    "attention_module",
    "attention_stack",
    "captured_calls",
    "forward_pass",
    "head_walkthrough",
    "rnn_data",
    "transformer_data",
]
