"""Export of `attn_transformer` models to CTranslate2, a fast C++ inference engine, and decoding with the export.

`export_ctranslate2(model_or_dir, output_dir, quantization="float32" | "int8" | ...)` fills CTranslate2's Python
model spec (`ctranslate2.specs.TransformerSpec`) tensor by tensor from our model and saves it with CTranslate2's own
`Converter.convert` (validation, quantization, aliasing of tied weights). The spec maps every variant of our config
(post-LN or pre-LN, activation, embedding scale, our position table, alignment layer and heads, `final_logits_bias`,
separate vocabularies); docs/interop.md, "CTranslate2", lists each mapping and why we build the spec ourselves rather
than go through CTranslate2's Marian converter. CTranslate2 works on token strings: `CTranslate2Translator` maps ids
to them and back, and takes its decoding defaults from the generation config saved next to the export.

`ctranslate2` is an optional dependency (`pip install "modeling-attn[interop]"`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from ..configuration_transformer import AttnTransformerConfig
from ..generation import SOURCE_LIMIT_FIELD
from ..modeling_transformer import AttnTransformerForConditionalGeneration
from .choices import QUANTIZATIONS
from .errors import ExportError, UserError
from .threads import torch_threads

TOKENIZER_SUBFOLDER = "tokenizer"  # the HF tokenizer, saved apart from CTranslate2's config.json

# ACT2FN names and the CTranslate2 activation computing the same function (ctranslate2.specs.Activation names).
ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "gelu_python": "GELU",
    "gelu_new": "GELUTanh",
    "gelu_pytorch_tanh": "GELUTanh",
    "quick_gelu": "GELUSigmoid",
    "silu": "SWISH",
    "swish": "SWISH",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
}


class MissingExtraError(UserError, ImportError):
    """ctranslate2, an optional dependency, is not installed."""


def import_ctranslate2():
    try:
        import ctranslate2
    except ImportError as error:
        raise MissingExtraError(
            'the CTranslate2 export needs the ctranslate2 package: pip install "modeling-attn[interop]"'
        ) from error
    return ctranslate2


def _tensor(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", torch.float32).contiguous()


def _set_linear(spec, *linears: torch.nn.Linear) -> None:
    """One spec linear layer from one or several (fused along the output dimension) torch linear layers."""
    spec.weight = _tensor(torch.cat([linear.weight for linear in linears]))
    if linears[0].bias is not None:
        spec.bias = _tensor(torch.cat([linear.bias for linear in linears]))


def _set_layer_norm(spec, layer_norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _tensor(layer_norm.weight)
    spec.beta = _tensor(layer_norm.bias)


def _set_stack(spec, stack) -> None:
    """Embeddings, positions and the final LayerNorm (pre-LN) of an encoder or decoder stack."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _tensor(stack.embed_tokens.weight)
    spec.scale_embeddings = float(stack.embed_scale)
    spec.position_encodings.encodings = _tensor(stack.embed_positions.table)
    if stack.layer_norm is not None:
        _set_layer_norm(spec.layer_norm, stack.layer_norm)


