"""The Transformer learns: reversing random token sequences, trained from scratch on the CPU.

Greedy decoding must be >= 99% exact on held-out sequences (issue 2, requirement 5: within a minute
on 2 CPU cores).
"""

from __future__ import annotations

import torch
from tasks import exact_match, fit_reverse_task, one_thread, reverse_task
from tiny import two_layers

from modeling_attn import AttnTransformerConfig, AttnTransformerForConditionalGeneration


def train_reverser(steps: int = 500, batch_size: int = 64) -> AttnTransformerForConditionalGeneration:
    torch.manual_seed(0)
    config = AttnTransformerConfig(vocab_size=16, **two_layers(64), max_position_embeddings=16)
    model = AttnTransformerForConditionalGeneration(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = 50  # then linear decay to 0
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, (steps - step) / (steps - warmup))
    )
    return fit_reverse_task(model, optimizer, steps, schedule, batch_size=batch_size)


def test_transformer_learns_to_reverse():
    with one_thread():
        model = train_reverser()
        input_ids, attention_mask, labels = reverse_task(500, torch.Generator().manual_seed(123))
        with torch.no_grad():
            generated = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=10)
    assert exact_match(generated, labels) >= 0.99
