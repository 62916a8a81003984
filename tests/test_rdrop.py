"""R-Drop (issue 57): `loss.consistency_loss` against a hand-computed KL, and `attn train --rdrop_alpha`'s loss in a
real Trainer against the same computation written out (the same dropout masks, drawn from the same seed)."""

from __future__ import annotations

import math

import pytest
import torch
from modeling_attn.training.trainer import TranslationTrainer
from test_padding_free import ragged_labels
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers import Seq2SeqTrainingArguments
from transformers.trainer_pt_utils import LabelSmoother

from modeling_attn.loss import consistency_loss


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
