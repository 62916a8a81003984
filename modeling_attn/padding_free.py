"""Padding-free position-wise work: the rows of a padded (B, L, E) batch that hold real tokens.

A position-wise function (the feed-forward network) then runs on those rows only.
"""

from __future__ import annotations

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


def on_rows(function, states: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """Apply a position-wise `function` to the `rows` of (B, L, E) `states` only; other positions get zeros.

    With `rows=None` it is `function(states)`. On a ragged batch this skips the padded share of the work, forward
    and backward.
    """
    if rows is None:
        return function(states)
    flat = states.reshape(-1, states.shape[-1])
    picked = function(flat.index_select(0, rows))
    out = picked.new_zeros(flat.shape[0], picked.shape[-1]).index_copy(0, rows, picked)
    return out.view(*states.shape[:-1], picked.shape[-1])
