"""Attention, the one mechanism both model types are built on.

- `attend`: the shared step, softmax of masked scores into weights and the weighted sum of the values.
  The Transformer's scaled dot-product attention and the classic RNN attentions (Bahdanau, Luong)
  differ only in how they produce the scores.
- `eager_attention_forward`: scaled dot-product attention, softmax(Q K^T / sqrt(d_k)) V
  (Vaswani et al. 2017, Eq. 1), the reference implementation; faster backends (PyTorch SDPA) are
  picked by `config._attn_implementation` through transformers' `ALL_ATTENTION_FUNCTIONS`.
- `MultiHeadAttention`: MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q,
  K W_i^K, V W_i^V) (Sec. 3.2.2), used as encoder self-attention, causal decoder self-attention with a
  key/value cache, and encoder-decoder attention whose keys/values are computed once per generation.

Shapes: B batch, S source (key) length, T target (query) length, H heads, D head dim (d_k), E d_model.
Masks follow the convention of `masks.py` (True = may attend).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .masks import masked_softmax
from .padding_free import each_on_rows, on_rows


def attend(
    scores: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn scores (..., T, S) into weights (softmax over unmasked keys) and return (weights @ values, weights).

    `values` is (..., S, D). Dropout, when training, applies to the weights as in the paper's reference
    code; the returned weights are the ones used for the weighted sum.
    """
    weights = masked_softmax(scores, mask)
    weights = nn.functional.dropout(weights, p=dropout, training=training)
    return weights @ values, weights


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention (Eq. 1) on (B, H, T, D) queries and (B, H, S, D) keys/values.

    Returns the output as (B, T, H, D), the layout of transformers' attention backends, and the
    weights (B, H, T, S).
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = (query @ key.transpose(-2, -1)) * scaling  # (B, H, T, S)
    output, weights = attend(scores, value, attention_mask, dropout, module.training)
    return output.transpose(1, 2).contiguous(), weights


def split_heads(states: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, L, E) -> (B, H, L, D)."""
    return states.view(*states.shape[:-1], -1, head_dim).transpose(1, 2)


def merge_heads(states: torch.Tensor) -> torch.Tensor:
    """(B, L, H, D) -> (B, L, E)."""
    return states.reshape(*states.shape[:-2], -1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Sec. 3.2.2) with separate W^Q, W^K, W^V and W^O projections.

    `is_cross_attention` layers take keys and values from `encoder_hidden_states`; with a cache they
    compute them at the first decoding step and reuse them afterwards. Causal self-attention layers
    append each step's keys and values to the cache. `rows` and `source_rows` (flat indices of the real tokens of
    `hidden_states` and of `encoder_hidden_states`, `padding_free.kept_rows`) restrict the projections to them; the
    padded positions get zeros, which no real position reads (their keys are masked).
    """

    def __init__(
        self, config, layer_idx: int | None = None, is_causal: bool = False, is_cross_attention: bool = False
    ):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.head_dim = config.d_model // config.num_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        rows: torch.Tensor | None = None,
        source_rows: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        own = (self.q_proj,) if self.is_cross_attention else (self.q_proj, self.k_proj, self.v_proj)
        query, *key_value = each_on_rows(own, hidden_states, rows)  # (B, T, E) each
        query = split_heads(query, self.head_dim)  # (B, H, T, D)
        cache: Cache | None = None
        if past_key_values is not None:
            cache = (
                past_key_values.cross_attention_cache
                if self.is_cross_attention
                else past_key_values.self_attention_cache
            )

        if self.is_cross_attention and cache is not None and past_key_values.is_updated.get(self.layer_idx):
            key, value = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
        else:
            if self.is_cross_attention:
                key_value = each_on_rows((self.k_proj, self.v_proj), encoder_hidden_states, source_rows)
            key, value = (split_heads(states, self.head_dim) for states in key_value)  # (B, H, S, D)
            if cache is not None:
                key, value = cache.update(key, value, self.layer_idx)
                if self.is_cross_attention:
                    past_key_values.is_updated[self.layer_idx] = True

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        return on_rows(self.out_proj, merge_heads(output), rows), weights
