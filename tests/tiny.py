"""The tiny configuration of STYLE.md (d_model 16, 2 layers, 4 heads, vocabulary 99) and a padded batch."""

from __future__ import annotations

import torch

from modeling_attn import AttnTransformerConfig, AttnTransformerForConditionalGeneration

TINY = dict(vocab_size=99, d_model=16, encoder_layers=2, decoder_layers=2, num_heads=4, d_ff=32, dropout=0.0)


def tiny_config(**overrides) -> AttnTransformerConfig:
    return AttnTransformerConfig(**{**TINY, **overrides})


def tiny_model(attn_implementation: str = "eager", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = tiny_config(**overrides)
    config._attn_implementation = attn_implementation
    return AttnTransformerForConditionalGeneration(config).eval()


def padded_batch(seed: int = 0, batch: int = 3, source_length: int = 7, target_length: int = 5, vocab: int = 99):
    """Source ids with right padding in all but the first row, their mask, and target ids (no specials)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab, (batch, source_length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, batch):
        attention_mask[row, source_length - 2 * row :] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    decoder_input_ids = torch.randint(3, vocab, (batch, target_length), generator=generator)
    return input_ids, attention_mask, decoder_input_ids
