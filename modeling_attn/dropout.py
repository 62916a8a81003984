"""Dropout with the mask drawn by `torch.rand` on the CPU, and dropout of whole tokens (word dropout)."""

from __future__ import annotations

import torch


def dropout(hidden_states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`torch.nn.functional.dropout`, with the mask drawn by `torch.rand` on the CPU.

    Each element is zeroed with probability p and the others scaled by 1 / (1 - p), as PyTorch's dropout; on the
    CPU a uniform draw and a comparison are cheaper than its Bernoulli sampling (bench/README.md). Elsewhere
    PyTorch's own kernel: on other devices, and for other dtypes (a bfloat16 uniform draw is too coarse for an
    exact p).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return hidden_states
    if hidden_states.device.type != "cpu" or hidden_states.dtype != torch.float32 or p == 1.0:
        return torch.nn.functional.dropout(hidden_states, p=p, training=True)
    return hidden_states * torch.rand_like(hidden_states).ge_(p).mul_(1.0 / (1.0 - p))


def word_dropout(embeddings: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout over whole tokens: each (B, L) position's embedding vector is zeroed with probability p and the
    others scaled by 1 / (1 - p) (`dropout` of one mask value per position)."""
    if not training or p == 0.0:
        return embeddings
    return embeddings * dropout(embeddings.new_ones(*embeddings.shape[:-1], 1), p, training)
