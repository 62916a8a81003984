"""Generated tasks the models must learn, shared by the learning tests of both model types."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from tiny import RNN_SIZES, two_layers

PAD, EOS = 0, 2


def reverse_task(batch_size: int, generator: torch.Generator, vocab_size: int = 16):
    """Random sources of 4-8 tokens (ids 3..vocab_size-1, right-padded); the target is the source reversed + EOS.

    A reversal needs each output position to attend to a different source position, so it exercises
    positions, masks and attention together, and its expected alignment (the anti-diagonal) is known.
    """
    lengths = torch.randint(4, 9, (batch_size,), generator=generator)
    input_ids = torch.full((batch_size, int(lengths.max())), PAD)
    labels = torch.full((batch_size, int(lengths.max()) + 1), -100)
    for row, length in enumerate(lengths.tolist()):
        tokens = torch.randint(3, vocab_size, (length,), generator=generator)
        input_ids[row, :length] = tokens
        labels[row, :length], labels[row, length] = tokens.flip(0), EOS
    return input_ids, (input_ids != PAD).long(), labels


def exact_match(generated: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of rows whose generated tokens (after the start token) begin with the full label sequence."""
    correct = 0
    for output, label in zip(generated, labels, strict=True):
        target = label[label != -100].tolist()
        correct += output[1 : 1 + len(target)].tolist() == target
    return correct / len(labels)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Tiny matrices train several times faster on one thread than on two busy cores (measured: 0.035 s vs
    0.57 s per step of the Transformer reverser while another process used the second core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fit_reverse_task(
    model, optimizer, steps: int, schedule=None, clip_norm: float | None = None, batch_size: int = 64
):
    """Train `model` on `reverse_task` batches (generator seed 1) for `steps` optimizer steps.

    Returns it in eval mode.
    """
    model.train()
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        input_ids, attention_mask, labels = reverse_task(batch_size, generator)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        if schedule is not None:
            schedule.step()
    return model.eval()


def train_rnn_reverser(steps: int = 400, **variant):
    """An attn_rnn model (default: Bahdanau, GRU, additive score) trained on `reverse_task`, in eval mode.

    The fast recipe shared by the RNN learning tests and the heatmap tests: ~15 s for 400 steps on one thread.
    """
    from modeling_attn import AttnRNNConfig, AttnRNNForConditionalGeneration

    torch.manual_seed(0)
    config = AttnRNNConfig(**{"vocab_size": 16, **dict.fromkeys(RNN_SIZES, 32), "decoder_hidden_size": 64, **variant})
    model = AttnRNNForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    # A constant rate of 1e-2 ends wherever its last steps bounce (97.8% at 400 steps, 95.8% at 600 on one CPU,
    # 100% on another); annealing it to zero lets the last steps settle.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    with one_thread():
        return fit_reverse_task(model, optimizer, steps, schedule, clip_norm=1.0)


def train_transformer_reverser(steps: int = 150, **variant):
    """An attn_transformer (the paper's settings, d_model 32, 2 + 2 layers) trained on `reverse_task`, in eval mode:
    input-dependent translations that end at different lengths, with close decisions where a wrong number would
    show. About 5 s on one thread."""
    from modeling_attn import AttnTransformerConfig, AttnTransformerForConditionalGeneration

    torch.manual_seed(0)
    config = AttnTransformerConfig(vocab_size=16, **two_layers(32), max_position_embeddings=32, **variant)
    model = AttnTransformerForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    with one_thread():
        return fit_reverse_task(model, optimizer, steps)
