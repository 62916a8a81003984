"""The GPU peaks that MFU divides by, and `attn train`'s closing MFU line (and its warning for a compiled CPU run).

`PEAK_BF16_FLOPS` is a small table of common GPUs' dense bf16 tensor-core peaks, not a database: a GPU it does not
name gets no MFU line (bench/gpu.py takes `--peak_tflops`). MFU = Trainer's `total_flos` (the project's formula on
real tokens, `modeling_attn.flops`) / the training time / the peak of every process's GPU.
"""

from __future__ import annotations

import torch

# Dense (no sparsity) bf16 tensor-core FLOP/s, by the first substring of torch.cuda.get_device_name() that matches,
# from NVIDIA's datasheets (H100, H200, A100, L40S, L40, L4, DGX B200) and its Ada whitepaper (RTX 4090). The
# H100 PCIe card has 114 SMs at lower clocks (756 TFLOP/s), the SXM one ("NVIDIA H100 80GB HBM3") 132 (989).
PEAK_BF16_FLOPS = {
    "B200": 2250e12,
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "4090": 165e12,
}


def peak_bf16_flops(device_name: str) -> float | None:
    """The dense bf16 peak of the GPU named `device_name` (`PEAK_BF16_FLOPS`), or None when the table lacks it."""
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in device_name), None)


def mfu_line(total_flos: float, seconds: float, processes: int) -> str | None:
    """`attn train`'s closing line on a GPU of the table: the model FLOPs utilisation of the run; None elsewhere."""
    if not torch.cuda.is_available() or seconds <= 0 or not total_flos:
        return None
    name = torch.cuda.get_device_name()
    if (peak := peak_bf16_flops(name)) is None:
        return None
    achieved = total_flos / seconds
    return (
        f"MFU {100 * achieved / (peak * processes):.1f}%: {achieved / 1e12:.1f} TFLOP/s of model FLOPs (the project's "
        f"formula, real tokens) against {processes} x {name}'s dense bf16 peak of {peak / 1e12:.0f} TFLOP/s"
    )


def cpu_compile_warning(settings: dict) -> str | None:
    """The warning `attn train` logs for `--torch_compile` on the CPU (`settings`: the run's `speed_settings`), where
    it was measured slower than eager (docs/speed.md); None for any other run."""
    if not (settings["torch_compile"] and settings["device"] == "cpu"):
        return None
    return (
        "--torch_compile on the CPU: measured slower than eager for attn_transformer and no faster for attn_rnn "
        "(docs/speed.md has the figures): compiled, the model computes the padded positions that eager skips"
    )


__all__ = ["PEAK_BF16_FLOPS", "cpu_compile_warning", "mfu_line", "peak_bf16_flops"]
