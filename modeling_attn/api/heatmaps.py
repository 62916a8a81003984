"""Attention pictures of a translation, for both model types, from `generate(..., output_attentions=True)`.

- `attention_from_generate` gathers, for one generated sequence of `generate(..., return_dict_in_generate=True)`,
  the cross-attention (the alignment of Bahdanau et al. 2015, Sec. 5.2.2 / Fig. 3: one row per generated target
  token, one column per source token) and, for the Transformer, the encoder and decoder self-attention of every
  layer and head. Beam search is followed back through `beam_indices`, so the rows are those of the returned
  hypothesis.
- `plot_alignment` draws the cross-attention averaged over layers and heads, or one panel per layer (averaged
  over its heads); `plot_self_attention` draws a layers x heads grid of the encoder's or decoder's self-attention.
- `bertviz_data` / `save_bertviz_json` export the same arrays in the layout of bertviz's `head_view`.

The Transformer returns attention weights only with `attn_implementation="eager"`; the RNN has one alignment per
target step and no self-attention. matplotlib is an optional extra (`pip install "modeling-attn[plot]"`); the
figures are built without pyplot, so nothing changes matplotlib's global state.

Shapes: L layers, H heads, S source length, T generated target length.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch
from torch import nn

from .choices import ALIGNMENT_MODES, STACKS

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass
class TranslationAttention:
    """The attention of one generated translation.

    `cross_attention[l, h, t, s]` is how much target step t (the step that produced `target_tokens[t]`) attends
    to source token s; `decoder_attention[l, h, t, u]` how much step t (whose decoder input is
    `decoder_input_tokens[t]`) attends to decoder input u <= t.
    """

    source_tokens: list[str]
    target_tokens: list[str]  # the generated tokens, EOS included
    decoder_input_tokens: list[str]  # decoder start token + target_tokens[:-1]
    cross_attention: torch.Tensor  # (L, H, T, S)
    encoder_attention: torch.Tensor | None = None  # (L, H, S, S), Transformer only
    decoder_attention: torch.Tensor | None = None  # (L, H, T, T), Transformer only

    def alignment(self, layer: int | None = None) -> torch.Tensor:
        """Cross-attention averaged over heads, of one layer or (None) of all layers, as (T, S)."""
        weights = self.cross_attention if layer is None else self.cross_attention[layer : layer + 1]
        return weights.mean(dim=(0, 1))


def _token_labels(ids: Sequence[int], tokenizer: Any | None) -> list[str]:
    if tokenizer is None:
        return [str(token_id) for token_id in ids]
    return [str(token) for token in tokenizer.convert_ids_to_tokens(list(ids))]


def _last_query(weights: torch.Tensor) -> torch.Tensor:
    """One step's weights of one sequence as (H, K): the last query position (with a cache there is only one)."""
    if weights.dim() == 2:  # RNN alignment (1, S): one head
        return weights[-1:]
    return weights[:, -1]  # Transformer (H, Q, K)


def _complete(steps: Sequence[Sequence[torch.Tensor] | None] | None) -> bool:
    """Whether generate() returned weights for every step and layer."""
    return bool(steps) and all(step is not None and all(w is not None for w in step) for step in steps)


