"""Padding-free position-wise work: the rows of a padded (B, L, E) batch that hold real tokens.

A position-wise function (the feed-forward network; in training the attention's q/k/v/out projections too) then
runs on those rows only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.utils import is_torchdynamo_compiling


def kept_rows(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Flat indices (into B * L) of the positions a (B, L) 0/1 mask keeps, or None when it keeps all of them.

    Position-wise layers (the feed-forward network, the output projection) need not run on padding: a padded
    position is never attended to, so what is computed there reaches no real position.
    """
    if mask is None or is_torchdynamo_compiling():  # data-dependent shapes would break a compiled graph
        return None
    keep = mask.reshape(-1).bool()
    return None if bool(keep.all()) else keep.nonzero().squeeze(1)


Rowwise = Callable[[torch.Tensor], torch.Tensor]


def on_rows(function: Rowwise, states: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """Apply a position-wise `function` to the `rows` of (B, L, E) `states` only; other positions get zeros.

    With `rows=None` it is `function(states)`. On a ragged batch this skips the padded share of the work, forward
    and backward.
    """
    return each_on_rows((function,), states, rows)[0]


def each_on_rows(
    functions: tuple[Rowwise, ...], states: torch.Tensor, rows: torch.Tensor | None
) -> list[torch.Tensor]:
    """`on_rows` of each of `functions` on the same `states`, the rows picked once for all of them (the attention's
    q, k and v projections)."""
    if rows is None:
        return [function(states) for function in functions]
    flat = states.reshape(-1, states.shape[-1])
    picked = flat.index_select(0, rows)
    outputs = []
    for function in functions:
        out = function(picked)
        out = out.new_zeros(flat.shape[0], out.shape[-1]).index_copy_(0, rows, out)  # in place: no clone
        outputs.append(out.view(*states.shape[:-1], out.shape[-1]))
    return outputs
