"""chrF with sacreBLEU, as an `evaluate` metric that loads offline.

chrF: Popović, 2015, "chrF: character n-gram F-score for automatic MT evaluation". Same arguments, defaults and
result keys as the Hub's `evaluate-metric/chrf`, plus `signature` (sacreBLEU's,
`nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|...`). No predictions, or an uneven number of references, is a
ValueError naming the module.
"""

from __future__ import annotations

import evaluate
from sacrebleu.metrics import CHRF

from ._common import DefaultSettings, metric_info, reference_streams, result

_CITATION = """\
@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    pages = "392--395",
}
"""

_DESCRIPTION = "Corpus chrF (chrF++ with word_order=2) with sacreBLEU, and the signature of its settings."

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): the translations, detokenized.
    references (`list` of `str`, or `list` of `list` of `str`): one reference per prediction, or the same number of
        references for each prediction.
    char_order (`int`): character n-gram order. Default 6.
    word_order (`int`): word n-gram order (2 gives chrF++). Default 0.
    beta (`int`): weight of recall against precision. Default 2.
    lowercase (`bool`): case-insensitive chrF. Default False.
    whitespace (`bool`): keep whitespace in character n-grams. Default False.
    eps_smoothing (`bool`): the smoothing of the reference implementations (chrF++.py, NLTK, Moses). Default False.
Settings given to the constructor (`evaluate.load(path, word_order=2)`) are that instance's defaults.
Returns:
    score, char_order, word_order, beta (as evaluate-metric/chrf), signature (str).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Chrf(DefaultSettings, evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS_DESCRIPTION)

    def _compute(
        self,
        predictions: list[str],
        references: list,
        char_order: int = CHRF.CHAR_ORDER,
        word_order: int = CHRF.WORD_ORDER,
        beta: int = CHRF.BETA,
        lowercase: bool = False,
        whitespace: bool = False,
        eps_smoothing: bool = False,
    ) -> dict:
        streams = reference_streams("chrf", predictions, references)
        chrf = CHRF(char_order, word_order, beta, lowercase, whitespace, eps_smoothing)  # sacreBLEU's order
        score = chrf.corpus_score(predictions, streams)
        return result(score, ("char_order", "word_order", "beta"), str(chrf.get_signature()))
