"""The CPU training step of `attn_transformer`, with and without its two CPU fast paths, interleaved.

    python bench/cpu_train_step.py --preset multi30k-transformer --batch_size 256 --threads 2

The fast paths (modeling_attn/loss.py, modeling_attn/dropout.py): `linear_token_loss`, the output projection and the
label-smoothed loss computed in chunks with their gradients, without a (tokens x vocabulary) tensor; and `dropout`,
masks from a uniform draw instead of Bernoulli sampling. Each variant switches them on or off where they are looked up
(`dropout` in `modeling_attn.modeling_transformer`, the loss's `fuses_output_loss` in `modeling_attn.loss`) and runs
the same training step (forward with `skip_logits=True` as `attn train` does, backward, Adam; label smoothing 0.1,
dropout from the preset) on the same batch of Multi30k-like lengths (`common.make_batches`, seed 0); timing is
`common.interleaved` (one warm-up round, then `--reps` rounds in rotating order, the CPU clock of this process), the
median is reported. Each variant trains its own copy of the same weights.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)

from modeling_attn import loss, modeling_transformer  # noqa: E402


def torch_dropout(hidden_states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return torch.nn.functional.dropout(hidden_states, p=p, training=training)


VARIANTS: dict[str, dict[str, Callable]] = {
    "neither (PyTorch dropout, unfused loss)": {"dropout": torch_dropout, "fuses_output_loss": lambda *_: False},
    "fused loss only": {"dropout": torch_dropout},
    "uniform-draw dropout only": {"fuses_output_loss": lambda *_: False},
    "both (the default)": {},
}


# where each switch is looked up when the model runs
HOMES = {"dropout": modeling_transformer, "fuses_output_loss": loss}


@contextlib.contextmanager
def patched(replacements: dict[str, Callable]) -> Iterator[None]:
    saved = {name: getattr(HOMES[name], name) for name in replacements}
    for name, value in replacements.items():
        setattr(HOMES[name], name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(HOMES[name], name, value)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure, print the table, and return the median seconds per step of each variant."""
    args = common.step_parser(__doc__.split("\n")[0], "multi30k-transformer", 256).parse_args(argv)
    torch.set_num_threads(args.threads)
    reference = common.reference_model(args.preset, 256, seed=0)
    batches = common.make_batches(1, args.batch_size, reference.config.vocab_size, seed=0, max_length=255)
    peer = dataclasses.replace(common.PEERS["attn_transformer"], loss=partial(common.ours_loss, smoothing=0.1))
    tasks = {}
    for name, replacements in VARIANTS.items():
        step = common.training_task(copy.deepcopy(reference), peer, batches, "cpu")

        def task(step=step, replacements=replacements) -> None:
            with patched(replacements):
                step()

        tasks[name] = task
    return common.step_report(args, batches[0], common.interleaved(tasks, args.reps, common.CLOCKS["cpu"]))


if __name__ == "__main__":
    main()
