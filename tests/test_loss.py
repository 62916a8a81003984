"""`modeling_attn.loss`: the chunked output-projection loss of the CPU fast path against the unfused loss.

`linear_token_loss` must give `token_loss`'s value and autograd's gradients of it (hidden states, weight, bias),
whatever the chunking.
"""

from __future__ import annotations

import pytest
import torch

from modeling_attn import loss as loss_module
from modeling_attn.loss import fuses_output_loss, linear_token_loss, token_loss


def _problem(rows=37, width=8, vocab=23, bias=True, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=generator, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, width, generator=generator, dtype=dtype, requires_grad=True)
    bias_ = torch.randn(vocab, generator=generator, dtype=dtype, requires_grad=True) if bias else None
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    labels[::5] = -100  # ignored rows inside the batch
    return hidden, weight, bias_, labels


def _reference(hidden, weight, bias, labels, num_items, smoothing):
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return token_loss(logits[None], labels[None], num_items, smoothing)


def _gradients(loss, tensors):
    return torch.autograd.grad(loss, [tensor for tensor in tensors if tensor is not None])


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk_logits", [23, 5 * 23, 1 << 21])  # one row a chunk, 5 rows (last chunk short), all
@pytest.mark.parametrize("with_bias", [True, False])
def test_loss_and_gradients_equal_the_unfused_loss(monkeypatch, smoothing, chunk_logits, with_bias):
    monkeypatch.setattr(loss_module, "LOSS_CHUNK_LOGITS", chunk_logits)
    hidden, weight, bias, labels = _problem(bias=with_bias)
    for num_items in (None, 50):  # its own token count, or Trainer's count over accumulated batches
        expected = _reference(hidden, weight, bias, labels, num_items, smoothing)
        got = linear_token_loss(hidden, weight, labels, bias, num_items, smoothing)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        for mine, theirs in zip(
            _gradients(got, (hidden, weight, bias)), _gradients(expected, (hidden, weight, bias)), strict=True
        ):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_hand_computed_value():
    # one row, logits (0, ln 2, ln 3) with identity weight: softmax (1, 2, 3) / 6, target 2, epsilon 0.3:
    # loss = -(0.7 ln(3/6) + 0.1 (ln(1/6) + ln(2/6) + ln(3/6))) = 0.7 ln 2 + 0.1 ln(36)
    hidden = torch.tensor([[0.0, torch.log(torch.tensor(2.0)), torch.log(torch.tensor(3.0))]], requires_grad=True)
    loss = linear_token_loss(hidden, torch.eye(3), torch.tensor([2]), label_smoothing=0.3)
    expected = 0.7 * torch.log(torch.tensor(2.0)) + 0.1 * torch.log(torch.tensor(36.0))
    torch.testing.assert_close(loss, expected)
    loss.backward()  # d loss / d logits = softmax - 0.7 one-hot - 0.1
    torch.testing.assert_close(hidden.grad, torch.tensor([[1 / 6 - 0.1, 2 / 6 - 0.1, 3 / 6 - 0.8]]))


def test_gradcheck_in_double_precision(monkeypatch):
    monkeypatch.setattr(loss_module, "LOSS_CHUNK_LOGITS", 2 * 7)  # two rows a chunk
    hidden, weight, bias, labels = _problem(rows=5, width=3, vocab=7, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda h, w, b: linear_token_loss(h, w, labels, b, label_smoothing=0.2), (hidden, weight, bias)
    )


def test_only_the_wanted_gradients_and_the_no_grad_value():
    hidden, weight, bias, labels = _problem()
    frozen_weight = weight.detach()
    loss = linear_token_loss(hidden, frozen_weight, labels, bias.detach(), label_smoothing=0.1)
    saved = loss.grad_fn.next_functions[0][0].saved_tensors  # the gradients made in the forward pass
    assert saved[0].shape == hidden.shape and saved[1:] == (None, None)  # none for the frozen weight and bias
    (grad,) = torch.autograd.grad(loss, hidden)
    expected = _reference(hidden, frozen_weight, bias.detach(), labels, None, 0.1)
    torch.testing.assert_close(grad, torch.autograd.grad(expected, hidden)[0], rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(linear_token_loss(hidden, weight, labels, bias, label_smoothing=0.1), expected)


def test_autocast_is_off_inside_and_half_precision_is_refused():
    hidden, weight, bias, labels = _problem()
    expected = _reference(hidden, weight, bias, labels, None, 0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_token_loss(hidden, weight, labels, bias, label_smoothing=0.1)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)  # float32, not bfloat16 matmuls
    with pytest.raises(TypeError, match="float32 or float64 weights, got torch.bfloat16"):
        linear_token_loss(hidden, weight.to(torch.bfloat16), labels)


def test_where_the_models_fuse_the_output_layer_loss():
    hidden = torch.randn(3, 8)
    plain = torch.nn.Linear(8, 5, bias=False)
    assert fuses_output_loss(plain, hidden)
    assert not fuses_output_loss(torch.nn.Linear(8, 5), hidden)  # its bias would be dropped
    assert not fuses_output_loss(torch.nn.Linear(8, 5, bias=False).to(torch.bfloat16), hidden)
    assert not fuses_output_loss(type("Adapter", (torch.nn.Linear,), {})(8, 5, bias=False), hidden)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fuses_output_loss(plain, hidden)
    handle = plain.register_forward_pre_hook(lambda module, args: None)
    assert not fuses_output_loss(plain, hidden)
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
    try:
        assert not fuses_output_loss(plain, hidden)
    finally:
        handle.remove()
    assert fuses_output_loss(plain, hidden)


def test_bad_input_is_named():
    hidden, weight, bias, labels = _problem()
    with pytest.raises(ValueError, match=r"hidden_states \(rows, width\) and labels \(rows,\).*\(37, 8\) and \(36,\)"):
        linear_token_loss(hidden, weight, labels[1:])
    with pytest.raises(ValueError, match="no target token"):
        linear_token_loss(hidden, weight, torch.full_like(labels, -100))
