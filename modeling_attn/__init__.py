"""modeling-attn: the attention models of "Attention Is All You Need" and of classic seq2seq translation,
as Hugging Face transformers models.

Importing the package registers the model types with transformers' Auto classes.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
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

__version__ = "0.1.0"

AutoConfig.register(AttnTransformerConfig.model_type, AttnTransformerConfig)
AutoModel.register(AttnTransformerConfig, AttnTransformerModel)
AutoModelForSeq2SeqLM.register(AttnTransformerConfig, AttnTransformerForConditionalGeneration)
# save_pretrained copies the code files and writes `auto_map`, so checkpoints load with trust_remote_code.
AttnTransformerConfig.register_for_auto_class()
AttnTransformerModel.register_for_auto_class("AutoModel")
AttnTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

AutoConfig.register(AttnRNNConfig.model_type, AttnRNNConfig)
AutoModel.register(AttnRNNConfig, AttnRNNModel)
AutoModelForSeq2SeqLM.register(AttnRNNConfig, AttnRNNForConditionalGeneration)
AttnRNNConfig.register_for_auto_class()
AttnRNNModel.register_for_auto_class("AutoModel")
AttnRNNForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

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
    "TranslationPipeline",
    "__version__",
]
