"""bfloat16 on the CPU: ours and MarianMTModel (same weights), float32 against bfloat16, interleaved.

    python bench/cpu_bf16.py --preset base --threads 1

On CPUs with AMX-BF16 / AVX512-BF16 (Sapphire Rapids and later Xeons) oneDNN runs bfloat16 matmuls much faster than
float32. Measured on one batch of 32 sentences of Multi30k lengths (`speed.make_batches`), CPU clock of this process,
median of `--reps` interleaved rounds after one warm-up round:

- training step (forward, backward, Adam): float32, and `torch.autocast("cpu", dtype=torch.bfloat16)` (what
  Trainer's `--use_cpu --bf16` does; weights and optimizer stay float32);
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
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (this folder's module)


def training_step(model: nn.Module, loss: Callable, batch: speed.Batch, bf16: bool) -> Callable[[], None]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5, betas=(0.9, 0.98), eps=1e-9)

    def step() -> None:
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            value = loss(model, batch)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def beam_search(model: nn.Module, batch: speed.Batch) -> Callable[[], None]:
    def run() -> None:
        model.eval()
        with torch.inference_mode():
            speed.hf_generate(model, batch, 4, max(batch.target_lengths))

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3, help="measured rounds after one warm-up round")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    reference = speed.reference_model(args.preset, 256, seed=0)
    batch = speed.make_batches(1, 32, reference.config.vocab_size, seed=0)[0]
    tasks = {}
    for name, build, loss in [
        ("attn_transformer", lambda: speed.ours(reference, "sdpa"), speed.ours_loss),
        ("MarianMTModel (sdpa)", lambda: speed.marian(reference, "sdpa"), speed.hf_loss),
    ]:
        tasks[f"{name} train float32"] = training_step(build(), loss, batch, bf16=False)
        tasks[f"{name} train bf16 autocast"] = training_step(build(), loss, batch, bf16=True)
        tasks[f"{name} beam4 float32"] = beam_search(build(), batch)
        tasks[f"{name} beam4 bfloat16 weights"] = beam_search(build().to(torch.bfloat16), batch)
    seconds: dict[str, list[float]] = {name: [] for name in tasks}
    for round_ in range(args.reps + 1):
        for name, task in tasks.items():
            start = time.process_time()
            task()
            if round_:  # round 0 warms up
                seconds[name].append(time.process_time() - start)
    print(
        f"preset {args.preset}, batch 32 ({batch.target_tokens} target tokens), {args.threads} thread(s), "
        f"{platform.machine()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    for name, values in seconds.items():
        print(f"{name:50s} {statistics.median(values):7.3f} s  ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
