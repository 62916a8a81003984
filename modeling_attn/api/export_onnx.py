"""Export of `attn_transformer` models to ONNX as the two graphs generation needs: an encoder and a decoder step.

- `encoder_model.onnx`: (input_ids, attention_mask) (B, S) -> `present.{i}.encoder.key` / `.value`, (B, H, S, D)
  for each decoder layer i: the keys and values of that layer's encoder-decoder attention (Vaswani et al. 2017,
  Sec. 3.2.3), computed once per sentence, as fairseq's incremental decoding keeps its "static" encoder K/V.
- `decoder_model.onnx`: one decoding step: `input_ids` (B, 1), `encoder_attention_mask` (B, S) and the past keys and
  values of both attentions -> `logits` (B, V) of the next token and the new self-attention keys and values.
  The names are those of optimum's seq2seq ONNX exports; batch, source and past lengths are dynamic.

Both graphs are traced from the model's own code with `torch.onnx.export(dynamo=True)`, and `verify` compares them
with the model on a batch before returning; `onnx_generation.OnnxTranslator` translates with the folder. The folder's
files, the exporter choice and why attn_rnn is refused: docs/export.md, "ONNX". onnx, onnxscript and onnxruntime are
optional dependencies (`pip install "modeling-attn[onnx]"`).

Shapes: B batch, S source length, P past target positions, H heads, D head dim, E d_model, V target vocabulary.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from ..attention import split_heads
from ..modeling_transformer import AttnTransformerForConditionalGeneration
from ..registry import MODEL_TYPES
from .errors import ExportError, UserError
from .outputs import output_folder

ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"
MANIFEST_FILE = "onnx_export.json"
VERIFY_TOLERANCE = 1e-3  # max |logits difference| between onnxruntime and PyTorch (float32) an export must meet


class MissingOnnxError(UserError, ImportError):
    """onnx, onnxscript or onnxruntime (the optional `onnx` extra) is not installed."""


def import_onnxruntime():
    """onnxruntime, or MissingOnnxError saying how to install it."""
    try:
        import onnxruntime
    except ImportError as error:
        raise MissingOnnxError('ONNX needs onnxruntime: pip install "modeling-attn[onnx]"') from error
    return onnxruntime


def _check_exporter() -> None:
    for package in ("onnx", "onnxscript"):
        try:
            __import__(package)
        except ImportError as error:
            raise MissingOnnxError(f'the ONNX export needs {package}: pip install "modeling-attn[onnx]"') from error


def graph_names(num_layers: int) -> dict[str, list[str]]:
    """The input and output names of both graphs for a decoder of `num_layers` layers."""

    def per_layer(prefix: str, side: str) -> list[str]:
        return [f"{prefix}.{i}.{side}.{part}" for i in range(num_layers) for part in ("key", "value")]

    return {
        "encoder_inputs": ["input_ids", "attention_mask"],
        "encoder_outputs": per_layer("present", "encoder"),
        "decoder_inputs": [
            "input_ids",
            "encoder_attention_mask",
            *per_layer("past_key_values", "decoder"),
            *per_layer("past_key_values", "encoder"),
        ],
        "decoder_outputs": ["logits", *per_layer("present", "decoder")],
    }


class EncoderGraph(nn.Module):
    """The encoder, then each decoder layer's cross-attention keys and values of its output (what
    `attention.MultiHeadAttention` computes at the first decoding step)."""

    def __init__(self, model: AttnTransformerForConditionalGeneration):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        keys_values = []
        for layer in self.model.model.decoder.layers:
            attention = layer.encoder_attn
            keys_values.append(split_heads(attention.k_proj(states), attention.head_dim))  # (B, H, S, D)
            keys_values.append(split_heads(attention.v_proj(states), attention.head_dim))
        return tuple(keys_values)


class DecoderStepGraph(nn.Module):
    """One decoding step of the model's forward, its cache built from the past and cross-attention tensors."""

    def __init__(self, model: AttnTransformerForConditionalGeneration):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        past: tuple[torch.Tensor, ...],
        cross: tuple[torch.Tensor, ...],
    ) -> tuple[torch.Tensor, ...]:
        config = self.model.config
        self_cache, cross_cache = DynamicCache(config=config), DynamicCache(config=config)
        for layer_idx in range(config.decoder_layers):
            self_cache.update(past[2 * layer_idx], past[2 * layer_idx + 1], layer_idx)
            cross_cache.update(cross[2 * layer_idx], cross[2 * layer_idx + 1], layer_idx)
        cache = EncoderDecoderCache(self_cache, cross_cache)
        for layer_idx in range(config.decoder_layers):
            cache.is_updated[layer_idx] = True  # cross-attention reads the cache, never the encoder states
        batch_size, source_length = encoder_attention_mask.shape
        # only the shape of the encoder states is read (checks, mask sizes): the cache holds their keys and values
        encoder_states = cross[0].new_zeros(batch_size, source_length, config.d_model)
        outputs = self.model(
            encoder_outputs=(encoder_states,),
            attention_mask=encoder_attention_mask,
            decoder_input_ids=input_ids,
            cache=cache,
            use_cache=True,
        )
        present = [tensor for layer in cache.self_attention_cache.layers for tensor in (layer.keys, layer.values)]
        return (outputs.logits[:, -1], *present)


