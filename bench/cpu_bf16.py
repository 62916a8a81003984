"""bfloat16 on the CPU: ours and MarianMTModel (same weights), float32 against bfloat16, interleaved.

    python bench/cpu_bf16.py --preset base --threads 1

On CPUs with AMX-BF16 / AVX512-BF16 (Sapphire Rapids and later Xeons) oneDNN runs bfloat16 matmuls much faster than
float32. Measured with bench/common.py's peers, tasks and timing (`common.interleaved`: one warm-up round, then
`--reps` rounds in rotating order, CPU clock of this process) on one batch of 32 sentences of Multi30k lengths
(`common.make_batches`, seed 0):

- training step (forward, backward, Adam): float32, and `torch.autocast("cpu", dtype=torch.bfloat16)` (what
  Trainer's `--use_cpu --bf16` does through accelerate; weights and optimizer stay float32);
- `generate()` beam 4, forced to the batch's longest target: float32 weights, and weights cast to bfloat16
  (`model.to(torch.bfloat16)`, what `from_pretrained(..., dtype=torch.bfloat16)` gives).

Both models get the same treatment, so the ratio between them is a same-precision comparison; the speed-up of
bfloat16 over float32 is the machine's.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)

PEERS = ["attn_transformer", "MarianMTModel (sdpa)"]


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure, print the table, and return the median seconds of each measurement by name."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3, help="measured rounds after one warm-up round")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    reference = common.reference_model(args.preset, 256, seed=0)
    batches = common.make_batches(1, 32, reference.config.vocab_size, seed=0)
    tasks = {}
    for peer in (common.PEERS[name] for name in PEERS):
        for label, bf16 in (("train float32", False), ("train bf16 autocast", True)):
            tasks[f"{peer.name} {label}"] = common.training_task(peer.build(reference), peer, batches, "cpu", bf16)
        for label, dtype in (("beam4 float32", torch.float32), ("beam4 bfloat16 weights", torch.bfloat16)):
            model = peer.build(reference).to(dtype)
            tasks[f"{peer.name} {label}"] = common.generation_task(model, peer, batches, 4, "cpu")
    seconds = common.interleaved(tasks, args.reps, common.CLOCKS["cpu"])
    print(
        f"preset {args.preset}, batch 32 ({batches[0].target_tokens} target tokens), {args.threads} thread(s), "
        f"{platform.machine()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name, values in seconds.items():
        print(f"{name:50s} {medians[name]:7.3f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    return medians


if __name__ == "__main__":
    main()
