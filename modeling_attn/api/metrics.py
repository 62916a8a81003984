"""BLEU, chrF and TER of detokenized translations: sacreBLEU, through the package's offline `evaluate` modules.

`evaluate.load("sacrebleu")` fetches its metric script from the Hugging Face Hub, which fails on a machine with no
network (evaluate 0.4.6: "Couldn't find a module script ... sacrebleu.py"). The package ships its own module scripts
(`modeling_attn/api/evaluate_modules/`: `sacrebleu`, `chrf`, `ter`, `multi30k_bleu`), with the Hub modules'
arguments and result keys plus sacreBLEU's `signature`. `module_path(name)` is the path `evaluate.load` takes;
`load_metric(name)` builds the same metric object directly. `translation_scores` (what `attn evaluate` prints and the
recipe's `compute_metrics` logs) computes through them: one implementation of each metric.

BLEU uses sacreBLEU's default 13a tokenization on detokenized text (Post, 2018), so scores are comparable across
tokenizers; each score's signature records its settings. TER (Snover et al., 2006, as sacreBLEU computes it:
tercom tokenization) is an edit rate: lower is better; `translation_scores` scores it case-sensitively unless
`lowercase`.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:
    import evaluate

# module script name -> the `evaluate.Metric` class it defines
MODULES = {"sacrebleu": "Sacrebleu", "chrf": "Chrf", "ter": "Ter", "multi30k_bleu": "Multi30kBleu"}
_MODULE_FOLDER = Path(__file__).resolve().with_name("evaluate_modules")
_COMPUTE_LOCK = threading.Lock()  # a metric object holds its inputs while it computes: one computation at a time


def module_path(name: str) -> str:
    """The path of the metric script `name` (one of `MODULES`), for `evaluate.load(module_path(name))`, offline."""
    if name not in MODULES:
        raise ValueError(f"no metric module {name!r}; the modules are {', '.join(MODULES)}")
    return str(_MODULE_FOLDER / f"{name}.py")


def load_metric(name: str, **kwargs) -> evaluate.EvaluationModule:
    """The metric object of module `name`, built without `evaluate.load` (which copies the script into evaluate's
    modules cache first). `kwargs` go to the constructor: evaluate's (`keep_in_memory`, `cache_dir`, ...) and the
    metric's settings, which become its defaults (`lowercase=True`). Unlike `evaluate.load`, `keep_in_memory`
    defaults to True: no cache files, so several processes can score at once."""
    module_path(name)  # the name check
    module = importlib.import_module(f"{__package__}.evaluate_modules.{name}")
    return getattr(module, MODULES[name])(**{"keep_in_memory": True, **kwargs})


@cache
def _scorers() -> tuple[evaluate.EvaluationModule, evaluate.EvaluationModule, evaluate.EvaluationModule]:
    """BLEU, chrF and TER metric objects, built once per process (`compute_metrics` runs at every evaluation)."""
    return load_metric("sacrebleu"), load_metric("chrf"), load_metric("ter")


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
    hypotheses, references = [h.strip() for h in hypotheses], [r.strip() for r in references]
    if lowercase:  # exact match too
        hypotheses, references = [h.lower() for h in hypotheses], [r.lower() for r in references]
    bleu, chrf, ter = _scorers()
    inputs = {"predictions": hypotheses, "references": references}
    with _COMPUTE_LOCK:
        bleu_result = bleu.compute(**inputs, lowercase=lowercase)
        chrf_result = chrf.compute(**inputs, lowercase=lowercase)
        ter_result = ter.compute(**inputs, case_sensitive=not lowercase)
    return {
        "bleu": bleu_result["score"],
        "chrf": chrf_result["score"],
        "ter": ter_result["score"],
        "exact_match": 100.0 * float(np.mean([h == r for h, r in zip(hypotheses, references, strict=True)])),
        "bleu_signature": bleu_result["signature"],
        "chrf_signature": chrf_result["signature"],
        "ter_signature": ter_result["signature"],
    }
