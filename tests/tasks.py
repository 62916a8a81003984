"""Generated tasks the models must learn, shared by the learning tests of both model types."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

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
