"""modeling-attn: the attention models of "Attention Is All You Need" and of classic seq2seq translation.

They are Hugging Face transformers models. Importing the package registers the model types (`registry.MODEL_TYPES`)
with transformers' Auto classes and the translation pipeline, for any encoder-decoder model, with transformers'
pipeline registry (`pipeline_translation.register_translation_pipeline` says exactly what that changes).
"""

from .configuration_rnn import AttnRNNConfig
from .configuration_transformer import AttnTransformerConfig
from .modeling_rnn import AttnRNNCache, AttnRNNForConditionalGeneration, AttnRNNModel, AttnRNNPreTrainedModel
from .modeling_transformer import (
    AttnTransformerForConditionalGeneration,
    AttnTransformerModel,
    AttnTransformerPreTrainedModel,
)
from .pipeline_translation import TranslationPipeline, register_translation_pipeline
from .registry import MODEL_TYPES, register_with_transformers

__version__ = "0.1.0"

register_with_transformers()

# transformers 5 has no translation pipeline: `pipeline("translation" | "translation_XX_to_YY", ...)` builds ours, for
# any seq2seq model (the one change to transformers' tables: pipeline_translation.register_translation_pipeline).
register_translation_pipeline()

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
]
