"""modeling-attn: the attention models of "Attention Is All You Need" and of classic seq2seq translation,
as Hugging Face transformers models.

Importing the package registers the model types (`registry.MODEL_TYPES`) with transformers' Auto classes and
the translation pipeline with transformers' pipeline registry.
"""

from transformers import AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_rnn import AttnRNNConfig
from .configuration_transformer import AttnTransformerConfig
from .modeling_rnn import AttnRNNCache, AttnRNNForConditionalGeneration, AttnRNNModel, AttnRNNPreTrainedModel
from .modeling_transformer import (
    AttnTransformerForConditionalGeneration,
    AttnTransformerModel,
    AttnTransformerPreTrainedModel,
)
from .pipeline_translation import TranslationPipeline
from .registry import MODEL_TYPES, register_with_transformers

__version__ = "0.1.0"

register_with_transformers()

# transformers 5 has no translation pipeline; ours goes into config.custom_pipelines of every saved model
# (remote_code.save_with_remote_code) and of save_for_hub folders, which need this registration.
PIPELINE_REGISTRY.register_pipeline(
    "translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)

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
