"""Padding-free position-wise work: the feed-forward network skips padded positions, and with
`skip_logits=True` (both model types) the output projection and loss run on labelled positions only. Reference
checks: the same loss, the same gradients and the same outputs at real positions as the dense computation."""

from __future__ import annotations

import pytest
import torch
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers.trainer_pt_utils import LabelSmoother

from modeling_attn import loss as loss_module
from modeling_attn.inputs import labelled_prefix
from modeling_attn.padding_free import each_on_rows, kept_rows, on_rows


def ragged_labels(decoder_input_ids: torch.Tensor) -> torch.Tensor:
    """Right-padded labels (row r loses its last r positions) with one -100 inside the last row."""
    labels = decoder_input_ids.clone()
    for row in range(1, labels.shape[0]):
        labels[row, labels.shape[1] - row :] = -100
    labels[-1, 1] = -100
    return labels


MODELS = {"transformer": tiny_model, "rnn": spread_tiny_rnn}  # both take the vocabulary of padded_batch (99)


def dense_loss(model, input_ids, attention_mask, labels, epsilon: float) -> torch.Tensor:
    """Loss from the full logits, the way Trainer computes it with label_smoothing_factor."""
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels.clamp(min=0))
    logits = model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    return LabelSmoother(epsilon)({"logits": logits}, labels, shift_labels=False)


def test_kept_rows_and_on_rows_hand_computed():
    assert kept_rows(None) is None
    assert kept_rows(torch.ones(2, 3)) is None
    assert kept_rows(torch.tensor([[1, 1, 0], [1, 0, 0]])).tolist() == [0, 1, 3]
    states = torch.arange(12.0).view(2, 3, 2)
    out = on_rows(lambda x: x * 10, states, torch.tensor([0, 1, 3]))
    assert out.tolist() == [[[0, 10], [20, 30], [0, 0]], [[60, 70], [0, 0], [0, 0]]]
    picked = []

    def times(factor):
        def function(x):
            picked.append(x.shape[0])
            return x * factor

        return function

    tens, halves = each_on_rows((times(10), times(0.5)), states, torch.tensor([0, 1, 3]))
    assert tens.tolist() == out.tolist() and picked == [3, 3]  # each function sees the 3 real rows only
    assert halves.tolist() == [[[0, 0.5], [1, 1.5], [0, 0]], [[3, 3.5], [0, 0], [0, 0]]]
    assert [x.tolist() for x in each_on_rows((times(10),), states, None)] == [(states * 10).tolist()]


def test_labelled_prefix_keeps_inner_ignored_positions_and_position_zero():
    labels = torch.tensor([[5, 6, 7, -100], [5, -100, 7, -100], [-100, -100, -100, -100]])
    assert labelled_prefix(labels).tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0]]


@pytest.mark.parametrize("norm_first", [False, True])
def test_feed_forward_on_real_tokens_only_gives_the_same_outputs(norm_first):
    """The encoder output at real tokens and the logits at labelled positions do not depend on the skipping."""
    model = tiny_model(norm_first=norm_first)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = ragged_labels(decoder_input_ids)
    out = model(input_ids, attention_mask=attention_mask, labels=labels)
    # reference: the same rows one at a time, unpadded, so nothing is skipped
    for row in range(input_ids.shape[0]):
        source = input_ids[row : row + 1, : int(attention_mask[row].sum())]
        length = int(labelled_prefix(labels[row : row + 1]).sum())
        single = model(source, labels=labels[row : row + 1, :length])
        real = attention_mask[row].bool()
        torch.testing.assert_close(out.encoder_last_hidden_state[row, real], single.encoder_last_hidden_state[0])
        torch.testing.assert_close(out.logits[row, :length], single.logits[0])


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_loss_on_labelled_positions_equals_trainers_label_smoother(kind, epsilon):
    model = MODELS[kind]()
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = ragged_labels(decoder_input_ids)
    expected = dense_loss(model, input_ids, attention_mask, labels, epsilon)
    eval_out = model(input_ids, attention_mask=attention_mask, labels=labels, smoothing=epsilon)
    torch.testing.assert_close(eval_out.loss, expected)

    skipped = model(input_ids, attention_mask=attention_mask, labels=labels, skip_logits=True, smoothing=epsilon)
    assert skipped.logits is None
    torch.testing.assert_close(skipped.loss, expected)


