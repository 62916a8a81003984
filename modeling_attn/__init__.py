"""modeling-attn: the attention models of "Attention Is All You Need" and of classic seq2seq translation.

They are Hugging Face transformers models. Importing the package registers the model types (`registry.MODEL_TYPES`)
with transformers' Auto classes and the translation pipeline, for any encoder-decoder model, with transformers'
pipeline registry (`pipeline_translation.register_translation_pipeline` says exactly what that changes).

The one exception is the `attn` command's own process: there the import does neither (torch and transformers take
seconds to import, and `attn --help`, `attn preset` and a mistyped flag need neither), and the command's parser calls
`register_models` once the command line is valid (`modeling_attn/cli/parser.py`).
"""

import sys
from pathlib import Path

__version__ = "0.1.0"

_DISPATCHER = "modeling_attn.cli.main"  # the `attn` command ([project.scripts] in pyproject.toml)


def register_models() -> None:
    """Register the model types with transformers' Auto classes and the translation pipeline with its pipeline
    registry, as importing the package does; idempotent."""
    from .pipeline_translation import register_translation_pipeline
    from .registry import register_with_transformers

    register_with_transformers()
    # transformers 5 has no translation pipeline: `pipeline("translation" | "translation_XX_to_YY", ...)` builds ours,
    # for any seq2seq model (the one change to transformers' tables: see register_translation_pipeline).
    register_translation_pipeline()


def _starting_the_attn_command() -> bool:
    """Whether Python imports the package to start the `attn` command: its console script, or `python -m
    modeling_attn.cli.main` (while Python looks for a `-m` module, sys.argv[0] is "-m")."""
    argv = getattr(sys, "argv", [])
    return Path(argv[0] if argv else "").name == "attn" or (argv[:1] == ["-m"] and _DISPATCHER in sys.orig_argv)


if not _starting_the_attn_command():
    from .configuration_rnn import AttnRNNConfig
    from .configuration_transformer import AttnTransformerConfig
    from .modeling_rnn import AttnRNNCache, AttnRNNForConditionalGeneration, AttnRNNModel, AttnRNNPreTrainedModel
    from .modeling_transformer import (
        AttnTransformerForConditionalGeneration,
        AttnTransformerModel,
        AttnTransformerPreTrainedModel,
    )
    from .pipeline_translation import TranslationPipeline
    from .registry import MODEL_TYPES

    register_models()

__all__ = [
    "AttnRNNCache",
    "AttnRNNConfig",
    "AttnRNNForConditionalGeneration",
    "AttnRNNModel",
    "AttnRNNPreTrainedModel",
    "AttnTransformerConfig",
    "AttnTransformerForConditionalGeneration",
    "AttnTransformerModel",
    "AttnTransformerPreTrainedModel",
    "MODEL_TYPES",
    "TranslationPipeline",
    "__version__",
    "register_models",
]
