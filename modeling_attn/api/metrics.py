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
from transformers import PreTrainedTokenizerBase


def writes_lowercase(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer lowercases all text (`lowercase=True`), so that its model writes only lowercase."""
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)  # None: slow tokenizers
    return normalizer is not None and normalizer.normalize_str("AB") == "ab"


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
