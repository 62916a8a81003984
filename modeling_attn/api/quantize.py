"""Dynamic int8 quantization for CPU inference: `quantize_int8(model)` and `quantize_int8_rowwise(model)`.

They are the functions behind `--quantize int8` / `--quantize int8_rowwise` of `attn translate`, `attn evaluate` and
`attn serve`. Every `nn.Linear` of the model becomes a dynamically quantized linear layer: its weight is stored as
int8, and each input is quantized to 8 bits with a scale computed from that input at run time (Jacob et al. 2018,
"Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference"; PyTorch's "dynamic
quantization"). Embeddings, LayerNorms and the RNN cells stay float32; nothing is trained or calibrated.
`int8` has one scale per tensor (`torch.ao.quantization.quantize_dynamic`, whose deprecation warnings this module
silences); `int8_rowwise` one per row (`torch._int_mm`), so that a translation does not change with its batch; where
this CPU's `torch._int_mm` gives inexact sums (`int_mm_is_exact`), a float32 matmul of the same int8 values.
`engine` picks torch's quantized engine (`int8_engine`: onednn on a CPU with AMX, else torch's own).
docs/serve.md, "`--quantize int8`", gives the measurements behind each choice.

The quantized kernels are CPU kernels: a model on another device is refused (`QuantizeError`), and `quantize_device`
makes the commands load the model on the CPU when `--quantize` is given without `--device`.
"""

from __future__ import annotations

import copy
import functools
import warnings

import torch
from torch import nn
from transformers import PreTrainedModel

from .choices import INT8_ENGINES, QUANTIZE_CHOICES
from .translation import TranslateError


class QuantizeError(TranslateError):
    """A model or device that cannot be quantized; the message names the flag and what to change."""


def quantize_device(device: str | None, quantize: str | None) -> str | None:
    """The device to load a model on: `device` as given, or "cpu" when `quantize` is set and no device is; a
    QuantizeError for a quantization on a device other than the CPU (checked before the slow load)."""
    if quantize is None:
        return device
    if quantize not in QUANTIZE_CHOICES:
        raise QuantizeError(f"--quantize {quantize}: not a quantization; one of {', '.join(QUANTIZE_CHOICES)}")
    if device is None:
        return "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:  # not a device name: `translation.resolve_device` says so when loading
        return device
    if kind != "cpu":
        raise QuantizeError(
            f"--quantize {quantize} runs on the CPU only (int8 kernels), not on --device {device}; "
            "drop --quantize, or use --device cpu"
        )
    return device


