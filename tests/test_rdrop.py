"""R-Drop (issue 57): `loss.consistency_loss` against a hand-computed KL, and `attn train --rdrop_alpha`'s loss in a
real Trainer against the same computation written out (the same dropout masks, drawn from the same seed).

The fused loss (`loss.linear_consistency_loss`, no logits held) against autograd through `token_loss` +
`consistency_loss` on the full logits, in float64, over several chunks; the trainer's fused path against its
full-logit path on the same model, batch and dropout masks.
"""

from __future__ import annotations

import math

import pytest
import torch
from modeling_attn.training.trainer import TranslationTrainer
from test_padding_free import ragged_labels
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers import Seq2SeqTrainingArguments
from transformers.trainer_pt_utils import LabelSmoother

from modeling_attn import loss as loss_module
from modeling_attn.loss import consistency_loss, labelled_consistency_loss, linear_consistency_loss, token_loss


def test_the_symmetric_kl_of_two_distributions_hand_computed_padding_ignored():
    p, q = [0.25, 0.75], [0.5, 0.5]
    logits = torch.tensor([[[math.log(p[0]), math.log(p[1])], [9.0, -9.0]]])  # position 2 is padding
    other = torch.tensor([[[math.log(q[0]), math.log(q[1])], [-9.0, 9.0]]])
    labels = torch.tensor([[1, -100]])
    kl_pq = sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))
    kl_qp = sum(b * math.log(b / a) for a, b in zip(p, q, strict=True))
    found = consistency_loss(logits, other, labels)
    assert found.item() == pytest.approx((kl_pq + kl_qp) / 2, rel=1e-6)
    assert consistency_loss(logits, other, labels, num_items_in_batch=4).item() == pytest.approx(found.item() / 4)
    assert consistency_loss(logits, logits, labels).item() == 0


def test_it_equals_torch_s_kl_div_both_ways_on_random_logits():
    torch.manual_seed(0)
    logits, other = torch.randn(3, 5, 11), torch.randn(3, 5, 11)
    labels = torch.randint(0, 11, (3, 5))
    labels[1, 3:] = -100
    kept = labels != -100
    log_p, log_q = logits[kept].log_softmax(-1), other[kept].log_softmax(-1)
    kl = torch.nn.functional.kl_div
    expected = kl(log_q, log_p, log_target=True, reduction="sum") + kl(log_p, log_q, log_target=True, reduction="sum")
    torch.testing.assert_close(consistency_loss(logits, other, labels), expected / 2 / kept.sum())


@pytest.mark.parametrize("make", [tiny_model, spread_tiny_rnn], ids=["transformer", "rnn"])
def test_a_trainer_step_adds_alpha_times_the_kl_of_two_dropout_passes(tmp_path, make):
    model = make(dropout=0.3)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = ragged_labels(decoder_input_ids)
    args = Seq2SeqTrainingArguments(tmp_path, label_smoothing_factor=0.1, report_to="none", use_cpu=True)
    trainer = TranslationTrainer(model=model, args=args, rdrop_alpha=5.0)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    model.train()
    torch.manual_seed(3)
    found = trainer.compute_loss(model, dict(inputs))
    torch.manual_seed(3)  # the same masks: the batch twice in one pass, written out
    twice = {key: torch.cat([value, value]) for key, value in inputs.items()}
    logits = model(**twice).logits  # with labels: the Transformer then skips padded target rows, as in training
    cross_entropy = LabelSmoother(0.1)({"logits": logits}, twice["labels"], shift_labels=False)
    first, second = logits.chunk(2)
    kept = labels != -100
    log_p, log_q = first[kept].log_softmax(-1), second[kept].log_softmax(-1)
    divergence = ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum() / 2 / kept.sum()
    assert divergence > 1e-4  # two different masks
    torch.testing.assert_close(found, cross_entropy + 5.0 * divergence, rtol=1e-5, atol=1e-6)

    trainer.log({"loss": found.item()})  # the parts, logged beside the loss
    logged = trainer.state.log_history[-1]
    assert logged["rdrop_cross_entropy"] == pytest.approx(cross_entropy.item(), abs=1e-4)
    assert logged["rdrop_kl"] == pytest.approx(divergence.item(), abs=1e-4)

    model.eval()  # evaluation: the plain loss, one pass
    torch.testing.assert_close(trainer.compute_loss(model, dict(inputs)), trainer.compute_loss(model, dict(inputs)))
    plain = TranslationTrainer(model=model, args=args)
    torch.testing.assert_close(trainer.compute_loss(model, dict(inputs)), plain.compute_loss(model, dict(inputs)))


def _two_copies(rows=37, width=8, vocab=23, bias=True, seed=0):
    """Hidden states of two copies of the same rows (different, as two dropout masks make them), an output layer,
    labels with -100 rows inside; float64."""
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(*shape, generator=generator, dtype=torch.float64) for shape in ((rows, width),) * 2]
    tensors += [torch.randn(vocab, width, generator=generator, dtype=torch.float64)]
    tensors += [torch.randn(vocab, generator=generator, dtype=torch.float64) if bias else None]
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    labels[::5] = -100
    return [tensor.requires_grad_() if tensor is not None else None for tensor in tensors], labels