def example_inputs(
    model: AttnTransformerForConditionalGeneration,
    batch_size: int = 3,
    source_length: int = 5,
    past_length: int = 2,
    seed: int = 0,
) -> dict[str, tuple]:
    """Inputs to trace and verify with: a padded source batch, and random past keys/values (sizes above 1, which
    torch.export would take for constants)."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, config.vocab_size, (batch_size, source_length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1:, source_length - 2 :] = 0  # all rows but the first padded
    input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id or 0)
    with torch.no_grad():
        cross = EncoderGraph(model)(input_ids, attention_mask)
    head_dim = config.d_model // config.num_heads
    past = tuple(
        torch.randn(batch_size, config.num_heads, past_length, head_dim, generator=generator)
        for _ in range(2 * config.decoder_layers)
    )
    decoder_ids = torch.randint(3, config.decoder_vocab_size, (batch_size, 1), generator=generator)
    return {"encoder": (input_ids, attention_mask), "decoder": (decoder_ids, attention_mask, past, cross)}


# What torch.onnx's exporter says on every successful export that is not about this model (torch 2.13): the
# torchvision operators it skips, a deprecation inside torch, and dynamic axes that share a name on purpose.
EXPORTER_NOISE = (r"# The axis name: \w+ will not be used", r"`isinstance\(treespec, LeafSpec\)` is deprecated")
EXPORTER_REGISTRY_LOGGER = "torch.onnx._internal.exporter._registration"  # "torchvision is not installed..."


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """torch.onnx's messages of `EXPORTER_NOISE` left out while the block runs; any other warning still shows."""
    registry = logging.getLogger(EXPORTER_REGISTRY_LOGGER)
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for pattern in EXPORTER_NOISE:
                warnings.filterwarnings("ignore", message=pattern)
            yield
    finally:
        registry.setLevel(level)


def _export_graphs(model: AttnTransformerForConditionalGeneration, output_dir: Path, opset_version: int | None):
    """Write both graphs; batch, source and past lengths dynamic (past up to the position table's end)."""
    with _quiet_exporter():
        _export_both(model, output_dir, opset_version)


