"""The tiny configuration of STYLE.md (d_model 16, 2 layers, 4 heads, vocabulary 99) and a padded batch."""

from __future__ import annotations

import torch

from modeling_attn import (
    AttnRNNConfig,
    AttnRNNForConditionalGeneration,
    AttnTransformerConfig,
    AttnTransformerForConditionalGeneration,
)

TINY = dict(vocab_size=99, d_model=16, encoder_layers=2, decoder_layers=2, num_heads=4, d_ff=32, dropout=0.0)


def tiny_config(**overrides) -> AttnTransformerConfig:
    return AttnTransformerConfig(**{**TINY, **overrides})


def tiny_model(attn_implementation: str = "eager", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = tiny_config(**overrides)
    config._attn_implementation = attn_implementation
    return AttnTransformerForConditionalGeneration(config).eval()


def spread_tiny_rnn(vocab_size: int = 99, seed: int = 0, **special) -> AttnRNNForConditionalGeneration:
    """A 16-unit RNN-attention model with weights spread over [-1, 1], so that different sentences translate
    differently (an untrained model at the default init translates most sentences alike)."""
    torch.manual_seed(seed)
    config = AttnRNNConfig(
        vocab_size=vocab_size,
        embedding_size=16,
        encoder_hidden_size=16,
        decoder_hidden_size=16,
        attention_size=16,
        readout_size=16,
        **special,
    )
    model = AttnRNNForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.uniform_(-1.0, 1.0)
    return model


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
