"""Score functions of classic seq2seq attention: how well a decoder state s matches each encoder annotation h_j.

The alignment model e_ij = a(s_{i-1}, h_j) of Bahdanau et al. 2015 (Sec. 3.1, Eq. 6) and the score(h_t, h_s)
of Luong et al. 2015 (Sec. 3.1, Eq. 8) differ only in how they score; turning the scores into weights
(softmax over the unmasked source positions) and forming the context vector c = sum_j alpha_j h_j is the
step shared with the Transformer, `attention.attend`.

Every score module has two methods, so that the encoder-only part of a score is computed once per
sentence, not once per decoding step:
- `project_keys(encoder_hidden_states)`: (B, S, K) -> keys (B, S, *), e.g. U_a h_j for the additive score.
- `forward(query, keys)`: query (B, T, Q) and keys -> scores (B, T, S).

Shapes: B batch, S source length, T target (query) steps, Q query width, K annotation width, A attention width.
"""

from __future__ import annotations

import torch
from torch import nn

SCORE_NAMES = ("additive", "dot", "general", "scaled_dot")


class DotScore(nn.Module):
    """score(s, h) = s^T h (Luong Eq. 8, "dot"). Needs Q == K; the keys are the annotations themselves."""

    def project_keys(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return encoder_hidden_states

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return query @ keys.transpose(-2, -1)  # (B, T, S)


class ScaledDotScore(DotScore):
    """score(s, h) = s^T h / sqrt(d), d = Q (the scaling of Vaswani et al. 2017, Eq. 1, with one head)."""

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return super().forward(query, keys) * query.shape[-1] ** -0.5


class GeneralScore(nn.Module):
    """score(s, h) = s^T W_a h (Luong Eq. 8, "general"; bilinear). The keys are W_a h_j, computed once per sentence."""

    def __init__(self, query_size: int, key_size: int):
        super().__init__()
        self.key_proj = nn.Linear(key_size, query_size, bias=False)  # W_a

    def project_keys(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.key_proj(encoder_hidden_states)  # (B, S, Q)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return query @ keys.transpose(-2, -1)  # (B, T, S)


class AdditiveScore(nn.Module):
    """score(s, h) = v_a^T tanh(W_a s + U_a h) (Bahdanau A.1.2 and A.2.2; Luong's "concat", Eq. 8, with W_a [s; h]
    split into W_a s + U_a h). The keys are U_a h_j, computed once per sentence as Bahdanau A.1.2 suggests."""

    def __init__(self, query_size: int, key_size: int, attention_size: int):
        super().__init__()
        self.query_proj = nn.Linear(query_size, attention_size, bias=False)  # W_a
        self.key_proj = nn.Linear(key_size, attention_size, bias=False)  # U_a
        self.energy = nn.Linear(attention_size, 1, bias=False)  # v_a

    def project_keys(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.key_proj(encoder_hidden_states)  # (B, S, A)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.query_proj(query)[:, :, None, :] + keys[:, None, :, :])  # (B, T, S, A)
        return self.energy(hidden).squeeze(-1)  # (B, T, S)


def build_score(name: str, query_size: int, key_size: int, attention_size: int) -> nn.Module:
    """The score module called `name` (one of `SCORE_NAMES`) for queries of width Q and annotations of width K."""
    if name == "additive":
        return AdditiveScore(query_size, key_size, attention_size)
    if name == "general":
        return GeneralScore(query_size, key_size)
    if name in ("dot", "scaled_dot"):
        if query_size != key_size:
            raise ValueError(
                f"the {name!r} score needs queries and keys of one width, got {query_size} and {key_size}"
            )
        return DotScore() if name == "dot" else ScaledDotScore()
    raise ValueError(f"unknown attention score {name!r}; choose one of {list(SCORE_NAMES)}")


__all__ = ["SCORE_NAMES", "AdditiveScore", "DotScore", "GeneralScore", "ScaledDotScore", "build_score"]
