"""What the metric scripts beside this file share: input features and info, references, defaults, the result.

References are one string per prediction, or a list of strings per prediction (the same number for each), as the
Hub's sacreBLEU-based modules take them; sacreBLEU wants one stream per reference position instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import datasets
import evaluate

# One reference per prediction, or several: the two input layouts every module here accepts.
FEATURES = [
    datasets.Features(
        {
            "predictions": datasets.Value("string", id="sequence"),
            "references": datasets.Sequence(datasets.Value("string", id="sequence"), id="references"),
        }
    ),
    datasets.Features(
        {"predictions": datasets.Value("string", id="sequence"), "references": datasets.Value("string", id="sequence")}
    ),
]

SACREBLEU_URL = "https://github.com/mjpost/sacrebleu"


def metric_info(
    description: str,
    citation: str,
    inputs_description: str,
    homepage: str = SACREBLEU_URL,
    codebase_urls: Sequence[str] = (SACREBLEU_URL,),
) -> evaluate.MetricInfo:
    """The `_info()` of a metric here: its texts, the two input layouts, where its code lives."""
    return evaluate.MetricInfo(
        description=description,
        citation=citation,
        inputs_description=inputs_description,
        features=FEATURES,
        homepage=homepage,
        codebase_urls=list(codebase_urls),
    )


# The result keys of evaluate-metric/sacrebleu besides `score`.
BLEU_KEYS = ("counts", "totals", "precisions", "bp", "sys_len", "ref_len")


def result(score: Any, keys: Sequence[str], signature: str) -> dict[str, Any]:
    """A sacreBLEU score object as the Hub module's result: `score`, the attributes `keys`, then `signature`."""
    return {"score": score.score, **{key: getattr(score, key) for key in keys}, "signature": signature}


# The keyword arguments `evaluate.EvaluationModule.__init__` names (what `evaluate.load` passes on).
_MODULE_ARGUMENTS = set(inspect.signature(evaluate.EvaluationModule.__init__).parameters) - {"self", "kwargs"}


def reference_streams(name: str, predictions: Sequence[str], references: Sequence[Any]) -> list[list[str]]:
    """sacreBLEU's reference streams (stream i holds every prediction's i-th reference); ValueError naming `name`
    for no predictions or an uneven number of references."""
    if not predictions:
        raise ValueError(f"{name}: no predictions to score")
    if len(predictions) != len(references):
        raise ValueError(f"{name}: {len(predictions)} predictions but {len(references)} references")
    per_prediction = [[reference] if isinstance(reference, str) else list(reference) for reference in references]
    counts = sorted({len(group) for group in per_prediction})
    if counts[0] == 0 or len(counts) > 1:
        raise ValueError(f"{name}: every prediction needs the same number (>= 1) of references; got {counts}")
    return [[group[i] for group in per_prediction] for i in range(counts[0])]


class DefaultSettings:
    """Mixin for an `evaluate.Metric`: keyword arguments of the constructor (hence of
    `evaluate.load(path, lowercase=True)`) that name `_compute` settings become that instance's defaults, so that an
    `evaluate` evaluator, which passes no settings, scores with them; a setting given to `compute` wins. Any other
    unknown keyword is a TypeError (evaluate's own constructor would drop it silently)."""

    def __init__(self, **kwargs: Any) -> None:
        settings = set(inspect.signature(self._compute).parameters) - {"predictions", "references"}
        unknown = sorted(set(kwargs) - settings - _MODULE_ARGUMENTS)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown arguments {unknown}; its settings are {sorted(settings)}")
        self.default_settings = {name: kwargs.pop(name) for name in list(kwargs) if name in settings}
        super().__init__(**kwargs)

    def compute(self, *, predictions=None, references=None, **kwargs: Any) -> dict[str, Any] | None:
        """The scores of `predictions` against `references` (see below), with this instance's default settings
        updated by `kwargs`.
        """  # evaluate appends the module's inputs description to this docstring
        if predictions is not None and len(predictions) == 0:  # evaluate itself fails with an IndexError
            raise ValueError(f"{self.name}: no predictions to score")
        return super().compute(predictions=predictions, references=references, **{**self.default_settings, **kwargs})
