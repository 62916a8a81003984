"""`python -m modeling_attn.training` and `torchrun --nproc_per_node N -m modeling_attn.training`: `attn train`.

`python -m` runs one process, `torchrun` N. Launchers, as tested on a machine without GPU
(tests/test_training_distributed.py; docs/multi-process.md):
- `torchrun --nproc_per_node N -m modeling_attn.training ...`: on a machine with no accelerator, this module sets
  ACCELERATE_USE_CPU before transformers reads it, so that the processes form one gloo group (accelerate's
  MULTI_CPU) instead of N separate single-process runs (what transformers 5.23 does there, with only a warning).
- `accelerate launch --config_file configuration/accelerate-fsdp.yaml --num_processes N --mixed_precision no -m
  modeling_attn.training ...`: Accelerate 1.15 turns FSDP on only for GPU-like process groups, so without an
  accelerator this module applies accelerate's own FSDP branch to the gloo group (`_fsdp_on_cpu`); on GPUs nothing
  is changed.
- `accelerate launch --cpu --num_processes N` (N > 1) is refused: accelerate's simple launcher starts one process
  and leaves multi-CPU runs to mpirun, so the run would silently train in one process.
"""

import os
import sys

import torch


def _single_process_cpu_launch() -> bool:
    """Whether `accelerate launch --cpu --num_processes N>1` started this process alone (no torchrun, no MPI)."""
    return (
        os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
        and "MASTER_ADDR" in os.environ  # accelerate sets it only for more than one process
        and not any(name in os.environ for name in ("RANK", "LOCAL_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))
    )


def _fsdp_on_cpu() -> None:
    """Make accelerate's `AcceleratorState` treat a gloo (MULTI_CPU) group as it treats a GPU group under
    ACCELERATE_USE_FSDP: distributed type FSDP with the plugin built from the launcher's FSDP_* variables.

    Accelerate 1.15 (state.py, `AcceleratorState.__init__`) lists the device types for which FSDP is enabled, and
    MULTI_CPU is not among them; everything downstream (`Accelerator.prepare`, `fully_shard`, the full state dict at
    save time) runs on CPU with gloo. The lines below are the ones accelerate runs for a GPU group.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original_init = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6; CUDA only before
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def _refuse_single_process_cpu() -> int:
    from modeling_attn.api.errors import FlagError

    raise FlagError(
        "`accelerate launch --cpu --num_processes N` starts one process here (accelerate leaves multi-CPU runs to "
        "mpirun); start N CPU processes with `torchrun --nproc_per_node N -m modeling_attn.training ...`"
    )


def _main() -> int:
    if _single_process_cpu_launch():
        from modeling_attn.cli.report import run_command

        return run_command("python -m modeling_attn.training", _refuse_single_process_cpu)
    launched_by_torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_RANK" in os.environ
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true")  # picks its own backend
    if launched_by_torchrun and not deepspeed and not _has_accelerator():
        os.environ["ACCELERATE_USE_CPU"] = "true"
        if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
            _fsdp_on_cpu()
    from modeling_attn.cli.train import main

    return main()


sys.exit(_main())
