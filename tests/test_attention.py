"""Attention maths: hand-computed values, the masking convention, eager vs SDPA parity."""

from __future__ import annotations

import math

import pytest
import torch

from modeling_attn.attention import attend, eager_attention_forward, merge_heads, split_heads
from modeling_attn.masks import masked_softmax


class _Module(torch.nn.Module):
    is_causal = False


def test_scaled_dot_product_attention_hand_computed():
    # One query, two keys, d_k = 2: scores = q.k / sqrt(2) = [1/sqrt(2), 0] (Eq. 1).
    query = torch.tensor([[[[1.0, 0.0]]]])
    key = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    value = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    first = math.exp(1 / math.sqrt(2)) / (math.exp(1 / math.sqrt(2)) + 1)
    output, weights = eager_attention_forward(_Module().eval(), query, key, value, None)
    assert weights.flatten().tolist() == pytest.approx([first, 1 - first], abs=1e-6)
    assert output.flatten().tolist() == pytest.approx([first * 1 + (1 - first) * 3, first * 2 + (1 - first) * 4])


def test_masked_keys_get_exactly_zero_weight_and_rows_sum_to_one():
    scores = torch.randn(2, 3, 4, 5)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    weights = masked_softmax(scores, mask)
    assert torch.all(weights[1, ..., 3:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4))


def test_boolean_and_additive_masks_agree():
    scores = torch.randn(2, 1, 3, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)[:, None, None, :]
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert torch.equal(masked_softmax(scores, mask), masked_softmax(scores, additive))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fully_masked_row_gives_no_nan(dtype):
    scores = (torch.randn(1, 1, 2, 3) * 100).to(dtype)
    mask = torch.tensor([[True, True, True], [False, False, False]])
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    for weights in (masked_softmax(scores, mask), masked_softmax(scores, additive)):
        assert torch.isfinite(weights).all()
        assert weights[..., 1, :].float().sum().item() == pytest.approx(1.0, abs=1e-2)


def test_attend_is_the_weighted_sum_of_values():
    scores, values = torch.randn(2, 4, 6), torch.randn(2, 6, 3)
    output, weights = attend(scores, values)
    torch.testing.assert_close(output, torch.einsum("bts,bsd->btd", weights, values))


def test_split_and_merge_heads_are_inverse():
    states = torch.randn(2, 5, 12)
    heads = split_heads(states, head_dim=3)  # (B, H, L, D)
    assert heads.shape == (2, 4, 5, 3)
    assert torch.equal(heads[:, 1, :, :], states[..., 3:6])
    assert torch.equal(merge_heads(heads.transpose(1, 2)), states)


@pytest.mark.parametrize("causal", [False, True])
def test_eager_matches_pytorch_sdpa(causal):
    query, key, value = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    if causal:
        mask = mask & torch.ones(5, 5, dtype=torch.bool).tril()
    output, _ = eager_attention_forward(_Module().eval(), query, key, value, mask)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    torch.testing.assert_close(output, expected.transpose(1, 2), atol=1e-5, rtol=1e-5)
