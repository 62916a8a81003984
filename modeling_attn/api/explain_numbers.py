"""How the attention explainer writes its numbers into the page: nested lists, rounded.

Weights and probabilities to 4 decimals (`weights_data`, `probability`), any other number to 4 significant digits
(`values_data`, `number`); a whole number is written without ".0". docs/explain.md, "Where the numbers come from".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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


def number(value: float) -> float | int:
    """One number, to 4 significant digits."""
    return _compact(float(f"{value:.4g}"))


def probability(value: float) -> float | int:
    """One probability, to 4 decimals."""
    return _compact(round(float(value), 4))


__all__ = ["number", "probability", "values_data", "weights_data"]
