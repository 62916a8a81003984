"""Score functions of classic attention (modeling_attn/scores.py): hand-computed values, and the shared
masked-softmax-and-context step (attention.attend) applied to them."""

import math

import pytest
import torch

from modeling_attn.attention import attend
from modeling_attn.masks import padding_mask
from modeling_attn.scores import SCORE_NAMES, AdditiveScore, DotScore, GeneralScore, ScaledDotScore, build_score

# Two queries (T = 2) against two annotations (S = 2), batch of one.
QUERY = torch.tensor([[[1.0, 2.0], [0.0, -1.0]]])  # (1, 2, 2)
KEYS_2D = torch.tensor([[[3.0, 4.0], [5.0, -6.0]]])  # (1, 2, 2): annotations as wide as the query
KEYS_3D = torch.tensor([[[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]]])  # (1, 2, 3): wider annotations


def test_dot_score_by_hand():
    # s^T h: [1, 2].[3, 4] = 11, [1, 2].[5, -6] = -7, [0, -1].[3, 4] = -4, [0, -1].[5, -6] = 6
    score = DotScore()
    scores = score(QUERY, score.project_keys(KEYS_2D))
    torch.testing.assert_close(scores, torch.tensor([[[11.0, -7.0], [-4.0, 6.0]]]))


def test_scaled_dot_score_by_hand():
    score = ScaledDotScore()
    scores = score(QUERY, score.project_keys(KEYS_2D))
    torch.testing.assert_close(scores, torch.tensor([[[11.0, -7.0], [-4.0, 6.0]]]) / math.sqrt(2))


def test_general_score_by_hand():
    score = GeneralScore(query_size=2, key_size=3)
    with torch.no_grad():
        score.key_proj.weight.copy_(torch.tensor([[1.0, 0.0, 1.0], [1.0, 2.0, 0.0]]))  # W_a
    # W_a h_1 = [3, 1], W_a h_2 = [-1, 2]; s^T W_a h: [1, 2] -> 5, 3; [0, -1] -> -1, -2
    scores = score(QUERY, score.project_keys(KEYS_3D))
    torch.testing.assert_close(scores, torch.tensor([[[5.0, 3.0], [-1.0, -2.0]]]))


def test_additive_score_by_hand():
    score = AdditiveScore(query_size=2, key_size=3, attention_size=2)
    with torch.no_grad():
        score.query_proj.weight.copy_(torch.eye(2))  # W_a
        score.key_proj.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))  # U_a
        score.energy.weight.copy_(torch.tensor([[1.0, -1.0]]))  # v_a
    # U_a h_1 = [1, 2], U_a h_2 = [0, -1]; v_a^T tanh(W_a s + U_a h):
    # s = [1, 2]:  tanh([2, 4]) -> tanh 2 - tanh 4;  tanh([1, 1]) -> 0
    # s = [0, -1]: tanh([1, 1]) -> 0;                tanh([0, -2]) -> tanh 2
    expected = torch.tensor([[[math.tanh(2) - math.tanh(4), 0.0], [0.0, math.tanh(2)]]])
    torch.testing.assert_close(score(QUERY, score.project_keys(KEYS_3D)), expected)


@pytest.mark.parametrize("name", SCORE_NAMES)
def test_alignment_is_a_distribution_over_real_tokens(name):
    torch.manual_seed(0)
    score = build_score(name, query_size=6, key_size=6 if "dot" in name else 4, attention_size=5)
    annotations = torch.randn(3, 5, 6 if "dot" in name else 4)  # (B, S, K)
    query = torch.randn(3, 2, 6)  # (B, T, Q)
    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    context, alignment = attend(
        score(query, score.project_keys(annotations)), annotations, padding_mask(attention_mask)
    )
    assert alignment.shape == (3, 2, 5)
    torch.testing.assert_close(alignment.sum(-1), torch.ones(3, 2))
    assert (alignment.masked_select(~attention_mask.bool()[:, None, :]) == 0).all()  # exactly 0 on padding
    torch.testing.assert_close(context, torch.einsum("bts,bsk->btk", alignment, annotations))  # c = sum_j alpha_j h_j
    torch.testing.assert_close(alignment[2], torch.tensor([[1.0, 0, 0, 0, 0]] * 2))  # one real token takes it all


def test_build_score_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown attention score 'location'"):
        build_score("location", 4, 4, 4)
    with pytest.raises(ValueError, match="'dot' score needs queries and keys of one width, got 4 and 6"):
        build_score("dot", 4, 6, 4)
