"""The CPU threads an engine decodes with when nobody names a number (`--threads`, `threads=`).

Measured on 2-core machines (docs/speed.md, "Threads"): a decoding step is many small matrix products, too small
for threads to share one without waiting for each other longer than they compute, and a thread waiting while another
program holds its core stalls the rest (two CTranslate2 threads on two cores: 15-25x slower than one). So:

- CTranslate2 runs one thread per batch (`intra_threads=1`) and one worker per core (`inter_threads`), and a call's
  sentences are split between the workers (`max_batch_size`): the cores work on separate sentences and never wait
  for each other, as Marian's CPU workers and CTranslate2's own advice for throughput do.
- torch (the torch engine; the torch model scoring n-best lists) takes one intra-op thread per `ROWS_PER_THREAD`
  decoder rows (sentences x beams) of a call, at least one, at most `torch.get_num_threads()` (the cores this
  process may use, or what `OMP_NUM_THREADS` or `torch.set_num_threads` made it).
- onnxruntime: one intra-op thread (by the same reasoning; not measured).

A number given (`--threads N`, `threads=N`) is used as it is, as before: N intra-op threads for every call.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Decoder rows (sentences x beams) per torch intra-op thread: at 16 rows a second thread cost 24x on the dates model
# (another job on the other core); at 128 rows it gained 20% in one run and lost 8% in another (docs/speed.md).
ROWS_PER_THREAD = 64


def available() -> int:
    """The threads torch would use: the cores this process may run on unless someone set fewer."""
    return torch.get_num_threads()


def torch_threads_for(rows: int, given: int | None = None) -> int:
    """torch's intra-op threads for a call decoding `rows` rows (`given`: the user's number, used as it is)."""
    if given:
        return given
    return max(1, min(available(), rows // ROWS_PER_THREAD))


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch computes with `count` intra-op threads inside the block; the setting before is restored after it."""
    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def ctranslate2_threads(given: int | None = None) -> tuple[int, int]:
    """CTranslate2's (intra_threads, inter_threads): the user's number as intra-op threads on one worker, else one
    thread on each of `available()` workers."""
    return (given, 1) if given else (1, available())


def split_size(count: int, workers: int) -> int:
    """CTranslate2's `max_batch_size` that gives each of `workers` workers its share of `count` sentences."""
    return max(1, math.ceil(count / workers))


def onnxruntime_threads(given: int | None = None) -> int:
    """onnxruntime's intra-op threads: the user's number, else one."""
    return given or 1


__all__ = [
    "ROWS_PER_THREAD",
    "available",
    "ctranslate2_threads",
    "onnxruntime_threads",
    "split_size",
    "torch_threads",
    "torch_threads_for",
]