def build_spec(model: AttnTransformerForConditionalGeneration):
    """The `ctranslate2.specs.TransformerSpec` of `model`, weights set, vocabularies and config not yet."""
    import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    if config.activation_function not in ACTIVATIONS:
        raise ExportError(
            f"AttnTransformerConfig.activation_function={config.activation_function!r} has no CTranslate2 "
            f"counterpart; supported: {sorted(ACTIVATIONS)}"
        )
    activation = getattr(common_spec.Activation, ACTIVATIONS[config.activation_function])
    spec = transformer_spec.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers),
        config.num_heads,
        pre_norm=config.norm_first,
        activation=activation,
        alignment_layer=config.alignment_layer,
        alignment_heads=config.alignment_heads or config.num_heads,
    )
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    encoder, decoder = model.get_encoder(), model.model.decoder
    _set_stack(spec.encoder, encoder)
    for layer_spec, layer in zip(spec.encoder.layer, encoder.layers, strict=True):
        attention = layer.self_attn
        _set_linear(layer_spec.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
        _set_linear(layer_spec.self_attention.linear[1], attention.out_proj)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _set_linear(layer_spec.ffn.linear_0, layer.fc1)
        _set_linear(layer_spec.ffn.linear_1, layer.fc2)
        _set_layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
    _set_stack(spec.decoder, decoder)
    for layer_spec, layer in zip(spec.decoder.layer, decoder.layers, strict=True):
        attention, cross = layer.self_attn, layer.encoder_attn
        _set_linear(layer_spec.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
        _set_linear(layer_spec.self_attention.linear[1], attention.out_proj)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _set_linear(layer_spec.attention.linear[0], cross.q_proj)
        _set_linear(layer_spec.attention.linear[1], cross.k_proj, cross.v_proj)
        _set_linear(layer_spec.attention.linear[2], cross.out_proj)
        _set_layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _set_linear(layer_spec.ffn.linear_0, layer.fc1)
        _set_linear(layer_spec.ffn.linear_1, layer.fc2)
        _set_layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
    _set_linear(spec.decoder.projection, model.lm_head)
    if model.final_logits_bias is not None:
        spec.decoder.projection.bias = _tensor(model.final_logits_bias[0])
    return spec


def vocabulary(tokenizer: PreTrainedTokenizerBase | None, size: int, side: str = "target") -> list[str]:
    """Token strings for ids 0..size-1 of the "source" or "target" side: the tokenizer's (`<unused_ID>` past its
    end), or the ids themselves without a tokenizer."""
    if tokenizer is None:
        return [str(token_id) for token_id in range(size)]
    if side == "source" and getattr(tokenizer, "separate_vocabs", False):  # MarianTokenizer: ids -> target tokens
        id_to_token = {token_id: token for token, token_id in tokenizer.encoder.items()}
        known = [id_to_token.get(token_id) for token_id in range(min(size, len(id_to_token)))]
    else:
        known = tokenizer.convert_ids_to_tokens(list(range(min(size, len(tokenizer)))))
    tokens = known + [f"<unused_{i}>" for i in range(len(known), size)]
    seen: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        if token is None or token in seen:
            raise ExportError(
                f"the tokenizer maps id {token_id} to {token!r}"
                + (f", as it does id {seen[token]}" if token in seen else "")
                + "; CTranslate2 needs one distinct token string per id"
            )
        seen[token] = token_id
    return tokens


def _first(token_ids: int | list[int] | None) -> int | None:
    return token_ids[0] if isinstance(token_ids, list) else token_ids


def _load(model_or_dir, tokenizer):
    """The model (a Marian one converted) and tokenizer to export, from a folder or as given."""
    if isinstance(model_or_dir, (str, Path)):
        model_type = AutoConfig.from_pretrained(model_or_dir).model_type
        if model_type == "marian":
            from transformers import MarianMTModel

            from .convert_marian import marian_to_attn

            model = marian_to_attn(MarianMTModel.from_pretrained(model_or_dir))
        elif model_type == AttnTransformerConfig.model_type:
            model = AttnTransformerForConditionalGeneration.from_pretrained(model_or_dir)
        else:
            raise ExportError(
                f"{model_or_dir} holds a {model_type!r} model; the CTranslate2 export takes attn_transformer "
                "(or Marian) models"
            )
        if tokenizer is None and any(
            (Path(model_or_dir) / name).exists() for name in ("tokenizer_config.json", "tokenizer.json")
        ):
            tokenizer = AutoTokenizer.from_pretrained(model_or_dir)
        return model, tokenizer
    if not isinstance(model_or_dir, AttnTransformerForConditionalGeneration):
        raise TypeError(
            f"export_ctranslate2 takes an AttnTransformerForConditionalGeneration or a folder, got "
            f"{type(model_or_dir).__name__} (convert a MarianMTModel with convert_marian.marian_to_attn first)"
        )
    return model_or_dir, tokenizer


def export_ctranslate2(
    model_or_dir: AttnTransformerForConditionalGeneration | str | Path,
    output_dir: str | Path,
    quantization: str = "float32",
    tokenizer: PreTrainedTokenizerBase | None = None,
    force: bool = False,
) -> Path:
    """Export a model (or a saved attn_transformer / Marian folder, with its tokenizer) to a CTranslate2 folder.

    `quantization` is the weight type CTranslate2 stores ("float32", "int8", "int8_float16", "float16"...).
    The folder gets CTranslate2's model.bin, config.json and vocabularies, the model's generation_config.json and,
    when there is a tokenizer, the tokenizer in `tokenizer/`. Returns the folder. An existing folder is refused
    unless `force`, which replaces those files only: the export is written beside the folder first and moved in
    (CTranslate2's own `force` deletes the whole folder, files it did not write too).
    """
    ctranslate2 = import_ctranslate2()
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {quantization!r}")
    model, tokenizer = _load(model_or_dir, tokenizer)
    config = model.config
    source_tokens = vocabulary(tokenizer, config.vocab_size, "source")
    target_tokens = vocabulary(tokenizer, config.decoder_vocab_size, "target")
    for field in ("eos_token_id", "decoder_start_token_id"):
        if _first(getattr(config, field)) is None:
            raise ExportError(f"AttnTransformerConfig.{field} is None; CTranslate2 needs it")

    class _Converter(ctranslate2.converters.Converter):
        def _load(self):
            spec = build_spec(model)
            spec.register_source_vocabulary(source_tokens)
            spec.register_target_vocabulary(target_tokens)
            start = target_tokens[config.decoder_start_token_id]
            spec.config.decoder_start_token = start
            spec.config.eos_token = target_tokens[_first(config.eos_token_id)]
            spec.config.bos_token = start if config.bos_token_id is None else target_tokens[config.bos_token_id]
            unknown = getattr(tokenizer, "unk_token", None)
            if unknown in target_tokens:
                spec.config.unk_token = unknown
            return spec

    target = Path(output_dir)
    if target.exists() and not force:
        raise RuntimeError(f"output directory {target} already exists, use force=True to replace the export's files")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-export-") as scratch:
        staging = Path(scratch) / "export"
        with torch.no_grad():
            _Converter().convert(str(staging), quantization=quantization)
        model.generation_config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging / TOKENIZER_SUBFOLDER)
        target.mkdir(exist_ok=True)
        for path in staging.iterdir():  # the export's own files replace their namesakes; nothing else is touched
            if (target / path.name).is_dir():
                shutil.rmtree(target / path.name)
            os.replace(path, target / path.name)
    return target


class CTranslate2Translator:
    """Decode with an export of `export_ctranslate2`, at the level of token ids (or texts, with its tokenizer).

    Defaults follow the saved generation config as `generate()` does: `num_beams`, `length_penalty`,
    `bad_words_ids` (as CTranslate2's `suppress_sequences`), the end tokens, and `max_new_tokens` or
    `max_length - 1` (the decoder start token does not count in CTranslate2) as the output length limit
    `max_decoding_length` (the `max_new_tokens` of generate()). With a `forced_eos_token_id` (Marian's)
    generate() ends a translation that reaches the limit with the end token, so one token fewer is decoded.
    `max_length_over_source` (the paper's source length + 50) becomes a limit per batch, from its longest
    source: the same translations unless a shorter sentence of the batch would run past its own limit.
    """

    def __init__(self, model_dir: str | Path, device: str = "cpu", compute_type: str = "default", **kwargs):
        ctranslate2 = import_ctranslate2()
        self.model_dir = Path(model_dir)
        # CTranslate2 sets the OpenMP threads of the thread that opens it to its intra_threads, which torch reads as
        # its own setting: kept as it was (else torch, and the next engine's `threads.available()`, would see one)
        with torch_threads(torch.get_num_threads()):
            self.translator = ctranslate2.Translator(
                str(model_dir), device=device, compute_type=compute_type, **kwargs
            )
        if (self.model_dir / "shared_vocabulary.json").exists():
            self.source_tokens = self.target_tokens = self._read_json("shared_vocabulary.json")
        else:
            self.source_tokens = self._read_json("source_vocabulary.json")
            self.target_tokens = self._read_json("target_vocabulary.json")
        self.target_ids = {token: token_id for token_id, token in enumerate(self.target_tokens)}
        path = self.model_dir / "generation_config.json"
        self.generation_config = GenerationConfig.from_pretrained(model_dir) if path.exists() else GenerationConfig()
        self._tokenizer = None

    def _read_json(self, name: str) -> list[str]:
        return json.loads((self.model_dir / name).read_text(encoding="utf-8"))

    def options(self, source_lengths: Sequence[int] = (), **overrides) -> dict:
        """translate_batch options: the generation config's, then `overrides` (any translate_batch argument);
        `source_lengths` (tokens per source) serve the generation config's `max_length_over_source`."""
        config = self.generation_config
        forced_end = int(config.forced_eos_token_id is not None)  # generate() spends the last step on it
        offset = getattr(config, SOURCE_LIMIT_FIELD, None)
        if "max_decoding_length" in overrides:
            max_length = overrides.pop("max_decoding_length") - forced_end
        elif config.max_new_tokens is not None:
            max_length = config.max_new_tokens - forced_end
        elif offset and source_lengths:  # source length + offset tokens, the forced end token included
            max_length = max(source_lengths) + offset - 1
        else:
            # generate()'s max_length counts the start token; transformers' default where the config has none
            default = GenerationConfig._get_default_generation_params()["max_length"]
            max_length = (config.max_length if config.max_length is not None else default) - 1 - forced_end
        options = dict(
            beam_size=config.num_beams or 1,
            length_penalty=config.length_penalty if config.length_penalty is not None else 1.0,
            max_decoding_length=max_length,
            min_decoding_length=0,
            max_input_length=0,  # no truncation of the source (generate() has none)
        )
        if config.eos_token_id is not None:
            eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
            options["end_token"] = [self.target_tokens[token_id] for token_id in eos]
        if config.bad_words_ids:
            options["suppress_sequences"] = [[self.target_tokens[i] for i in ids] for ids in config.bad_words_ids]
        return {**options, **overrides}

    def translate_ids(self, source_ids: Sequence[Sequence[int]], **overrides) -> list[list[int]]:
        """Best translation of each source (ids without padding, as the tokenizer gives them) as target ids,
        without the start and end tokens. `overrides` are translate_batch arguments (beam_size=4, ...)."""
        vocab_size = len(self.source_tokens)
        batch = []
        for row, ids in enumerate(source_ids):
            bad = [token_id for token_id in ids if not 0 <= token_id < vocab_size]
            if bad:
                raise IndexError(f"source_ids[{row}] holds token id {bad[0]}; ids must be in [0, {vocab_size})")
            batch.append([self.source_tokens[token_id] for token_id in ids])
        options = self.options([len(tokens) for tokens in batch], **overrides)
        results = self.translator.translate_batch(batch, **options)
        return [[self.target_ids[token] for token in result.hypotheses[0]] for result in results]

    def translate_ids_with_attention(
        self, source_ids: Sequence[Sequence[int]], **overrides
    ) -> list[tuple[list[int], torch.Tensor]]:
        """`translate_ids`' translations, each with the attention CTranslate2 returns for it (`return_attention`:
        the export's alignment layer and heads), as a (target tokens, source tokens) tensor: row t is the step that
        produced token t, the columns are the source ids given (the end token included)."""
        vocab_size = len(self.source_tokens)
        for row, ids in enumerate(source_ids):
            if bad := [token_id for token_id in ids if not 0 <= token_id < vocab_size]:
                raise IndexError(f"source_ids[{row}] holds token id {bad[0]}; ids must be in [0, {vocab_size})")
        batch = [[self.source_tokens[token_id] for token_id in ids] for ids in source_ids]
        options = self.options([len(tokens) for tokens in batch], **overrides)
        results = self.translator.translate_batch(batch, return_attention=True, **options)
        return [
            ([self.target_ids[token] for token in result.hypotheses[0]], torch.tensor(result.attention[0]))
            for result in results
        ]

    def score_ids(self, source_ids: Sequence[Sequence[int]], target_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probability of each target token (the end token appended) given its source, as CTranslate2
        computes it (teacher forcing): a check of the export against the model's own logits."""
        source = [[self.source_tokens[token_id] for token_id in ids] for ids in source_ids]
        target = [[self.target_tokens[token_id] for token_id in ids] for ids in target_ids]
        return [result.log_probs for result in self.translator.score_batch(source, target, max_input_length=0)]

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            path = self.model_dir / TOKENIZER_SUBFOLDER
            if not path.exists():
                raise FileNotFoundError(f"{self.model_dir} was exported without a tokenizer; use translate_ids")
            self._tokenizer = AutoTokenizer.from_pretrained(path)
        return self._tokenizer

    def translate(self, texts: Sequence[str], **overrides) -> list[str]:
        """Translate sentences with the tokenizer saved in the export."""
        source_ids = self.tokenizer(list(texts))["input_ids"]
        return self.tokenizer.batch_decode(self.translate_ids(source_ids, **overrides), skip_special_tokens=True)


__all__ = [
    "ACTIVATIONS",
    "CTranslate2Translator",
    "MissingExtraError",
    "build_spec",
    "export_ctranslate2",
    "vocabulary",
]
