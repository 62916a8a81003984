"""BLEU on lowercased, Moses-tokenized text, as the published Multi30k numbers are computed, as an `evaluate` metric.

It loads offline and needs `sacremoses`, the Python port of the Moses scripts. The Multi30k repository builds its
`*.lc.norm.tok.*` files with Moses' `lowercase.perl | normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG`
(XML escaping on, no `-a`), and papers score their output on those files with Moses' `multi-bleu.perl`. Here:
- `lowercase_tokenize` does the same three steps with `sacremoses` (`str.lower()`, `MosesPunctNormalizer(lang)`,
  `MosesTokenizer(lang).tokenize(escape=True)`), on the predictions and the raw references alike;
- `multi_bleu` is `multi-bleu.perl` on the tokens: corpus BLEU-4, tokens split on whitespace, no smoothing, the
  brevity penalty; that is sacreBLEU's `BLEU(tokenize="none", smooth_method="none")`, which this calls.

Escaping (`'` -> `&apos;`) maps tokens one to one, so BLEU is the same with or without it; it is kept only to
reproduce the reference files byte for byte. `bench/multi30k/bleu.py` calls these functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import evaluate
from sacrebleu.metrics import BLEU
from sacrebleu.metrics.bleu import BLEUScore
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from ._common import BLEU_KEYS, SACREBLEU_URL, DefaultSettings, metric_info, reference_streams, result

_CITATION = """\
@inproceedings{elliott-etal-2016-multi30k,
    title = "{M}ulti30{K}: Multilingual {E}nglish-{G}erman Image Descriptions",
    author = "Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia",
    booktitle = "Proceedings of the 5th Workshop on Vision and Language",
    year = "2016",
    pages = "70--74",
}
"""

_DESCRIPTION = "multi-bleu.perl BLEU on lowercased, punctuation-normalized, Moses-tokenized text (Multi30k's way)."

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): the translations, raw (detokenized, cased).
    references (`list` of `str`, or `list` of `list` of `str`): raw references, the same number per prediction.
    lang (`str`): the target language code for the Moses rules (en, de, fr, cs). Required.
Settings given to the constructor (`evaluate.load(path, lang="de")`) are that instance's defaults.
Returns:
    score, counts, totals, precisions, bp, sys_len, ref_len (as evaluate-metric/sacrebleu), signature (str: the
    preprocessing in words, then sacreBLEU's signature, tok:none and smooth:none).
"""


@cache
def _moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer]:
    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def lowercase_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """`lowercase.perl | normalize-punctuation.perl -l lang | tokenizer.perl -l lang` of each line."""
    normalizer, tokenizer = _moses(lang)
    return [
        tokenizer.tokenize(normalizer.normalize(line.strip().lower()), escape=True, return_str=True) for line in lines
    ]


def multi_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[BLEUScore, str]:
    """`multi-bleu.perl` of already tokenized lines (one reference each): corpus BLEU-4, no smoothing.

    Returns the score and sacreBLEU's signature of the settings."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("no hypotheses to score")
    return _multi_bleu(list(hypotheses), [list(references)])


def _multi_bleu(hypotheses: list[str], streams: list[list[str]]) -> tuple[BLEUScore, str]:
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score(hypotheses, streams), str(metric.get_signature())


def _signature(lang: str, settings: str) -> str:
    return f"lc+moses-norm+moses-tok({lang},escape,no -a) [sacremoses]|{settings}"


def lowercased_tokenized_bleu(
    hypotheses: Sequence[str], references: Sequence[str], lang: str
) -> tuple[BLEUScore, str]:
    """BLEU of raw (detokenized, cased) hypotheses against raw references, on lowercased Moses tokens.

    Returns the score and a signature: the preprocessing in words, then sacreBLEU's (tok:none, smooth:none)."""
    score, settings = multi_bleu(lowercase_tokenize(hypotheses, lang), lowercase_tokenize(references, lang))
    return score, _signature(lang, settings)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Multi30kBleu(DefaultSettings, evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return metric_info(
            _DESCRIPTION,
            _CITATION,
            _KWARGS_DESCRIPTION,
            homepage="https://github.com/multi30k/dataset",
            codebase_urls=["https://github.com/hplt-project/sacremoses", SACREBLEU_URL],
        )

    def _compute(self, predictions: list[str], references: list, lang: str | None = None) -> dict:
        if not lang:
            raise ValueError("multi30k_bleu: give lang, the target language code for the Moses rules (en, de, fr)")
        streams = reference_streams("multi30k_bleu", predictions, references)
        tokenized = [lowercase_tokenize(stream, lang) for stream in streams]
        score, settings = _multi_bleu(lowercase_tokenize(predictions, lang), tokenized)
        return result(score, BLEU_KEYS, _signature(lang, settings))
