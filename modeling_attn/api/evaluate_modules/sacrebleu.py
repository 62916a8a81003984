"""sacreBLEU's corpus BLEU as an `evaluate` metric that loads offline.

sacreBLEU: Post, 2018, "A Call for Clarity in Reporting BLEU Scores". Same arguments, defaults and result keys as the
Hub's `evaluate-metric/sacrebleu` (which `evaluate.load("sacrebleu")` fetches), plus `signature`: sacreBLEU's
signature of the settings (`nrefs:1|case:mixed|eff:no|tok:13a|...`), which a BLEU score needs to be comparable.
Deviation: no predictions, or an uneven number of references, is a ValueError naming the module (the Hub script
fails with an IndexError on no predictions).
"""

from __future__ import annotations

import evaluate
from sacrebleu.metrics import BLEU

from ._common import BLEU_KEYS, DefaultSettings, metric_info, reference_streams, result

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}
"""

_DESCRIPTION = "Corpus BLEU of detokenized text with sacreBLEU, and the signature of its settings."

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): the translations, detokenized.
    references (`list` of `str`, or `list` of `list` of `str`): one reference per prediction, or the same number of
        references for each prediction.
    smooth_method (`str`): 'exp' (default), 'none', 'floor' or 'add-k'.
    smooth_value (`float`): for 'floor' (default 0.1) and 'add-k' (default 1).
    tokenize (`str`): sacreBLEU's tokenizer ('13a' by default; 'none', 'intl', 'char', 'zh', ...).
    lowercase (`bool`): case-insensitive BLEU. Default False.
    force (`bool`): score text that looks tokenized without a warning. Default False.
    use_effective_order (`bool`): leave out n-gram orders with no match (for sentence BLEU). Default False.
Settings given to the constructor (`evaluate.load(path, lowercase=True)`) are that instance's defaults.
Returns:
    score, counts, totals, precisions, bp, sys_len, ref_len (as evaluate-metric/sacrebleu), signature (str).
Example:
    >>> bleu = evaluate.load(modeling_attn.api.metrics.module_path("sacrebleu"))
    >>> bleu.compute(predictions=["the cat sat on the mat"], references=["the cat sat on the mat"])["score"]
    100.00000000000004
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Sacrebleu(DefaultSettings, evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS_DESCRIPTION)

    def _compute(
        self,
        predictions: list[str],
        references: list,
        smooth_method: str = "exp",
        smooth_value: float | None = None,
        force: bool = False,
        lowercase: bool = False,
        tokenize: str | None = None,
        use_effective_order: bool = False,
    ) -> dict:
        streams = reference_streams("sacrebleu", predictions, references)
        bleu = BLEU(lowercase, force, tokenize, smooth_method, smooth_value, effective_order=use_effective_order)
        score = bleu.corpus_score(predictions, streams)
        return result(score, BLEU_KEYS, str(bleu.get_signature()))