def _unfused(hidden_a, hidden_b, weight, bias, labels, num_items, smoothing, alpha):
    """The reference: `token_loss` of both copies' full logits plus alpha x `consistency_loss`."""
    logits_a = torch.nn.functional.linear(hidden_a, weight, bias)[None]
    logits_b = torch.nn.functional.linear(hidden_b, weight, bias)[None]
    twice = None if num_items is None else 2 * num_items
    cross_entropy = token_loss(torch.cat([logits_a, logits_b], 1), labels.repeat(2)[None], twice, smoothing)
    divergence = consistency_loss(logits_a, logits_b, labels[None], num_items)
    return cross_entropy + alpha * divergence, cross_entropy, divergence


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("num_items", [None, 50])  # the labelled rows, or Trainer's count over accumulated batches
@pytest.mark.parametrize("with_bias", [True, False])
def test_the_fused_loss_and_its_gradients_equal_autograd_on_the_full_logits(
    monkeypatch, smoothing, num_items, with_bias
):
    monkeypatch.setattr(loss_module, "LOSS_CHUNK_LOGITS", 5 * 23)  # 5 rows a chunk: 8 chunks, the last short
    tensors, labels = _two_copies(bias=with_bias)
    wanted = [tensor for tensor in tensors if tensor is not None]
    for alpha in (0.0, 3.0):  # the cross-entropy's gradients alone, then with the KL's
        hidden_a, hidden_b, weight, bias = tensors
        found = linear_consistency_loss(hidden_a, hidden_b, weight, labels, bias, num_items, smoothing, alpha)
        expected = _unfused(*tensors, labels, num_items, smoothing, alpha)
        assert expected[2] > 0.1  # two different copies
        for mine, theirs in zip(found, expected, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
        assert not found[1].requires_grad and not found[2].requires_grad  # the parts are for the log
        gradients = [torch.autograd.grad(loss, wanted) for loss in (found[0], expected[0])]
        for mine, theirs in zip(*gradients, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
        with torch.no_grad():  # no gradient wanted: the same values, no gradient work
            for mine, theirs in zip(
                linear_consistency_loss(hidden_a, hidden_b, weight, labels, bias, num_items, smoothing, alpha),
                found,
                strict=True,
            ):
                torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)


class _Wrapped(torch.nn.Linear):
    """An output layer `fuses_output_loss` refuses (not a plain nn.Linear): the unfused path."""


def test_the_labelled_rows_of_a_doubled_batch_fused_and_unfused_alike(monkeypatch):
    monkeypatch.setattr(loss_module, "LOSS_CHUNK_LOGITS", 3 * 23)
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(2 * 3, 5, 8, generator=generator, dtype=torch.float64, requires_grad=True)  # (2B, T, E)
    labels = ragged_labels(torch.randint(0, 23, (3, 5), generator=generator))
    plain = torch.nn.Linear(8, 23, bias=False, dtype=torch.float64)
    wrapped = _Wrapped(8, 23, bias=False, dtype=torch.float64)
    wrapped.load_state_dict(plain.state_dict())
    bias = torch.randn(23, generator=generator, dtype=torch.float64)
    results = []
    for layer in (plain, wrapped):
        found = labelled_consistency_loss(hidden, labels, layer, bias, None, 0.1, 2.0)
        results.append([*found, *torch.autograd.grad(found[0], [hidden, layer.weight])])
    for mine, theirs in zip(*results, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
    assert not results[0][-2].unflatten(0, (2, -1))[:, labels == -100].any()  # padding: no gradient, both copies
    with pytest.raises(ValueError, match="labels have shape"):
        labelled_consistency_loss(hidden, labels[:2], plain)


@pytest.mark.parametrize("make", [tiny_model, spread_tiny_rnn], ids=["transformer", "rnn"])
def test_the_trainer_s_fused_step_equals_its_full_logit_step(tmp_path, monkeypatch, make):
    model = make(dropout=0.3)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=ragged_labels(decoder_input_ids))
    args = Seq2SeqTrainingArguments(tmp_path, label_smoothing_factor=0.1, report_to="none", use_cpu=True)
    trainer = TranslationTrainer(model=model, args=args, rdrop_alpha=5.0)
    model.train()
    calls = []
    monkeypatch.setattr(loss_module, "_LinearConsistencyLoss", _Counted(loss_module._LinearConsistencyLoss, calls))
    found = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(trainer, "_fused_output_layer", lambda model, inputs: None)
        torch.manual_seed(3)  # the same dropout masks
        loss = trainer.compute_loss(model, dict(inputs), num_items_in_batch=torch.tensor(40))
        found.append([loss, *trainer._rdrop_parts.pop(), *torch.autograd.grad(loss, list(model.parameters()))])
    assert len(calls) == 1  # the first step took the fused path, the second did not
    assert found[0][2] > 1e-4  # two different dropout masks: a KL to compare
    for mine, theirs in zip(*found, strict=True):  # float32, summed in another order (chunks): ~1e-6 apart
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    loss, outputs = trainer.compute_loss(model, dict(inputs), return_outputs=True)  # outputs: full logits
    assert outputs.logits.shape[0] == 2 * input_ids.shape[0]


class _Counted:
    """An autograd function whose `apply` calls are counted."""

    def __init__(self, function, calls):
        self.function, self.calls = function, calls

    def apply(self, *args):
        self.calls.append(1)
        return self.function.apply(*args)


def test_skip_output_layer_returns_what_the_output_layer_reads():
    model = tiny_model()
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = ragged_labels(decoder_input_ids)
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, skip_output_layer=True)
    output_layer, bias = model.output_layer()
    logits = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    projected = output_layer(outputs.last_hidden_state)
    torch.testing.assert_close(projected if bias is None else projected + bias, logits)
    with pytest.raises(ValueError, match="skip_output_layer"):
        model(
            input_ids=input_ids, attention_mask=attention_mask, labels=labels, skip_output_layer=True, skip_logits=True
        )
