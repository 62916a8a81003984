"""modeling_attn.generation: the per-sentence output limit (`SourceLengthLimit`) follows the sentences it keeps."""

from __future__ import annotations

import torch

from modeling_attn.generation import SourceLengthLimit


def test_source_length_limit_selects_the_open_sentences():
    limit = SourceLengthLimit(torch.tensor([5, 7, 9, 11]), eos_token_id=2)
    selected = limit.select(torch.tensor([1, 3]))
    assert selected.limits.tolist() == [7, 11] and selected.eos_token_ids.tolist() == [2]
    # rows of a selected processor: sentence 1's beams hit their limit of 7 after 6 generated tokens, sentence 3's not
    scores = torch.zeros(4, 5)
    forced = selected(torch.ones(4, 7, dtype=torch.long), scores)
    assert torch.equal(forced[:2].argmax(-1), torch.tensor([2, 2])) and torch.equal(forced[2:], scores[2:])


def test_a_limit_of_none_is_no_limit_given_on_generate_and_the_fast_loop():
    """`max_new_tokens=None` / `max_length=None` (what a caller passing its optional settings through gives) leave
    the per-sentence limit on, as saying nothing does: the same ids from generate() and the fast loop; a number
    replaces the limit."""
    from tiny import padded_batch, tiny_model

    from modeling_attn.fast_generation import fast_generate

    model = tiny_model("sdpa", seed=0, bos_token_id=1, eos_token_id=2, pad_token_id=0, decoder_start_token_id=1)
    with torch.no_grad():
        model.lm_head.weight[2] -= 5.0  # the end token unlikely: translations run to their limit
    model.generation_config.max_length_over_source = 2
    input_ids, attention_mask, _ = padded_batch(seed=3, vocab=model.config.vocab_size, batch=3)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    plain = model.generate(**inputs)
    assert plain.shape[1] == int(attention_mask.sum(-1).max()) + 2 + 1  # source + 2, and the start token
    for none in ({"max_new_tokens": None}, {"max_length": None}, {"max_new_tokens": None, "max_length": None}):
        assert torch.equal(model.generate(**inputs, **none), plain), none
        assert torch.equal(fast_generate(model, input_ids, attention_mask, **none), plain), none
    assert model.generate(**inputs, max_new_tokens=1).shape[1] == 2
