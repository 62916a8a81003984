"""The names flags choose from (modeling_attn/api/choices.py) are the names the modules that act on them know."""

from __future__ import annotations

from modeling_attn.api import (
    alignment,
    choices,
    engines,
    ensemble,
    explain_attention,
    export_ctranslate2,
    heatmaps,
    quantize,
)


def test_each_module_acts_on_the_names_its_flags_offer():
    # a guard against a module declaring its own copy again (each imports its names from choices.py)
    assert engines.ENGINES == choices.ENGINES
    assert (alignment.ALIGN_FORMATS, alignment.WORD_PATTERNS) == (choices.ALIGN_FORMATS, choices.WORD_PATTERNS)
    assert ensemble.COMBINATIONS == choices.COMBINATIONS
    assert (quantize.QUANTIZE_CHOICES, quantize.INT8_ENGINES) == (choices.QUANTIZE_CHOICES, choices.INT8_ENGINES)
    assert (heatmaps.ALIGNMENT_MODES, heatmaps.STACKS) == (choices.ALIGNMENT_MODES, choices.STACKS)
    assert explain_attention.ATTENTION_KINDS == choices.ATTENTION_KINDS
    assert export_ctranslate2.QUANTIZATIONS == choices.QUANTIZATIONS
