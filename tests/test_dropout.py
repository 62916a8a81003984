"""`modeling_attn.dropout`. `dropout` must be dropout: zeroes with probability p, scales the rest by 1 / (1 - p).
Word dropout (`config.word_dropout`): whole input tokens dropped in training. Reference checks: the mask is one
value per token, kept at rate 1 - p and scaled by 1 / (1 - p); a training forward equals an evaluation forward of
the same embeddings multiplied by the mask drawn from the same seed; evaluation is untouched."""

from __future__ import annotations

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from tiny import padded_batch, tiny_model

from modeling_attn.dropout import dropout, word_dropout


def test_a_whole_token_is_dropped_or_kept_and_scaled():
    torch.manual_seed(0)
    embeddings = torch.ones(400, 250, 6)
    dropped = word_dropout(embeddings, 0.2, training=True)
    per_token = dropped.unique(dim=-1)
    assert per_token.shape[-1] == 1  # the 6 values of each token are equal: the mask is per token
    assert set(per_token.unique().tolist()) == {0.0, 1.25}
    kept = (per_token != 0).float().mean().item()
    sigma = (0.2 * 0.8 / 100_000) ** 0.5
    assert abs(kept - 0.8) < 5 * sigma
    assert word_dropout(embeddings, 0.2, training=False) is embeddings
    assert word_dropout(embeddings, 0.0, training=True) is embeddings
    with pytest.raises(ValueError, match="between 0 and 1"):
        word_dropout(embeddings, 1.5, training=True)


def test_the_training_forward_equals_the_embeddings_times_the_mask():
    model = tiny_model(word_dropout=0.3)  # tiny: no other dropout, so the masks are the only random draws
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    torch.manual_seed(1)
    trained = model.train()(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.manual_seed(1)  # the same draws, in the same order: source tokens, then target tokens
    source_mask = dropout(torch.ones(*input_ids.shape, 1), 0.3, True)
    target_mask = dropout(torch.ones(*decoder_input_ids.shape, 1), 0.3, True)
    assert 0 < int((source_mask == 0).sum()) < input_ids.numel()  # some tokens dropped, not all
    embed = model.get_input_embeddings()
    expected = model.eval()(
        inputs_embeds=embed(input_ids) * source_mask,
        attention_mask=attention_mask,
        decoder_inputs_embeds=embed(decoder_input_ids) * target_mask,
    ).logits
    torch.testing.assert_close(trained, expected)
    untouched = tiny_model()(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    evaluated = model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(evaluated, untouched)  # same seed, same weights: evaluation ignores word_dropout


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_word_dropout_must_be_a_probability(value):
    with pytest.raises(StrictDataclassError, match="word_dropout"):
        tiny_model(word_dropout=value)


def test_dropout_zeroes_with_probability_p_and_scales_the_rest():
    torch.manual_seed(0)
    ones = torch.ones(1000, 1000, requires_grad=True)
    out = dropout(ones, 0.3, training=True)
    kept = out != 0
    # 10^6 draws: the kept fraction's standard deviation is 0.00046; 5 of them
    assert abs(kept.float().mean().item() - 0.7) < 0.0023
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.7))
    out.sum().backward()  # the gradient is the same mask and scale
    torch.testing.assert_close(ones.grad, out.detach())
    assert not torch.equal(dropout(ones, 0.3, training=True), out)  # a new mask each call


def test_dropout_off_and_extremes():
    hidden = torch.randn(4, 5)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"between 0 and 1, but got {bad}"):
            dropout(hidden, bad, training=True)
    assert dropout(hidden, 0.3, training=False) is hidden
    assert dropout(hidden, 0.0, training=True) is hidden
    assert torch.count_nonzero(dropout(hidden, 1.0, training=True)) == 0
    half = hidden.to(torch.bfloat16)  # not float32: PyTorch's own dropout
    assert dropout(half, 0.5, training=True).dtype == torch.bfloat16
