"""`compute_metrics` for the recipe's Trainer: BLEU, chrF and TER of the translations of an evaluation set.

The scores are those of `modeling_attn.api.metrics` (sacreBLEU), on the generated translations.
"""

from __future__ import annotations

import numpy as np
from transformers import EvalPrediction, PreTrainedTokenizerBase

from modeling_attn.api.metrics import translation_scores, writes_lowercase


class TranslationMetrics:
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`.

    Hypotheses are the generated ids decoded without special tokens. References are the raw target sentences of the
    dataset being evaluated (set `references` before evaluating, as
    `modeling_attn.training.trainer.TranslationTrainer` does); without them the labels are decoded instead.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.lowercase = writes_lowercase(tokenizer)  # a lowercasing model is scored case-insensitively
        self.references: list[str] | None = None
        self.last_hypotheses: list[str] = []

    def decode(self, ids: np.ndarray) -> list[str]:
        ids = np.where(ids < 0, self.tokenizer.pad_token_id, ids)  # -100 from label padding / cross-process gathers
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def __call__(self, prediction: EvalPrediction) -> dict[str, float]:
        predictions = (
            prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        )
        hypotheses = self.decode(predictions)
        references = self.references if self.references is not None else self.decode(prediction.label_ids)
        # Multi-process evaluation pads the last batches with repeats of the first examples so that every process
        # gets full batches; the gather did not drop them here when the evaluation set was smaller than one batch
        # per process (2 CPU processes, accelerate 1.15). They always come after the real examples: cut them.
        hypotheses = hypotheses[: len(references)]
        self.last_hypotheses = hypotheses
        scores = translation_scores(hypotheses, references, lowercase=self.lowercase)
        # Trainer logs numbers only; the signatures are written with the final test results.
        return {name: value for name, value in scores.items() if isinstance(value, float)}