def _export_both(model: AttnTransformerForConditionalGeneration, output_dir: Path, opset_version: int | None):
    names = graph_names(model.config.decoder_layers)
    batch, source = torch.export.Dim("batch"), torch.export.Dim("source")
    past_length = torch.export.Dim("past", max=model.config.max_position_embeddings - 1)
    inputs = example_inputs(model)
    layers = 2 * model.config.decoder_layers
    common = dict(dynamo=True, external_data=False, opset_version=opset_version, verbose=False)
    torch.onnx.export(
        EncoderGraph(model).eval(),
        inputs["encoder"],
        str(output_dir / ENCODER_FILE),
        input_names=names["encoder_inputs"],
        output_names=names["encoder_outputs"],
        dynamic_shapes={"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}},
        **common,
    )
    torch.onnx.export(
        DecoderStepGraph(model).eval(),
        inputs["decoder"],
        str(output_dir / DECODER_FILE),
        input_names=names["decoder_inputs"],
        output_names=names["decoder_outputs"],
        dynamic_shapes={
            "input_ids": {0: batch},
            "encoder_attention_mask": {0: batch, 1: source},
            "past": tuple({0: batch, 2: past_length} for _ in range(layers)),
            "cross": tuple({0: batch, 2: source} for _ in range(layers)),
        },
        **common,
    )


def verify_export(model: AttnTransformerForConditionalGeneration, output_dir: Path) -> float:
    """Max |difference| between onnxruntime's and the model's logits and keys/values on `example_inputs` (another
    batch size and past length than the traced ones); RuntimeError above VERIFY_TOLERANCE."""
    onnxruntime = import_onnxruntime()
    inputs = example_inputs(model, batch_size=4, source_length=7, past_length=3, seed=1)
    names = graph_names(model.config.decoder_layers)
    encoder = onnxruntime.InferenceSession(str(output_dir / ENCODER_FILE), providers=["CPUExecutionProvider"])
    decoder = onnxruntime.InferenceSession(str(output_dir / DECODER_FILE), providers=["CPUExecutionProvider"])
    input_ids, attention_mask = (tensor.numpy() for tensor in inputs["encoder"])
    cross = encoder.run(None, dict(zip(names["encoder_inputs"], (input_ids, attention_mask), strict=True)))
    decoder_ids, _, past, _ = inputs["decoder"]
    feeds = [decoder_ids.numpy(), attention_mask, *(tensor.numpy() for tensor in past), *cross]
    got = decoder.run(None, dict(zip(names["decoder_inputs"], feeds, strict=True)))
    with torch.no_grad():
        expected = DecoderStepGraph(model)(*inputs["decoder"])
    difference = max(float(abs(a - b.numpy()).max()) for a, b in zip(got, expected, strict=True))
    if difference > VERIFY_TOLERANCE:
        raise RuntimeError(
            f"the ONNX export in {output_dir} computes other values than the model: max |difference| {difference:.3g} "
            f"> {VERIFY_TOLERANCE} on a test batch"
        )
    return difference


def check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse a folder that holds anything unless `overwrite` (then our files replace theirs, others are kept)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise NotADirectoryError(f"{output_dir} is a file, not a folder for the ONNX export")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{output_dir} is not empty; pass overwrite=True to write the ONNX export over it")


def export_onnx_model(
    model: AttnTransformerForConditionalGeneration,
    output_dir: str | Path,
    tokenizer: PreTrainedTokenizerBase | None = None,
    overwrite: bool = False,
    opset_version: int | None = None,
    verify: bool = True,
) -> Path:
    """Export a loaded attn_transformer model (module docstring for the folder it writes); return the folder."""
    _check_exporter()
    if not isinstance(model, AttnTransformerForConditionalGeneration):
        raise TypeError(
            f"export_onnx_model takes an AttnTransformerForConditionalGeneration, got {type(model).__name__}"
        )
    output_dir = Path(output_dir)
    check_output_dir(output_dir, overwrite)
    output_dir.mkdir(parents=True, exist_ok=True)
    if model.device.type != "cpu" or model.dtype != torch.float32 or model.training:
        model = copy.deepcopy(model).to("cpu", torch.float32).eval()  # the caller's model stays as it was
    _export_graphs(model, output_dir, opset_version)
    difference = verify_export(model, output_dir) if verify else None
    model.config.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    manifest = {
        **graph_names(model.config.decoder_layers),
        "encoder": ENCODER_FILE,
        "decoder": DECODER_FILE,
        "verified_max_abs_difference": difference,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (output_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return output_dir


def _exported_class(model_dir: Path) -> type[AttnTransformerForConditionalGeneration]:
    """The class to load the saved model in `model_dir` with; refused (one line) unless ONNX exports its type."""
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json, not a saved model folder")
    model_type = AutoConfig.from_pretrained(model_dir).model_type
    exported = [name for name, entry in MODEL_TYPES.items() if entry.onnx_refusal is None]
    if model_type not in MODEL_TYPES:
        raise ExportError(
            f"{model_dir} holds a {model_type!r} model; the ONNX export takes {', '.join(exported)} models"
        )
    if (refusal := MODEL_TYPES[model_type].onnx_refusal) is not None:
        raise ExportError(
            f"{model_dir}: {model_type} models are not exported to ONNX yet: {refusal}; export a "
            f"{' or '.join(exported)} model"
        )
    return MODEL_TYPES[model_type].generation_class


def load_exported(
    model_dir: str | Path,
) -> tuple[AttnTransformerForConditionalGeneration, PreTrainedTokenizerBase | None]:
    """The saved attn_transformer in `model_dir` and its tokenizer (None if the folder has none), for
    `export_onnx_model`; a folder ONNX does not export is refused in one line."""
    model_dir = Path(model_dir)
    model = _exported_class(model_dir).from_pretrained(model_dir)
    has_tokenizer = any((model_dir / name).exists() for name in ("tokenizer_config.json", "tokenizer.json"))
    return model, AutoTokenizer.from_pretrained(model_dir) if has_tokenizer else None


def export_onnx(
    model_dir: str | Path,
    output_dir: str | Path,
    overwrite: bool = False,
    opset_version: int | None = None,
    verify: bool = True,
) -> Path:
    """Export a saved attn_transformer folder (with its tokenizer, when it has one) to ONNX in `output_dir`, which
    must be empty or absent unless `overwrite`. Returns `output_dir`. attn_rnn models are refused.

    The files are written as `attn export --onnx` writes them (`outputs.output_folder`): staged and moved into place,
    other files kept, and recorded in `.attn-written.json` as that command's export of this model, so that the
    command exports into the folder again without --force."""
    _exported_class(Path(model_dir))  # a model ONNX does not export: refused before the output folder is looked at
    check_output_dir(Path(output_dir), overwrite)  # before the (slow) loading and tracing
    model, tokenizer = load_exported(model_dir)
    # `sources`: the writer as the command records it; no `inputs`, so a folder inside the model's is allowed, as ever
    with output_folder(
        output_dir, "attn export", force=True, output_name="output_dir", sources={"--model": model_dir}
    ) as staging:
        export_onnx_model(model, staging, tokenizer, opset_version=opset_version, verify=verify)
    return Path(output_dir)


__all__ = [
    "DECODER_FILE",
    "ENCODER_FILE",
    "MANIFEST_FILE",
    "DecoderStepGraph",
    "EncoderGraph",
    "MissingOnnxError",
    "check_output_dir",
    "export_onnx",
    "export_onnx_model",
    "graph_names",
    "import_onnxruntime",
    "load_exported",
    "verify_export",
]
