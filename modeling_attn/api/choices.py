"""The names flags choose from, declared here without torch so that a command builds its parser without loading one.

Each belongs to the module that acts on it, which imports it from here: a command's `--help` and a value that is not
one of the choices then answer without importing torch or transformers (`modeling_attn/cli/parser.py`).
"""

from __future__ import annotations

import re

# `--engine` (modeling_attn.api.engines)
ENGINES = ("auto", "torch", "ctranslate2", "onnxruntime")
# `--ensemble_combine` (modeling_attn.api.ensemble)
COMBINATIONS = ("log_linear", "linear")
# `--quantize` and `--int8_engine` (modeling_attn.api.quantize); torch builds have some of the int8 engines
QUANTIZE_CHOICES = ("int8", "int8_rowwise")
INT8_ENGINES = ("auto", "x86", "fbgemm", "onednn", "qnnpack")
# `--align_format`, and what a word is for `--align_words` (modeling_attn.api.alignment)
ALIGN_FORMATS = ("hard", "soft")
WORD_PATTERNS = {"whitespace": re.compile(r"\S+"), "alnum": re.compile(r"[^\w\s]*\w+[^\w\s]*|[^\w\s]+")}
# `--attention_mode` and the self-attention stacks pictured (modeling_attn.api.heatmaps)
ALIGNMENT_MODES = ("average", "layers")
STACKS = ("encoder", "decoder")
# `attn explain --walkthrough` (modeling_attn.api.explain_attention)
ATTENTION_KINDS = ("cross", "encoder", "decoder")
# `attn score --format`: a JSON object a line, or tab-separated columns (modeling_attn.cli.score)
SCORE_FORMATS = ("jsonl", "tsv")
# `attn export --quantization`: CTranslate2's compute types (modeling_attn.api.export_ctranslate2)
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16")

__all__ = [
    "ALIGNMENT_MODES",
    "ALIGN_FORMATS",
    "ATTENTION_KINDS",
    "COMBINATIONS",
    "ENGINES",
    "INT8_ENGINES",
    "QUANTIZATIONS",
    "QUANTIZE_CHOICES",
    "SCORE_FORMATS",
    "STACKS",
    "WORD_PATTERNS",
]
