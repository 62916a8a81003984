"""BLEU, chrF and TER of detokenized translations, with sacreBLEU.

`evaluate.load("sacrebleu")` fetches its metric script from the Hugging Face Hub, which fails on a machine with no
network (checked with evaluate 0.4.6: "Couldn't find a module script ... sacrebleu.py"). So this module calls the
`sacrebleu` package's API directly (`BLEU`, `CHRF`, `TER`, `get_signature()`); the scores are the ones the
`evaluate` wrapper would return. BLEU uses sacreBLEU's default 13a tokenization on detokenized text (Post, 2018), so
scores are comparable across tokenizers; each score's signature records its settings. TER (Snover et al., 2006, as
sacreBLEU computes it: tercom tokenization, case-sensitive unless `lowercase`) is an edit rate: lower is better.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF, TER
from transformers import EvalPrediction, PreTrainedTokenizerBase

from .tokenizer import writes_lowercase


def translation_scores(
    hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False
) -> dict[str, float | str]:
    """Corpus BLEU, chrF and TER of `hypotheses` against one reference each, the exact-match rate, and the three
    sacreBLEU signatures (`bleu_signature`, `chrf_signature`, `ter_signature`).

    `lowercase`: case-insensitive scores (sacreBLEU's `lowercase`; the signatures then say `case:lc`), for a model
    that only writes lowercase (`writes_lowercase`).
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf, ter = BLEU(lowercase=lowercase), CHRF(lowercase=lowercase), TER(case_sensitive=not lowercase)
    hypotheses, references = [h.strip() for h in hypotheses], [r.strip() for r in references]
    if lowercase:  # exact match too
        hypotheses, references = [h.lower() for h in hypotheses], [r.lower() for r in references]
    return {
        "bleu": bleu.corpus_score(hypotheses, [references]).score,
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "ter": ter.corpus_score(hypotheses, [references]).score,
        "exact_match": 100.0 * float(np.mean([h == r for h, r in zip(hypotheses, references, strict=True)]))
        if references
        else 0.0,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "ter_signature": str(ter.get_signature()),
    }


class TranslationMetrics:
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`.

    Hypotheses are the generated ids decoded without special tokens. References are the raw target sentences of the
    dataset being evaluated (set `references` before evaluating, as `training.trainer.TranslationTrainer` does);
    without them the labels are decoded instead.
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