@pytest.mark.parametrize(("kind", "final_logits_bias"), [("transformer", False), ("transformer", True), ("rnn", None)])
def test_gradients_of_the_padding_free_loss_equal_the_dense_ones(monkeypatch, kind, final_logits_bias):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = ragged_labels(decoder_input_ids)
    options = {} if final_logits_bias is None else {"final_logits_bias": final_logits_bias}
    dense, sparse = (MODELS[kind](**options).train() for _ in range(2))
    if final_logits_bias:  # Marian's fixed bias, made non-zero
        for model in (dense, sparse):
            model.final_logits_bias.copy_(torch.linspace(-1, 1, model.final_logits_bias.shape[-1]))
    dense_loss(dense, input_ids, attention_mask, labels, 0.1).backward()
    fused = []  # on the CPU the loss-only call goes through the fused output-layer loss
    monkeypatch.setattr(loss_module, "linear_token_loss", spy(loss_module.linear_token_loss, fused))
    sparse(input_ids, attention_mask=attention_mask, labels=labels, skip_logits=True, smoothing=0.1).loss.backward()
    assert len(fused) == 1
    for (name, a), b in zip(dense.named_parameters(), sparse.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


@pytest.mark.parametrize(("kind", "final_logits_bias"), [("transformer", False), ("transformer", True), ("rnn", None)])
def test_an_output_layer_with_hooks_is_called_not_bypassed(monkeypatch, kind, final_logits_bias):
    """Adapters, DeepSpeed ZeRO-3 and FSDP work through hooks on the layer: the loss then runs the layer itself
    (and adds Marian's fixed bias to its output, as the fused path does)."""
    options = {} if final_logits_bias is None else {"final_logits_bias": final_logits_bias}
    model = MODELS[kind](**options)
    if final_logits_bias:
        model.final_logits_bias.copy_(torch.linspace(-1, 1, model.final_logits_bias.shape[-1]))
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = ragged_labels(decoder_input_ids)
    expected = dense_loss(model, input_ids, attention_mask, labels, 0.1)
    fused, hooked = [], []
    monkeypatch.setattr(loss_module, "linear_token_loss", spy(loss_module.linear_token_loss, fused))
    model.lm_head.register_forward_hook(lambda module, args, output: hooked.append(output.shape))
    loss = model(input_ids, attention_mask=attention_mask, labels=labels, skip_logits=True, smoothing=0.1).loss
    torch.testing.assert_close(loss, expected)
    assert fused == [] and hooked == [(int((labels != -100).sum()), model.config.vocab_size)]


def spy(function, calls: list):
    def wrapped(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("kind", MODELS)
def test_skip_logits_checks_its_labels(kind):
    model = MODELS[kind]()
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, skip_logits=True)
    with pytest.raises(ValueError, match="labels have shape"):
        model(**batch, decoder_input_ids=decoder_input_ids, labels=input_ids)
    with pytest.raises(ValueError, match="no target token"):
        model(**batch, labels=torch.full_like(decoder_input_ids, -100))
    with pytest.raises(ValueError, match="skip_logits=True computes only the loss, from labels"):
        model(**batch, decoder_input_ids=decoder_input_ids)


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("value", [-0.1, 1.0, True, "0.1"])
@pytest.mark.parametrize("skip_logits", [False, True])
def test_label_smoothing_must_be_a_probability(kind, value, skip_logits):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    with pytest.raises(ValueError, match=rf"label smoothing must be a probability in \[0, 1\), got {value!r}"):
        MODELS[kind]()(
            input_ids,
            attention_mask=attention_mask,
            labels=decoder_input_ids,
            skip_logits=skip_logits,
            smoothing=value,
        )


@pytest.mark.parametrize("kind", MODELS)
def test_translation_trainer_passes_label_smoothing_at_call_time_and_skips_logits(tmp_path, kind):
    """A real Trainer training step: the same loss as Trainer's LabelSmoother, computed with skip_logits=True and
    smoothing given to forward; the model's config is left alone."""
    from modeling_attn.training.trainer import TranslationTrainer
    from transformers import Seq2SeqTrainingArguments

    model = MODELS[kind]()
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = ragged_labels(decoder_input_ids)
    expected = dense_loss(model, input_ids, attention_mask, labels, 0.1)
    args = Seq2SeqTrainingArguments(tmp_path, label_smoothing_factor=0.1, report_to="none", use_cpu=True)
    trainer = TranslationTrainer(model=model, args=args)
    assert trainer.label_smoother is None and "label_smoothing" not in model.config.to_dict()

    calls = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append((kwargs.get("skip_logits"), kwargs.get("smoothing"))),
        with_kwargs=True,
    )
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    torch.testing.assert_close(trainer.compute_loss(model, dict(inputs)), expected)
    loss, outputs = trainer.compute_loss(model, dict(inputs), return_outputs=True)  # evaluation: full logits
    torch.testing.assert_close(loss, expected)
    assert outputs.logits.shape == (*labels.shape, 99)
    assert calls == [(True, 0.1), (None, 0.1)]
