"""`python -m training`, `accelerate launch [--num_processes N] [--cpu] -m training`: the same as `attn train`.

`accelerate launch --cpu --num_processes N` (N > 1) starts only one process unless MPI is set up (accelerate's
"simple launcher" runs the script once and leaves multi-CPU runs to mpirun). In that case this module starts the
N processes itself with `torch.distributed.run` on the address and port accelerate chose; each of them runs the
recipe under accelerate's MULTI_CPU state (gloo). The process count is read from the launcher's command line
(Linux /proc); where that fails the run stays single-process with a warning.
"""

import logging
import os
import subprocess
import sys
from pathlib import Path

from .train import cli_main


def _launcher_num_processes() -> int | None:
    """--num_processes of the `accelerate launch` command that started this process, if it can be read."""
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return None
    for position, arg in enumerate(argv):
        for flag in ("--num_processes", "--num-processes"):
            if arg == flag and position + 1 < len(argv):
                return int(argv[position + 1])
            if arg.startswith(flag + "="):
                return int(arg.split("=", 1)[1])
    return None


def _relaunch_on_cpus() -> int | None:
    """Exit status of N gloo processes started here, or None when this process should train itself."""
    single_cpu_launch = (
        os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
        and "MASTER_ADDR" in os.environ  # accelerate sets it only for more than one process
        and "RANK" not in os.environ
        and "LOCAL_RANK" not in os.environ
        and "PMI_SIZE" not in os.environ
        and "OMPI_COMM_WORLD_SIZE" not in os.environ
    )
    if not single_cpu_launch:
        return None
    num_processes = _launcher_num_processes()
    if num_processes is None:
        logging.getLogger("training").warning("accelerate launch --cpu: process count unknown, training in 1 process")
        return None
    if num_processes <= 1:
        return None
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(num_processes),
               "--master_addr", os.environ["MASTER_ADDR"], "--master_port", os.environ.get("MASTER_PORT", "29500"),
               "-m", "training", *sys.argv[1:]]  # fmt: skip
    return subprocess.call(command)


status = _relaunch_on_cpus()
sys.exit(cli_main() if status is None else status)
