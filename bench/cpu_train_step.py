"""The CPU training step of `attn_transformer`, with and without its two CPU fast paths, interleaved.

    python bench/cpu_train_step.py --preset multi30k-transformer --batch_size 256 --threads 2

The fast paths (modeling_attn/loss.py, modeling_attn/dropout.py): `linear_token_loss`, the output projection and the label-smoothed loss
computed in chunks with their gradients, without a (tokens x vocabulary) tensor; and `dropout`, masks from a uniform
draw instead of Bernoulli sampling. Each variant switches them on or off where they are looked up (`dropout` in
`modeling_attn.modeling_transformer`, the loss's `fuses_output_loss` in `modeling_attn.loss`) and runs the same
training step (forward with `skip_logits=True` as `attn train` does, backward, Adam; label smoothing 0.1, dropout from the preset) on the same batch of Multi30k-like lengths
(`speed.make_batches`, seed 0); timing is `speed.interleaved` (one warm-up round, then `--reps` rounds in rotating
order, the CPU clock of this process), the median is reported. Each variant trains its own copy of the same weights.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import platform
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (this folder's module)

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


def step_parser(description: str, preset: str, batch_size: int) -> argparse.ArgumentParser:
    """The flags of this folder's training-step scripts (this one and rnn_train_step.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--preset", default=preset)
    parser.add_argument("--batch_size", type=int, default=batch_size, help="sentences in the batch")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=5, help="measured rounds after one warm-up round")
    return parser


def report(args: argparse.Namespace, batch: speed.Batch, seconds: dict[str, list[float]]) -> dict[str, float]:
    """Print the set-up line and the table of `seconds` (the first variant is the baseline); return the medians."""
    print(
        f"preset {args.preset}, {args.batch_size} sentences ({batch.input_ids.numel()} source / "
        f"{batch.labels.numel()} target positions, {batch.target_tokens} target tokens), {args.threads} thread(s), "
        f"{platform.machine()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    baseline = next(iter(medians.values()))
    print("| variant | s/step (median) | speed-up | rounds |\n| --- | ---: | ---: | --- |")
    for name, values in seconds.items():
        rounds = " ".join(f"{value:.3f}" for value in values)
        print(f"| {name} | {medians[name]:.3f} | {baseline / medians[name]:.2f}x | {rounds} |")
    return medians


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure, print the table, and return the median seconds per step of each variant."""
    args = step_parser(__doc__.split("\n")[0], "multi30k-transformer", 256).parse_args(argv)
    torch.set_num_threads(args.threads)
    speed.clock = speed.CLOCKS["cpu"]
    reference = speed.reference_model(args.preset, 256, seed=0)
    reference.config.label_smoothing = 0.1
    batches = speed.make_batches(1, args.batch_size, reference.config.vocab_size, seed=0, max_length=255)
    peer = speed.PEERS["attn_transformer"]
    tasks = {}
    for name, replacements in VARIANTS.items():
        step = speed.training_task(copy.deepcopy(reference), peer, batches, "cpu")

        def task(step=step, replacements=replacements) -> None:
            with patched(replacements):
                step()

        tasks[name] = task
    return report(args, batches[0], speed.interleaved(tasks, args.reps))


if __name__ == "__main__":
    main()
