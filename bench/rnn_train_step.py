"""The CPU training step of `attn_rnn`, with full logits and with `skip_logits=True`, interleaved.

    python bench/rnn_train_step.py --preset multi30k-rnn --batch_size 128 --threads 1

`skip_logits=True` (what `attn train` passes) computes the output projection and the label-smoothed loss on the
labelled positions only, through `modeling_attn.inputs.labelled_token_loss` (the fused CPU loss,
`linear_token_loss`, where `fuses_output_loss` allows); the other variant makes the (batch, length, vocabulary)
logits and takes `token_loss` of them. Both run the same training step (forward, backward, Adam, label smoothing 0.1,
dropout from the preset) on the same batch of Multi30k-like lengths (`speed.make_batches`, seed 0), each on its own
copy of the same weights; timing is `speed.interleaved` (one warm-up round, then `--reps` rounds in rotating order,
the CPU clock of this process), the median is reported.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (this folder's module)

from modeling_attn import AttnRNNForConditionalGeneration  # noqa: E402
from modeling_attn.presets import load_preset  # noqa: E402

VARIANTS = {"full logits": False, "skip_logits (what attn train uses)": True}


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure, print the table, and return the median seconds per step of each variant."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="multi30k-rnn", help="an attn_rnn preset")
    parser.add_argument("--batch_size", type=int, default=128, help="sentences in the batch")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=5, help="measured rounds after one warm-up round")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    speed.clock = speed.CLOCKS["cpu"]
    config = load_preset(args.preset, label_smoothing=0.1)
    if config.model_type != "attn_rnn":
        raise ValueError(f"--preset {args.preset} has model_type {config.model_type}; this script times attn_rnn")
    torch.manual_seed(0)
    reference = AttnRNNForConditionalGeneration(config).train()
    batch = speed.make_batches(1, args.batch_size, config.vocab_size, seed=0, max_length=255)[0]
    tasks = {}
    for name, skip_logits in VARIANTS.items():
        model = copy.deepcopy(reference)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

        def step(model=model, optimizer=optimizer, skip_logits=skip_logits) -> None:
            inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels)
            model(**inputs, skip_logits=skip_logits).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        tasks[name] = step
    seconds = speed.interleaved(tasks, args.reps)
    print(
        f"preset {args.preset}, {args.batch_size} sentences ({batch.input_ids.numel()} source / "
        f"{batch.labels.numel()} target positions, {batch.target_tokens} target tokens), {args.threads} thread(s), "
        f"{platform.machine()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    baseline = medians[next(iter(VARIANTS))]
    print("| variant | s/step (median) | speed-up | rounds |\n| --- | ---: | ---: | --- |")
    for name, values in seconds.items():
        rounds = " ".join(f"{value:.3f}" for value in values)
        print(f"| {name} | {medians[name]:.3f} | {baseline / medians[name]:.2f}x | {rounds} |")
    return medians


if __name__ == "__main__":
    main()
