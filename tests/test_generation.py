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
