"""TER, the translation edit rate, with sacreBLEU's tercom reimplementation, as an offline `evaluate` metric.

TER: Snover et al., 2006, "A Study of Translation Edit Rate with Targeted Human Annotation". Same arguments,
defaults and result keys as the Hub's `evaluate-metric/ter`, plus `signature` (`nrefs:1|case:lc|tok:tercom|...`).
As there and in sacreBLEU, the default is case-insensitive (`case_sensitive=False`); `attn evaluate` passes
`case_sensitive=True` unless it scores a lowercasing model. An edit rate: lower is better. No predictions, or an
uneven number of references, is a ValueError naming the module.
"""

from __future__ import annotations

import evaluate
from sacrebleu.metrics import TER

from ._common import DefaultSettings, metric_info, reference_streams, result

_CITATION = """\
@inproceedings{snover-etal-2006-study,
    title = "A Study of Translation Edit Rate with Targeted Human Annotation",
    author = "Snover, Matthew and Dorr, Bonnie and Schwartz, Rich and Micciulla, Linnea and Makhoul, John",
    booktitle = "Proceedings of the 7th Conference of the Association for Machine Translation in the Americas",
    year = "2006",
    pages = "223--231",
}
"""

_DESCRIPTION = "Corpus TER (tercom's algorithm as sacreBLEU implements it), and the signature of its settings."

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): the translations, detokenized.
    references (`list` of `str`, or `list` of `list` of `str`): one reference per prediction, or the same number of
        references for each prediction.
    normalized (`bool`): tercom's normalization and tokenization. Default False.
    ignore_punct (`bool`): remove punctuation first. Default False.
    support_zh_ja_chars (`bool`): split Chinese and Japanese characters (with `normalized`). Default False.
    case_sensitive (`bool`): count case differences as edits. Default False, as in evaluate-metric/ter.
Settings given to the constructor (`evaluate.load(path, case_sensitive=True)`) are that instance's defaults.
Returns:
    score, num_edits, ref_length (as evaluate-metric/ter), signature (str).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Ter(DefaultSettings, evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS_DESCRIPTION)

    def _compute(
        self,
        predictions: list[str],
        references: list,
        normalized: bool = False,
        ignore_punct: bool = False,
        support_zh_ja_chars: bool = False,
        case_sensitive: bool = False,
    ) -> dict:
        streams = reference_streams("ter", predictions, references)
        ter = TER(
            normalized=normalized,
            no_punct=ignore_punct,
            asian_support=support_zh_ja_chars,
            case_sensitive=case_sensitive,
        )
        score = ter.corpus_score(predictions, streams)
        return result(score, ("num_edits", "ref_length"), str(ter.get_signature()))