def _quantize_dynamic():
    """torch's `quantize_dynamic`, imported without its deprecation warning (see the module docstring)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            from torch.ao.quantization import quantize_dynamic
        except ImportError as error:
            raise QuantizeError(
                f"--quantize int8: torch {torch.__version__} has no torch.ao.quantization.quantize_dynamic "
                "(removed); use torch<=2.13 or translate without --quantize"
            ) from error
    return quantize_dynamic


def _check_on_cpu(model: PreTrainedModel, method: str) -> None:
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise QuantizeError(
            f"--quantize {method} runs on the CPU only (int8 kernels); the model is on {device}: "
            "load it with --device cpu, or drop --quantize"
        )


def int8_engine(engine: str | None = None) -> str:
    """The quantized engine `quantize_int8` packs the weights for: `engine` when it names one (QuantizeError if this
    torch build lacks it); for None or "auto", onednn on a CPU with AMX int8 where this torch has it, torch's current
    engine otherwise (see the module docstring)."""
    engines = torch.backends.quantized.supported_engines
    if not {"x86", "fbgemm", "qnnpack"} & set(engines):
        raise QuantizeError(f"--quantize int8: this torch build has no int8 CPU kernels (engines: {engines})")
    if engine not in (None, "auto"):
        if engine not in engines:
            raise QuantizeError(f"int8 engine {engine!r}: this torch build has {', '.join(engines)}")
        return engine
    if "onednn" in engines and torch.cpu.get_capabilities().get("amx_int8", False):
        return "onednn"
    return torch.backends.quantized.engine


def quantize_int8(model: PreTrainedModel, engine: str | None = None) -> PreTrainedModel:
    """A copy of `model` (left unchanged) whose `nn.Linear` layers are dynamically quantized to int8, in eval
    mode, with the kernels of `int8_engine(engine)` (None or "auto": chosen for this CPU; else one of
    `torch.backends.quantized.supported_engines`); QuantizeError if the model is not on the CPU, this torch build
    has no int8 CPU kernels, or it has no `engine`."""
    _check_on_cpu(model, "int8")
    chosen = int8_engine(engine)
    quantize_dynamic = _quantize_dynamic()
    quantized = copy.deepcopy(model).eval()
    previous = torch.backends.quantized.engine
    try:
        with warnings.catch_warnings():  # the same deprecation, and that of the quantized tensors it creates
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=r".*quantize_per_tensor.*", category=UserWarning)
            torch.backends.quantized.engine = chosen
            quantize_dynamic(quantized, {nn.Linear}, dtype=torch.qint8, inplace=True)
    finally:
        torch.backends.quantized.engine = previous
    return quantized


_TINY = torch.finfo(torch.float32).tiny  # the scale of a row of zeros: its int8 values are zeros


@functools.cache
def int_mm_is_exact(in_features: int = 512, out_features: int = 512, int_mm=None) -> bool:
    """Whether `int_mm` (torch._int_mm) gives exact int32 sums on this CPU for weights of this shape, laid out as
    `RowwiseInt8Linear` lays them: checked against float64 sums on rows of +-127 (extreme values) and random int8s,
    1, 5 and 48 at a time. Some CPUs' kernels are not exact: oneDNN's s8s8 gemm adds 128 to one side and sums
    pairs of u8 x s8 products in int16 where the CPU lacks VNNI, which saturates (oneDNN's "Int8 Computation
    Aspects"); seen on a CI machine as outputs off by up to 100x."""
    int_mm = torch._int_mm if int_mm is None else int_mm
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (out_features, in_features), generator=generator, dtype=torch.int8)
    weight[: out_features // 2] = 127
    for count in (1, 5, 48):
        rows = torch.randint(-127, 128, (count, in_features), generator=generator, dtype=torch.int8)
        rows[0] = 127
        expected = rows.double() @ weight.double().t()
        if not torch.equal(int_mm(rows, weight.t()).double(), expected):
            return False
    return True


class RowwiseInt8Linear(nn.Module):
    """`linear` with int8 weights and inputs, one scale per row of each (see the module docstring); for inference."""

    def __init__(self, linear: nn.Linear, exact_int_mm: bool | None = None):
        """`exact_int_mm`: whether to sum with torch._int_mm (None: where `int_mm_is_exact` for this shape), else
        with a float32 matmul of the same int8 values (exact while the sums stay below 2**24)."""
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=_TINY) / 127
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if exact_int_mm is None:
            exact_int_mm = int_mm_is_exact(self.in_features, self.out_features)
        self.uses_int_mm = exact_int_mm
        # [in, out], a transposed view of the [out, in] int8 rows: the layout torch._int_mm reads fastest
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).to(torch.int8).t())
        self.register_buffer("weight_values", None if exact_int_mm else self.weight_int8.float(), persistent=False)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        rows = inputs.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=_TINY) / 127
        if self.uses_int_mm:
            sums = torch._int_mm(torch.round(rows / scale).to(torch.int8), self.weight_int8)
        else:  # the int8 values as float32 (see `int_mm_is_exact`)
            sums = torch.round(rows / scale) @ self.weight_values
        outputs = torch.mul(sums, scale)  # int32 x float32: one pass to float32
        if self.bias is None:
            outputs = outputs.mul_(self.weight_scale)
        else:
            outputs = torch.addcmul(self.bias, outputs, self.weight_scale)
        return outputs.reshape(*inputs.shape[:-1], self.out_features).to(inputs.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_int8_rowwise(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of `model` (left unchanged) in eval mode whose `nn.Linear` layers are `RowwiseInt8Linear`;
    QuantizeError if the model is not on the CPU or this torch has no `torch._int_mm`."""
    _check_on_cpu(model, "int8_rowwise")
    if not hasattr(torch, "_int_mm"):
        raise QuantizeError(
            f"--quantize int8_rowwise: torch {torch.__version__} has no torch._int_mm; use --quantize int8"
        )
    quantized = copy.deepcopy(model).eval()
    for module in list(quantized.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, RowwiseInt8Linear(child))
    return quantized


def describe_quantization(method: str | None, engine: str | None = None) -> str | None:
    """`--quantize` in words, naming the kernels: "int8 (onednn kernels)", "int8_rowwise (torch._int_mm)"."""
    if method == "int8":
        return f"int8 ({int8_engine(engine)} kernels)"
    if method == "int8_rowwise":
        return (
            f"{method} (torch._int_mm)" if int_mm_is_exact() else f"{method} (float32 matmul: inexact torch._int_mm)"
        )
    return method


def quantize(model: PreTrainedModel, method: str | None, engine: str | None = None) -> PreTrainedModel:
    """`model` quantized by `method` (`--quantize`: None, or one of QUANTIZE_CHOICES) with the kernels of `engine`
    (`--int8_engine`: None or "auto" for this CPU's choice)."""
    if method is None:
        return model
    if method == "int8":
        return quantize_int8(model, engine)
    if method == "int8_rowwise":
        return quantize_int8_rowwise(model)
    raise QuantizeError(f"--quantize {method}: not a quantization; one of {', '.join(QUANTIZE_CHOICES)}")


__all__ = [
    "INT8_ENGINES",
    "QUANTIZE_CHOICES",
    "QuantizeError",
    "RowwiseInt8Linear",
    "describe_quantization",
    "int8_engine",
    "int_mm_is_exact",
    "quantize",
    "quantize_device",
    "quantize_int8",
    "quantize_int8_rowwise",
]
