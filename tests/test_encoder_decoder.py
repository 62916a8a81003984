"""The encoder-decoder base both model types share: training settings are call-time arguments, never config fields.

A checkpoint fine-tuned through Trainer trains with exactly the loss Trainer's arguments say (the loss it logs equals
the cross-entropy computed by hand from the logits), whatever an older config.json held.
"""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch
from modeling_attn.training.trainer import TranslationTrainer
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, default_data_collator
from transformers.testing_utils import CaptureLogger
from transformers.utils import find_labels

from modeling_attn import AttnRNNForConditionalGeneration, AttnTransformerForConditionalGeneration, validation

MODELS = {
    "transformer": (tiny_model, AttnTransformerForConditionalGeneration),
    "rnn": (spread_tiny_rnn, AttnRNNForConditionalGeneration),
}


def pairs() -> datasets.Dataset:
    """Three padded training pairs: right-padded sources, labels with -100 after each row's end."""
    input_ids, attention_mask, labels = padded_batch(seed=1)
    for row in range(1, labels.shape[0]):
        labels[row, labels.shape[1] - row :] = -100
    return datasets.Dataset.from_dict(
        {"input_ids": input_ids.tolist(), "attention_mask": attention_mask.tolist(), "labels": labels.tolist()}
    )


def hand_loss(model, data: datasets.Dataset, epsilon: float) -> float:
    """Mean over the labelled tokens of -(1 - eps) log p(y) - eps/V sum_v log p(v), from the model's logits."""
    batch = default_data_collator(list(data))
    labels = batch["labels"]
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    with torch.no_grad():
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids)
    log_probs = torch.log_softmax(logits.logits.double(), dim=-1)  # (B, T, V)
    kept = labels != -100
    target = log_probs.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    per_token = -(1 - epsilon) * target - epsilon * log_probs.mean(dim=-1)
    return (per_token[kept].sum() / kept.sum()).item()


def one_step_loss(trainer_class, model, data, tmp_path, epsilon: float) -> float:
    """The loss Trainer logs for one training step on the whole of `data` (the model before the update)."""
    args = Seq2SeqTrainingArguments(
        tmp_path / f"run-{trainer_class.__name__}-{epsilon}",
        label_smoothing_factor=epsilon,
        per_device_train_batch_size=len(data),
        max_steps=1,
        logging_steps=1,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
    )
    trainer = trainer_class(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    trainer.train()
    return next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)


@pytest.mark.parametrize("kind", MODELS)
def test_a_checkpoint_fine_tunes_with_the_loss_trainers_arguments_say(tmp_path, kind):
    make, model_class = MODELS[kind]
    data = pairs()
    model = make().train()
    args = Seq2SeqTrainingArguments(
        tmp_path / "train", label_smoothing_factor=0.1, max_steps=3, report_to="none", use_cpu=True, save_strategy="no"
    )
    trainer = TranslationTrainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    trainer.train()
    assert "label_smoothing" not in model.config.to_dict()  # training wrote nothing into the config
    trainer.save_model(tmp_path / "checkpoint")
    config_file = tmp_path / "checkpoint" / "config.json"
    saved = json.loads(config_file.read_text())
    assert "label_smoothing" not in saved
    # what every `attn train` checkpoint written before label smoothing left the config holds
    config_file.write_text(json.dumps({**saved, "label_smoothing": 0.1}))

    for trainer_class, epsilon in ((TranslationTrainer, 0.0), (Seq2SeqTrainer, 0.0), (TranslationTrainer, 0.2)):
        model = model_class.from_pretrained(tmp_path / "checkpoint")
        assert not hasattr(model.config, "label_smoothing")
        expected = hand_loss(model.eval(), data, epsilon)
        assert one_step_loss(trainer_class, model.train(), data, tmp_path, epsilon) == pytest.approx(
            expected, rel=1e-4
        )
    assert hand_loss(model, data, 0.2) != pytest.approx(hand_loss(model, data, 0.0), rel=1e-2)  # the check can fail


@pytest.mark.parametrize("kind", MODELS)
def test_trainer_takes_only_labels_for_a_label_column(kind):
    """Trainer takes every `forward` argument with "label" in its name for a label column, and computes no
    evaluation loss for a batch without all of them: the call-time smoothing is named `smoothing`."""
    assert find_labels(MODELS[kind][1]) == ["labels"]


def generated_ids(prediction) -> dict[str, float]:
    """1 when the evaluation's predictions are generated token ids, 0 when they are logits."""
    predictions = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    return {"generated": float(np.issubdtype(np.asarray(predictions).dtype, np.integer))}


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("predict_with_generate", [True, False])
def test_the_evaluation_loss_is_smoothed_as_the_training_loss(tmp_path, kind, predict_with_generate):
    """TranslationTrainer smooths inside the model on training steps; its evaluation loss is smoothed alike (the
    generating evaluation of Seq2SeqTrainer calls the model itself, not compute_loss)."""
    make, _ = MODELS[kind]
    data = pairs()
    model = make().train()
    batch, optimizer = default_data_collator(list(data)), torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):  # fit the pairs: confident predictions, so that smoothed and plain losses differ clearly
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    args = Seq2SeqTrainingArguments(
        tmp_path / "eval",
        label_smoothing_factor=0.1,
        per_device_eval_batch_size=len(data),
        report_to="none",
        use_cpu=True,
        predict_with_generate=predict_with_generate,
        generation_max_length=6,
    )
    trainer = TranslationTrainer(
        model=model,
        args=args,
        eval_dataset=data,
        data_collator=default_data_collator,
        compute_metrics=generated_ids,  # with predict_with_generate: the generating evaluation, as attn train's
    )
    metrics = trainer.evaluate()
    assert metrics["eval_generated"] == float(predict_with_generate)  # which branch of prediction_step ran
    loss = metrics["eval_loss"]
    assert loss == pytest.approx(hand_loss(model, data, 0.1), rel=1e-4)
    assert loss != pytest.approx(hand_loss(model, data, 0.0), rel=1e-3)  # the check can fail
    assert trainer.label_smoother is None  # training steps still smooth inside the model


@pytest.mark.parametrize("kind", MODELS)
def test_label_smoothing_in_an_older_config_is_dropped_with_a_warning(kind):
    make, _ = MODELS[kind]
    config_class = type(make().config)
    with CaptureLogger(validation.logger) as captured:
        config = config_class(label_smoothing=0.1, vocab_size=99)
    assert "label_smoothing" not in config.to_dict() and not hasattr(config, "label_smoothing")
    assert f"{config_class.__name__}: ignoring label_smoothing=0.1" in captured.out


@pytest.mark.parametrize("kind", MODELS)
def test_label_smoothing_defaults_to_plain_cross_entropy(kind):
    model = MODELS[kind][0]()
    input_ids, attention_mask, labels = padded_batch()
    out = model(input_ids, attention_mask=attention_mask, labels=labels)
    plain = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten())
    smoothed = model(input_ids, attention_mask=attention_mask, labels=labels, smoothing=0.1).loss
    torch.testing.assert_close(out.loss, plain)
    torch.testing.assert_close(
        smoothed, torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), label_smoothing=0.1)
    )
