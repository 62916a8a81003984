"""The tiny configuration of STYLE.md (d_model 16, 2 layers, 4 heads, vocabulary 99) and a padded batch."""

from __future__ import annotations

import torch

from modeling_attn import (
    AttnRNNConfig,
    AttnRNNForConditionalGeneration,
    AttnTransformerConfig,
    AttnTransformerForConditionalGeneration,
)


def two_layers(d_model: int) -> dict:
    """2 + 2 layers of 4 heads of width `d_model`, feed-forward 2 x `d_model`, no dropout: the tests' Transformers."""
    return dict(d_model=d_model, encoder_layers=2, decoder_layers=2, num_heads=4, d_ff=2 * d_model, dropout=0.0)


TINY = dict(vocab_size=99, **two_layers(16))
# The sizes of an RNN-attention model, each a number of units.
RNN_SIZES = ("embedding_size", "encoder_hidden_size", "decoder_hidden_size", "attention_size", "readout_size")
# The tiny RNN-attention model: 16 units everywhere.
TINY_RNN = dict.fromkeys(RNN_SIZES, 16)


def tiny_config(**overrides) -> AttnTransformerConfig:
    return AttnTransformerConfig(**{**TINY, **overrides})


def tiny_rnn_config(**overrides) -> AttnRNNConfig:
    return AttnRNNConfig(**{"vocab_size": 99, **TINY_RNN, **overrides})


def tiny_model(attn_implementation: str = "eager", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = tiny_config(**overrides)
    config._attn_implementation = attn_implementation
    return AttnTransformerForConditionalGeneration(config).eval()


def spread_tiny_rnn(vocab_size: int = 99, seed: int = 0, **special) -> AttnRNNForConditionalGeneration:
    """A 16-unit RNN-attention model with weights spread over [-1, 1], so that different sentences translate
    differently (an untrained model at the default init translates most sentences alike)."""
    torch.manual_seed(seed)
    model = AttnRNNForConditionalGeneration(tiny_rnn_config(vocab_size=vocab_size, **special)).eval()
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
