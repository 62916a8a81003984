"""Bad input gets a clear error naming the argument and the offending value; never a silent wrong answer."""

from __future__ import annotations

import pytest
import torch
from tiny import padded_batch, tiny_model
from transformers.cache_utils import DynamicCache


@pytest.fixture(scope="module")
def model():
    return tiny_model("sdpa")


def test_source_id_beyond_vocabulary(model):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    input_ids[1, 2] = 99
    with pytest.raises(
        IndexError, match=r"input_ids holds token id 99 at \(batch, position\) \(1, 2\); ids must be in \[0, 99\)"
    ):
        model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)


def test_negative_target_id(model):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    decoder_input_ids[0, 4] = -3
    with pytest.raises(IndexError, match=r"decoder_input_ids holds token id -3 at \(batch, position\) \(0, 4\)"):
        model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)


def test_label_beyond_vocabulary_and_all_ignored_labels(model):
    input_ids, attention_mask, labels = padded_batch()
    bad = labels.clone()
    bad[2, 0] = 500
    with pytest.raises(IndexError, match=r"labels holds token id 500 .*\[0, 99\) or -100"):
        model(input_ids, attention_mask=attention_mask, labels=bad)
    with pytest.raises(ValueError, match="labels hold no target token"):
        model(input_ids, attention_mask=attention_mask, labels=torch.full_like(labels, -100))


def test_float_ids_are_rejected(model):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    with pytest.raises(TypeError, match="input_ids must hold integer token ids, got dtype torch.float32"):
        model(input_ids.float(), attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)


@pytest.mark.parametrize("shape", [(3, 6), (2, 7), (3, 7, 1)])
def test_mask_of_wrong_shape(model, shape):
    input_ids, _, decoder_input_ids = padded_batch()
    with pytest.raises(
        ValueError, match=rf"attention_mask has shape \({shape[0]}, {shape[1]}.*expected \(batch, length\) = \(3, 7\)"
    ):
        model(input_ids, attention_mask=torch.ones(shape, dtype=torch.long), decoder_input_ids=decoder_input_ids)


def test_decoder_mask_of_wrong_shape(model):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    with pytest.raises(ValueError, match=r"decoder_attention_mask has shape \(3, 4\), expected .* \(3, 5\)"):
        model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=torch.ones(3, 4),
        )


def test_mask_with_values_other_than_zero_and_one(model):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    with pytest.raises(ValueError, match="attention_mask must hold 0 .* and 1"):
        model(input_ids, attention_mask=attention_mask * 0.5, decoder_input_ids=decoder_input_ids)


@pytest.mark.parametrize("shape", [(0, 7), (3, 0)])
def test_empty_batch(model, shape):
    with pytest.raises(
        ValueError,
        match=rf"input_ids must be a non-empty \(batch, length\) tensor, got shape \({shape[0]}, {shape[1]}\)",
    ):
        model(torch.zeros(shape, dtype=torch.long), decoder_input_ids=torch.ones(3, 2, dtype=torch.long))


def test_both_or_neither_ids_and_embeddings(model):
    input_ids, _, decoder_input_ids = padded_batch()
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model(input_ids, inputs_embeds=torch.zeros(3, 7, 16), decoder_input_ids=decoder_input_ids)
    with pytest.raises(ValueError, match="exactly one of decoder_input_ids and decoder_inputs_embeds"):
        model(input_ids)


def test_sequence_longer_than_the_position_table():
    model = tiny_model("sdpa", max_position_embeddings=8)
    with pytest.raises(ValueError, match="sequence of 9 positions exceeds max_position_embeddings=8"):
        model(torch.ones(1, 9, dtype=torch.long), decoder_input_ids=torch.ones(1, 2, dtype=torch.long))


def test_wrong_cache_type(model):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    with pytest.raises(TypeError, match="past_key_values must be an EncoderDecoderCache"):
        model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            past_key_values=DynamicCache(),
            use_cache=True,
        )
