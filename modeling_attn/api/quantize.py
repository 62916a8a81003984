"""Dynamic int8 quantization for CPU inference: `quantize_int8(model)`, the one function behind `--quantize int8` of
`attn translate`, `attn evaluate` and `attn serve`.

Every `nn.Linear` of the model (attention projections, feed-forward layers, the output projection; the RNN's
bridge, readout and score layers) becomes a dynamically quantized linear layer: its weight is stored as int8 with
one scale per tensor, and each input is quantized to 8 bits with a scale computed from that input at run time
(Jacob et al. 2018, "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference";
PyTorch's "dynamic quantization"). Embeddings, LayerNorms and the RNN cells stay float32. Nothing is trained or
calibrated: it applies to any saved model, as CTranslate2's `--quantization int8` does.

Which API: torch 2.13 marks `torch.ao.quantization` deprecated (its warning still says "will be removed in 2.10")
and points to torchao's `quantize_`. On the CPU that replacement is slower than float32 without `torch.compile`:
on the `base` preset at beam 4 (one thread, 16 sentences, 20 forced tokens) float32 took 8.1 s,
`torch.ao.quantization.quantize_dynamic` 4.0 s, torchao 0.18's `Int8DynamicActivationInt8WeightConfig` 9.3 s and
`Int8WeightOnlyConfig` 6.3 s. So this module uses `quantize_dynamic` (fbgemm / x86 kernels), silences its
deprecation warnings, and names the cause in one line if a later torch no longer has it.

Kernels: `engine` picks torch's quantized engine whose kernels the int8 weights are packed for (the packed weights
keep it; torch's process-wide setting is restored afterwards). The default, "auto" (`int8_engine`), is `onednn` on a
CPU with AMX int8 tiles when this torch has it, and torch's own engine (`x86`: fbgemm kernels) otherwise. Why: on a
2-core Xeon with AMX and AVX-512 VNNI, oneDNN ran the int8 matrix products on AMX (`ONEDNN_VERBOSE=1`:
`brg_matmul:avx10_1_512_amx`); int8 was 1.85-2.04x float32 with onednn against 1.63-1.65x with `x86` on the `base`
preset at beam 4 (one thread), within a few percent of it on the d_model 128 models, slower on toy sizes where int8
does not pay at all (docs/serve.md, bench/results/int8-cpu.md). Without AMX no measurement favours onednn, so
torch's default stays. Both engines quantize inputs to 7 bits (tests/test_quantize.py writes their arithmetic out).
`--int8_engine` of the commands overrides the choice.

The quantized kernels are CPU kernels: a model on another device is refused (`QuantizeError`), and `quantize_device`
makes the commands load the model on the CPU when `--quantize` is given without `--device`.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn
from transformers import PreTrainedModel

from .translation import TranslateError

QUANTIZE_CHOICES = ("int8",)
INT8_ENGINES = ("auto", "x86", "fbgemm", "onednn", "qnnpack")  # `--int8_engine`; torch builds have some of them


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
            f"--quantize {quantize} runs on the CPU only (dynamic int8 kernels), not on --device {device}; "
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
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise QuantizeError(
            f"--quantize int8 runs on the CPU only (dynamic int8 kernels); the model is on {device}: "
            "load it with --device cpu, or drop --quantize"
        )
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


def quantize(model: PreTrainedModel, method: str | None, engine: str | None = None) -> PreTrainedModel:
    """`model` quantized by `method` (`--quantize`: None, or one of QUANTIZE_CHOICES) with the kernels of `engine`
    (`--int8_engine`: None or "auto" for this CPU's choice)."""
    if method is None:
        return model
    if method == "int8":
        return quantize_int8(model, engine)
    raise QuantizeError(f"--quantize {method}: not a quantization; one of {', '.join(QUANTIZE_CHOICES)}")


__all__ = [
    "INT8_ENGINES",
    "QUANTIZE_CHOICES",
    "QuantizeError",
    "int8_engine",
    "quantize",
    "quantize_device",
    "quantize_int8",
]