def attention_from_generate(
    outputs: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    index: int = 0,
    tokenizer: Any | None = None,
    eos_token_id: int | None = None,
) -> TranslationAttention:
    """The attention of generated sequence `index` of `outputs` (a generate() output with attentions).

    `input_ids`/`attention_mask` are the (right-padded) source batch given to generate(); with
    `num_return_sequences` > 1, sequence `index` belongs to source row `index // num_return_sequences`. Token
    labels come from `tokenizer.convert_ids_to_tokens`, or are the ids as text without a tokenizer. The target
    ends at the first `eos_token_id` (default: the tokenizer's), or where beam search stopped.
    """
    cross_steps = getattr(outputs, "cross_attentions", None)
    if not _complete(cross_steps):
        raise ValueError(
            "the generate() output holds no cross-attention: call generate(..., output_attentions=True, "
            "return_dict_in_generate=True), and load a Transformer with attn_implementation='eager'"
        )
    sequences = outputs.sequences
    num_return = sequences.shape[0] // input_ids.shape[0]
    source_row = index // num_return
    source_length = int(attention_mask[source_row].sum()) if attention_mask is not None else input_ids.shape[1]
    source_ids = input_ids[source_row, :source_length].tolist()

    num_steps = len(cross_steps)
    beam_indices = getattr(outputs, "beam_indices", None)
    # The decoder start token(s) precede the generated tokens. Beam search may run steps past the length of the
    # sequences it returns (it stops once no running beam can beat the finished ones); its beam_indices have one
    # column per returned token.
    generated_columns = beam_indices.shape[1] if beam_indices is not None else num_steps
    prompt_length = sequences.shape[1] - generated_columns
    generated = sequences[index, prompt_length:].tolist()
    length = num_steps
    if beam_indices is not None:
        length = int((beam_indices[index] >= 0).sum())
    if eos_token_id is None and tokenizer is not None:
        eos_token_id = tokenizer.eos_token_id
    if eos_token_id is not None and eos_token_id in generated[:length]:
        length = generated.index(eos_token_id) + 1
    rows = [int(beam_indices[index, step]) if beam_indices is not None else index for step in range(length)]

    def gather(steps: Sequence[Sequence[torch.Tensor]], keys: int | None) -> torch.Tensor:
        """(L, H, T, keys) from per-step, per-layer weights; the row of step t is rows[t]. keys None: the source."""
        per_step = []
        for step in range(length):
            layers = [_last_query(weights[rows[step]]) for weights in steps[step]]  # L x (H, K)
            if keys is None:  # cross-attention: drop the source padding
                per_step.append(torch.stack([layer[:, :source_length] for layer in layers]))
            else:  # decoder self-attention: K grows by one per step; pad it to `keys` with zeros
                per_step.append(
                    torch.stack([nn.functional.pad(layer, (0, keys - layer.shape[-1])) for layer in layers])
                )
        return torch.stack(per_step, dim=2).detach().float().cpu()  # (L, H, T, K)

    cross = gather(cross_steps, None)
    encoder = decoder = None
    if getattr(outputs, "encoder_attentions", None):
        batch = outputs.encoder_attentions[0].shape[0]
        encoder_row = source_row * (batch // input_ids.shape[0])  # generate may have expanded the batch
        encoder = torch.stack(
            [weights[encoder_row, :, :source_length, :source_length] for weights in outputs.encoder_attentions]
        )
        encoder = encoder.detach().float().cpu()
    if _complete(getattr(outputs, "decoder_attentions", None)):  # the RNN has None here
        decoder = gather(outputs.decoder_attentions, prompt_length + length - 1)[..., -length:]

    decoder_inputs = sequences[index, prompt_length - 1 : prompt_length + length - 1].tolist()
    return TranslationAttention(
        source_tokens=_token_labels(source_ids, tokenizer),
        target_tokens=_token_labels(generated[:length], tokenizer),
        decoder_input_tokens=_token_labels(decoder_inputs, tokenizer),
        cross_attention=cross,
        encoder_attention=encoder,
        decoder_attention=decoder,
    )


# -- figures ---------------------------------------------------------------------------------------------------


def figure_class() -> type[Figure]:
    """matplotlib's `Figure`; an ImportError naming the extra to install when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            'attention pictures need matplotlib: pip install "modeling-attn[plot]" (or pip install matplotlib)'
        ) from None
    return Figure


_CELL = 0.32  # inches per token, enough for a 9-point label


def _draw(axes, weights: torch.Tensor, x_labels: list[str] | None, y_labels: list[str] | None, title: str):
    image = axes.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    axes.set_title(title, fontsize=9)
    upright = all(len(label) <= 2 for label in x_labels or [])  # single letters or digits read best upright
    axes.set_xticks(range(weights.shape[1]), x_labels or [], rotation=0 if upright else 90, fontsize=9)
    axes.set_yticks(range(weights.shape[0]), y_labels or [], fontsize=9)
    axes.tick_params(length=0)
    return image


def _save(figure: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        save_figure(figure, path)
    return figure


def save_figure(figure: Figure, target: str | Path | IO[bytes], image_format: str | None = None) -> None:
    """Write `figure` to a path (its format from the suffix) or an open binary file (`image_format`: "png", "svg"...),
    as the plot functions here write their pictures."""
    figure.savefig(target, format=image_format, dpi=150, bbox_inches="tight")


def picture_formats() -> set[str]:
    """The file suffixes (without the dot) matplotlib can write a picture as: png, pdf, svg, jpg..."""
    return set(figure_class()().canvas.get_supported_filetypes())


def plot_alignment(
    attention: TranslationAttention, mode: str = "average", path: str | Path | None = None, title: str | None = None
) -> Figure:
    """The cross-attention as a heatmap: source tokens along x, generated target tokens along y.

    mode "average": one panel, the mean over layers and heads; "layers": one panel per layer, each the mean over
    its heads. Written to `path` (PNG, SVG, PDF... by its suffix) when given; returns the figure.
    """
    if mode not in ALIGNMENT_MODES:
        raise ValueError(f"mode must be one of {list(ALIGNMENT_MODES)}, got {mode!r}")
    num_layers = attention.cross_attention.shape[0]
    panels = [attention.alignment()] if mode == "average" else [attention.alignment(i) for i in range(num_layers)]
    titles = ["cross-attention, mean over layers and heads" if num_layers > 1 else "cross-attention"]
    if mode == "layers":
        titles = [f"layer {i + 1}, mean over heads" for i in range(num_layers)]
    target_length, source_length = panels[0].shape
    width = len(panels) * (1.2 + _CELL * source_length) + 1.0
    height = 1.6 + _CELL * target_length
    figure = figure_class()(figsize=(width, height), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for number, (panel, axis) in enumerate(zip(panels, axes, strict=True)):
        image = _draw(
            axis, panel, attention.source_tokens, attention.target_tokens if number == 0 else None, titles[number]
        )
        axis.set_xlabel("source")
    axes[0].set_ylabel("generated target")
    figure.colorbar(image, ax=list(axes), shrink=0.8, label="attention weight")
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_self_attention(
    attention: TranslationAttention, stack: str = "encoder", path: str | Path | None = None
) -> Figure:
    """The encoder's or decoder's self-attention as a grid, one row per layer and one column per head.

    Query tokens along y, key tokens along x; labels on the left column and bottom row. Transformer only.
    """
    if stack not in STACKS:
        raise ValueError(f"stack must be one of {list(STACKS)}, got {stack!r}")
    weights = attention.encoder_attention if stack == "encoder" else attention.decoder_attention
    if weights is None:
        raise ValueError(
            f"no {stack} self-attention in this output: the RNN has none; a Transformer needs "
            "attn_implementation='eager' and generate(..., output_attentions=True, return_dict_in_generate=True)"
        )
    labels = attention.source_tokens if stack == "encoder" else attention.decoder_input_tokens
    if stack == "decoder":  # blank the future positions, which a causal decoder cannot see
        future = torch.ones(weights.shape[-2:], dtype=torch.bool).triu(1)
        weights = weights.masked_fill(future, float("nan"))
    num_layers, num_heads, length, _ = weights.shape
    panel = 0.6 + _CELL * length
    figure = figure_class()(figsize=(num_heads * panel + 1.5, num_layers * panel + 1.0), layout="constrained")
    grid = figure.subplots(num_layers, num_heads, squeeze=False)
    for layer in range(num_layers):
        for head in range(num_heads):
            image = _draw(
                grid[layer, head],
                weights[layer, head],
                labels if layer == num_layers - 1 else None,
                labels if head == 0 else None,
                f"layer {layer + 1}, head {head + 1}",
            )
    figure.colorbar(image, ax=grid.ravel().tolist(), shrink=0.6, label="attention weight")
    figure.suptitle(f"{stack} self-attention (rows: queries, columns: keys)")
    return _save(figure, path)


# -- bertviz ---------------------------------------------------------------------------------------------------


def bertviz_data(attention: TranslationAttention) -> dict[str, Any]:
    """Tokens and attention arrays as nested lists in bertviz's `head_view` layout: each `*_attention` is a list
    over layers of (1, H, queries, keys). Load them back with `[torch.tensor(a) for a in data["cross_attention"]]`
    and pass them with the tokens to `bertviz.head_view(...)`. The RNN has no self-attention entries."""
    data: dict[str, Any] = {
        "encoder_tokens": attention.source_tokens,
        "decoder_tokens": attention.decoder_input_tokens,
        "cross_attention": [layer[None].tolist() for layer in attention.cross_attention],
    }
    if attention.encoder_attention is not None:
        data["encoder_attention"] = [layer[None].tolist() for layer in attention.encoder_attention]
    if attention.decoder_attention is not None:
        data["decoder_attention"] = [layer[None].tolist() for layer in attention.decoder_attention]
    return data


def bertviz_json(attention: TranslationAttention) -> str:
    """`bertviz_data(attention)` as one line of JSON (ASCII), as `save_bertviz_json` and `attn translate
    --attention_json` write it."""
    return json.dumps(bertviz_data(attention)) + "\n"


def save_bertviz_json(attention: TranslationAttention, path: str | Path) -> Path:
    """Write `bertviz_json(attention)` to `path`."""
    Path(path).write_text(bertviz_json(attention), encoding="utf-8")
    return Path(path)


__all__ = [
    "TranslationAttention",
    "attention_from_generate",
    "bertviz_data",
    "bertviz_json",
    "picture_formats",
    "plot_alignment",
    "plot_self_attention",
    "save_bertviz_json",
    "save_figure",
]
