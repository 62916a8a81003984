"""Property-based tests of attention (issue 8, check 3), with hypothesis drawing shapes, masks and sentences.

Properties, from the masked softmax up to the full models:
1. attention weights form a distribution over the keys: each row sums to 1;
2. masked keys get weight exactly 0, and what they hold cannot change the output;
3. a fully masked row gives finite weights, never NaN, in float32, bfloat16 and float16;
4. right padding does not change the outputs of the real tokens (Transformer and RNN);
5. without positions the encoder is permutation-equivariant: permuting its input permutes its output;
6. batch composition does not change a translation: greedy generate() of a sentence alone equals its row in a padded
   batch of other sentences (Transformer and RNN).
Few examples each (hypothesis `max_examples` 10-20, no deadline) so the default suite stays fast.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import spread_tiny_rnn, tiny_model

from modeling_attn import AttnRNNForConditionalGeneration
from modeling_attn.attention import MultiHeadAttention, attend
from modeling_attn.masks import masked_softmax

FEW = settings(max_examples=20, deadline=None)
FEWER = settings(max_examples=10, deadline=None)  # for generate(), about 0.3 s a call here
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@st.composite
def scores_and_masks(draw, allow_empty_rows: bool = False):
    """Scores (B, H, T, S) of any scale and a boolean key mask (B, 1, T, S), True = may attend."""
    batch, heads, queries, keys = (draw(st.integers(1, n)) for n in (3, 3, 5, 9))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0, 1e4]))
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, heads, queries, keys, generator=generator) * scale
    mask = torch.rand(batch, 1, queries, keys, generator=generator) < draw(st.floats(0.2, 1.0))
    if not allow_empty_rows:
        mask[..., draw(st.integers(0, keys - 1))] = True  # one key every query may attend to
    return scores, mask


@FEW
@given(scores_and_masks(), st.sampled_from(DTYPES), st.booleans())
def test_rows_sum_to_one_and_masked_keys_get_zero(case, dtype, additive):
    """Properties 1 and 2 for the masked softmax, with a boolean or an additive (0 / dtype minimum) mask."""
    scores, mask = case
    scores = scores.to(dtype)
    given_mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min) if additive else mask
    weights = masked_softmax(scores, given_mask)
    assert weights.dtype == dtype
    assert torch.equal(weights.masked_select(~mask.expand_as(weights)), torch.zeros((~mask).expand_as(weights).sum()))
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # the float32 sum rounded to 8 or 11 mantissa bits
    torch.testing.assert_close(weights.float().sum(-1), torch.ones(weights.shape[:-1]), atol=tolerance, rtol=0)


@FEW
@given(scores_and_masks(allow_empty_rows=True), st.sampled_from(DTYPES))
def test_fully_masked_rows_give_no_nan(case, dtype):
    """Property 3: rows without any key to attend to stay finite (uniform weights) instead of 0/0."""
    scores, mask = case
    mask[..., 0, :] = False  # the first query of every sentence sees no key at all
    weights = masked_softmax(scores.to(dtype), mask)
    assert torch.isfinite(weights).all()
    values = torch.randn(*scores.shape[:-2], scores.shape[-1], 4).to(dtype)  # (B, H, S, D)
    output, _ = attend(scores.to(dtype), values, mask)
    assert torch.isfinite(output).all()


@pytest.fixture(scope="module")
def backends():
    return {backend: tiny_model(backend) for backend in ("eager", "sdpa")}


@FEW
@given(st.integers(1, 3), st.integers(2, 8), st.integers(0, 2**31 - 1), st.sampled_from(["eager", "sdpa"]))
def test_masked_keys_cannot_change_multi_head_attention(backends, batch, keys, seed, backend):
    """Property 2 end to end: the states at masked key positions of MultiHeadAttention can be anything."""
    model = backends[backend]
    attention = model.model.encoder.layers[0].self_attn
    assert isinstance(attention, MultiHeadAttention)
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(batch, keys, 16, generator=generator)
    keep = torch.rand(batch, 1, 1, keys, generator=generator) < 0.6
    keep[..., 0] = True
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    noisy = torch.where(keep[:, 0, 0, :, None], states, torch.randn(states.shape, generator=generator) * 100)
    with torch.no_grad():
        clean_output = attention(states, additive)[0]
        noisy_output = attention(noisy, additive)[0]
    real = keep[:, 0, 0, :]  # compare the outputs at the real positions (their queries are the same states)
    torch.testing.assert_close(noisy_output[real], clean_output[real], rtol=1e-5, atol=1e-5)


def tiny_rnn(seed: int = 0) -> AttnRNNForConditionalGeneration:
    return spread_tiny_rnn(seed=seed, **SPECIAL)


MODELS = {"transformer": lambda: tiny_model("sdpa", **SPECIAL), "rnn": tiny_rnn}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


@FEW
@given(st.integers(1, 12), st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_right_padding_does_not_change_real_tokens(model, source_length, target_length, padding, seed):
    """Property 4: extra source positions, masked, holding random token ids, leave every logit unchanged."""
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(3, 99, (1, source_length), generator=generator)
    target = torch.randint(3, 99, (1, target_length), generator=generator)
    padded = torch.cat([source, torch.randint(0, 99, (1, padding), generator=generator)], dim=1)
    mask = torch.cat([torch.ones(1, source_length), torch.zeros(1, padding)], dim=1).long()
    with torch.no_grad():
        alone = model(input_ids=source, decoder_input_ids=target).logits
        with_padding = model(input_ids=padded, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(with_padding, alone, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def encoder_without_positions():
    model = tiny_model("eager")
    model.model.encoder.embed_positions.table.zero_()
    return model.model.encoder


@FEW
@given(st.integers(1, 3), st.integers(2, 10), st.integers(0, 2**31 - 1))
def test_encoder_without_positions_is_permutation_equivariant(encoder_without_positions, batch, length, seed):
    """Property 5: self-attention and the position-wise layers treat the source as a set; only Sec. 3.5's
    positional encodings give it an order."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 99, (batch, length), generator=generator)
    permutation = torch.randperm(length, generator=generator)
    with torch.no_grad():
        output = encoder_without_positions(input_ids=input_ids).last_hidden_state
        permuted = encoder_without_positions(input_ids=input_ids[:, permutation]).last_hidden_state
    torch.testing.assert_close(permuted, output[:, permutation], rtol=1e-5, atol=1e-5)


@FEWER
@given(st.lists(st.integers(1, 10), min_size=1, max_size=4), st.integers(0, 3), st.integers(0, 2**31 - 1))
def test_batch_composition_does_not_change_a_translation(model, other_lengths, position, seed):
    """Property 6: greedy translation of a sentence alone == its row in a right-padded batch of other sentences."""
    generator = torch.Generator().manual_seed(seed)
    sentence = torch.randint(3, 99, (int(torch.randint(1, 10, (1,), generator=generator)),), generator=generator)
    others = [torch.randint(3, 99, (length,), generator=generator) for length in other_lengths]
    position = min(position, len(others))
    batch = [*others[:position], sentence, *others[position:]]
    longest = max(len(row) for row in batch)
    input_ids = torch.zeros(len(batch), longest, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(batch):
        input_ids[row, : len(ids)], attention_mask[row, : len(ids)] = ids, 1
    settings_ = dict(max_new_tokens=6, num_beams=1, do_sample=False)
    with torch.no_grad():
        alone = model.generate(input_ids=sentence[None], **settings_)[0]
        batched = model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings_)[position]
    assert torch.equal(batched[: len(alone)], alone)
    assert (batched[len(alone) :] == 0).all()  # the rest of its row is padding after its end-of-sentence
