"""The flags of the small real `attn train` runs the tests start, each set written once, and the torchrun launcher.

A test that needs a variant extends a list here (later flags win) rather than copying it.
"""

from __future__ import annotations

import shlex
import socket
import sys

# No report backend, progress bar or pinned memory: what every test run leaves out.
SILENT = shlex.split("--report_to none --disable_tqdm True --dataloader_pin_memory False")
# The tiny preset with a vocabulary of 200 and token batches of 200, silent.
TINY = [*shlex.split("--preset tiny --vocab_size 200 --max_tokens_per_batch 200"), *SILENT]
# No evaluation while training, no predictions on the test set, no averaging of checkpoints.
QUIET = shlex.split("--eval_strategy no --do_predict False --average_last_n 1")
# QUIET, and no evaluation at the end either.
NO_EVAL = [*QUIET, "--do_eval", "False"]
# Runs compared loss by loss: dropout off, one seed, a loss logged each step.
COMPARABLE = shlex.split("--logging_steps 1 --config_overrides dropout=0 --seed 3")


def tiny_on(pairs: int) -> list[str]:
    """TINY on the first `pairs` pairs of the embedded task."""
    return [*TINY, "--max_train_samples", str(pairs)]


# TINY on 120 pairs, 16 to evaluate and 16 to predict: seconds per run.
TINY_TASK = [*tiny_on(120), *shlex.split("--max_eval_samples 16 --max_predict_samples 16")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# `attn train` in a process of its own, before its flags.
ATTN_TRAIN = [sys.executable, "-m", "modeling_attn.training"]


def torchrun() -> list[str]:
    """`torchrun --nproc_per_node 2 -m modeling_attn.training` (gloo on CPU) on a free port, before its flags."""
    launch = shlex.split("-m torch.distributed.run --nproc_per_node 2 --master_port")
    return [sys.executable, *launch, str(free_port()), *ATTN_TRAIN[1:]]
