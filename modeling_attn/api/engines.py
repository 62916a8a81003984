"""Engines behind one translating API: `open_engine(model, tokenizer, engine="auto", ...)` and `load_translator(path)`.

An engine translates sentences with a model: `translate_batch(sentences, **options)`, `translate_nbest(sentences,
n, **options)` (scored hypotheses, best first), `translate_aligned(...)` (with word alignments); `options` are
generate()'s keyword arguments as the commands give them (`translation.generation_overrides`), the model's
generation config supplies the rest, on every engine alike. `torch` is the model itself (every model type,
ensembles, attention weights, any device); `ctranslate2` and `onnxruntime` decode an export of an attn_transformer
made once per weights and kept (`export_cache`); `auto` (the default) takes the fastest installed engine that can run
the model and gives the torch engine's translations (`AutoEngine`: what the fast engine lacks, and sampling, run on
torch). A named engine refuses what it cannot do in one line naming itself and the setting (`EngineError`).
docs/export.md, "Engines", says what each engine has and why; each engine holds the torch model it was opened with
(`engine.model`), and `engine.describe(options)` and `engine.label_for(options)` say which engine runs a request with
those options (under auto, and why). `translate_streamed(sentence, on_token, **options)` hands on each token as it is
chosen where `can_stream(options)` (greedy search or sampling, on torch and CTranslate2: `streaming.py`).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from .. import __version__
from ..generation import per_sentence_offset, sentence_limits
from .choices import ENGINES
from .errors import ExportError, FlagError
from .export_cache import ExportCacheError
from .scoring import Score, end_token_id, prepare_pairs, score_pairs, scored_in_batches, scores_of
from .threads import ctranslate2_threads, onnxruntime_threads, split_size, torch_threads, torch_threads_for
from .translation import (
    REPETITION_OPTIONS,
    Hypothesis,
    check_nbest,
    check_prefixes,
    check_source_lengths,
    eager_attention,
    for_rows,
    sequence_scores,
    target_ids,
    translate_batch,
    translate_nbest,
    translation_limits,
)

logger = logging.getLogger(__name__)

# auto's order of preference among the engines that can serve a request (torch serves every request).
FAST_ENGINES = ("ctranslate2",)
PACKAGES = {"ctranslate2": ("ctranslate2", "fast"), "onnxruntime": ("onnxruntime", "onnx")}
# The sampling settings: applied by ctranslate2 (its own random stream), refused by onnxruntime, and under auto run
# on torch. The model's other generation settings away from their inert values (onnx_generation.UNSUPPORTED, and for
# ctranslate2 the minimum lengths, which it does not map) make an export engine refuse the model, by name.
SAMPLING_OPTIONS = ("do_sample", "top_k", "top_p", "temperature")
UNMAPPED_BY_CTRANSLATE2 = {"min_length": 0, "min_new_tokens": None}
# The per-call limits that CTranslate2 applies before renormalizing a step's probabilities and transformers after: in
# a beam search the translations differ (greedy: the same), so under auto a beam search with one runs on torch.
BEAM_LIMITS = (*REPETITION_OPTIONS, "bad_words")
CTRANSLATE2_NAMES = {"min_new_tokens": "min_decoding_length"}  # CTranslate2's names of generate()'s options
# The translate_batch options (`CTranslate2Engine._options`) that CTranslate2's `generate_tokens` takes too.
GENERATE_TOKENS_OPTIONS = (
    "max_decoding_length",
    "min_decoding_length",
    "sampling_topk",
    "sampling_topp",
    "sampling_temperature",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "suppress_sequences",
    "end_token",
    "max_input_length",
)
# What an engine lacking a per-call option says it has not (the option's flag named).
OPTION_NAMES = {
    "target_prefix": "target prefixes (--prefix, --prefix_file)",
    "bad_words": "banned words (--bad_words)",
    "constraints": "constraints (--constraints/--glossary)",
    "no_repeat_ngram_size": "n-gram repetition limits (--no_repeat_ngram_size)",
    "repetition_penalty": "repetition penalties (--repetition_penalty)",
    "min_new_tokens": "minimum lengths (--min_new_tokens)",
}


class EngineError(FlagError):
    """An engine that cannot do what was asked (not installed, a model type, a setting); the message names the
    engine and the flag or setting, and the engine that can."""


def _refused(engine: str, reason: str) -> EngineError:
    return EngineError(f"--engine {engine}: {engine} {reason}; use --engine torch (or auto)")


def installed(engine: str) -> bool:
    """Whether the package `engine` needs is installed (torch always is)."""
    return engine == "torch" or importlib.util.find_spec(PACKAGES[engine][0]) is not None


def model_refusal(engine: str, model: PreTrainedModel, device: torch.device, quantize: str | None) -> str | None:
    """Why `engine` cannot run `model` at all (None: it can), as the end of "ENGINE ..." ("has no ...")."""
    if engine == "torch":
        return None
    if not installed(engine):
        package, extra = PACKAGES[engine]
        return f'is not installed (pip install "modeling-attn[{extra}]" installs {package})'
    members = getattr(model, "members", None)
    if isinstance(members, torch.nn.ModuleList):
        return f"has no ensembles (an ensemble of {len(members)} models was given)"
    if model.config.model_type != "attn_transformer":
        return f"has no {model.config.model_type} models (only attn_transformer)"
    if quantize not in (None, "int8"):
        return f"has no --quantize {quantize}"
    if engine == "onnxruntime" and quantize is not None:
        return "has no --quantize int8 here (the ONNX export is float32)"
    if device.type not in (("cpu", "cuda") if engine == "ctranslate2" else ("cpu",)):
        return f"does not run on {device.type} devices"
    unmapped = {**_unsupported_settings(), **(UNMAPPED_BY_CTRANSLATE2 if engine == "ctranslate2" else {})}
    if engine == "ctranslate2":
        del unmapped["bad_words_ids"]  # `CTranslate2Translator.options`: suppress_sequences
    for name, inert in unmapped.items():
        sampling = engine == "ctranslate2" and name in SAMPLING_OPTIONS  # mapped (`CTranslate2Engine._options`)
        if not sampling and getattr(model.generation_config, name, None) not in (None, inert, []):
            return f"does not apply the model's generation_config.{name}={getattr(model.generation_config, name)!r}"
    return None


def _unsupported_settings() -> dict[str, Any]:
    from .onnx_generation import UNSUPPORTED

    return UNSUPPORTED


def _seed_torch(seed: int) -> None:
    from transformers import set_seed

    set_seed(seed)


def _threads_for(model: PreTrainedModel, given: int | None, sentences: list[str], n: int, options: dict[str, Any]):
    """torch's threads for a call on `sentences` (`threads.torch_threads_for`: by its decoder rows, sentences x the
    beams or returned sequences, unless the user gave a number) as a context."""
    beams = options.get("num_beams") or model.generation_config.num_beams or 1
    return torch_threads(torch_threads_for(len(sentences) * max(beams, n), given))


class TorchEngine:
    """The model itself (the module docstring); `model` may be an `AttnEnsemble`, quantized. `threads`: torch's
    intra-op threads for every call; None: by each call's size (`threads.torch_threads_for`)."""

    name = "torch"

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        threads: int | None = None,
        why: str | None = None,
    ):
        self.model, self.tokenizer, self.threads = model, tokenizer, threads
        self.why = why  # opened by auto after a faster engine could not be used: why (`open_engine`)

    def refusal(self, options: dict[str, Any], alignments: bool = False) -> str | None:
        return None

    def check(self, options: dict[str, Any], alignments: bool = False) -> None:
        pass

    def seed(self, seed: int) -> None:
        """Seed the random draws of sampling (`--seed`): the same seed, the same samples."""
        _seed_torch(seed)

    def translate_batch(self, sentences: list[str], **options: Any) -> list[str]:
        n = options.get("num_return_sequences") or 1
        with _threads_for(self.model, self.threads, sentences, n, options):
            return translate_batch(self.model, self.tokenizer, sentences, **options)[0]

    def translate_nbest(self, sentences: list[str], n: int = 1, **options: Any) -> list[list[Hypothesis]]:
        with _threads_for(self.model, self.threads, sentences, n, options):
            return translate_nbest(self.model, self.tokenizer, sentences, n, **options)

    def can_stream(self, options: dict[str, Any]) -> bool:
        """Whether `translate_streamed` gives the tokens as they come with `options`: greedy search or sampling
        (beam search finishes its hypotheses at the end; constrained search is a beam search)."""
        beams = options.get("num_beams") or self.model.generation_config.num_beams or 1
        return beams == 1 and not options.get("constraints")

    def translate_streamed(self, sentence: str, on_token: Callable[[int], None], **options: Any) -> Hypothesis:
        """`translate_nbest([sentence], 1, **options)`'s hypothesis, `on_token(id)` called with each token as it is
        chosen (generate()'s `streamer`, which `fast_generation` feeds too: the same tokens)."""
        from .streaming import TokenCallback

        with _threads_for(self.model, self.threads, [sentence], 1, options):
            streamer = TokenCallback(on_token)
            return translate_nbest(self.model, self.tokenizer, [sentence], 1, streamer=streamer, **options)[0][0]

    def translate_aligned(self, sentences: list[str], words: str = "whitespace", **options: Any):
        from .alignment import translate_aligned

        with eager_attention(self.model), _threads_for(self.model, self.threads, sentences, 1, options):
            return translate_aligned(self.model, self.tokenizer, sentences, words=words, **options)

    def translate_aligned_nbest(self, sentences: list[str], n: int = 1, words: str = "whitespace", **options: Any):
        from .alignment import translate_aligned_nbest

        with eager_attention(self.model), _threads_for(self.model, self.threads, sentences, n, options):
            return translate_aligned_nbest(self.model, self.tokenizer, sentences, n, words=words, **options)

    def score(self, sources: list[str], targets: list[str], batch_size: int = 32) -> list[Score]:
        """Each target's `scoring.Score` given its source (teacher-forced), `batch_size` pairs a forward."""
        return scored_in_batches(self._score_batch, sources, targets, batch_size)

    def _score_batch(self, sources: list[str], targets: list[str]) -> list[Score]:
        with torch_threads(torch_threads_for(len(sources), self.threads)):
            return score_pairs(self.model, self.tokenizer, sources, targets)

    def describe(self, options: dict[str, Any] | None = None, alignments: bool = False) -> dict[str, Any]:
        """The engine that runs a request with `options` (`alignments`: with word alignments), as `attn evaluate`'s
        JSON and `attn serve`'s `GET /model` name it."""
        if self.why is None:
            return {"engine": self.name}
        return {"engine": self.name, "chosen_by": "auto", "why": self.why}

    def label_for(self, options: dict[str, Any] | None = None, alignments: bool = False) -> str:
        """The engine that runs a request with `options`, as a progress bar names it."""
        return self.name if self.why is None else f"{self.name} (auto)"

    @property
    def label(self) -> str:
        """`label_for` a request with no options."""
        return self.label_for()


class _ExportEngine:
    """What the export engines share: the sources as token ids (empty sentences kept out, lengths checked as the
    torch engine checks them), the options checked against what the engine applies."""

    name = ""
    sampling = False
    alignments = False  # word alignments (`translate_aligned`), from the attention the engine returns
    options: tuple[str, ...] = ("num_beams", "length_penalty", "max_new_tokens")  # the per-call options it applies

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, export: Path, threads: int | None):
        self.model, self.tokenizer, self.export, self.threads = model, tokenizer, export, threads

    def refusal(self, options: dict[str, Any], alignments: bool = False) -> str | None:
        if alignments and not self.alignments:
            return "has no word alignments (--align)"
        if options.get("do_sample") and not self.sampling:
            return "has no sampling (--do_sample)"
        if unknown := sorted(set(options) - {*self.options, *SAMPLING_OPTIONS}):
            name = unknown[0]
            return f"has no {OPTION_NAMES[name]}" if name in OPTION_NAMES else f"does not apply the setting {name}"
        return None

    def check(self, options: dict[str, Any], alignments: bool = False) -> None:
        """EngineError naming this engine and the setting it cannot apply (before any work)."""
        if (reason := self.refusal(options, alignments)) is not None:
            raise _refused(self.name, reason)

    def seed(self, seed: int) -> None:
        _seed_torch(seed)  # what the engine's torch model samples with (n-best scoring, onnxruntime's search)

    def _sources(self, sentences: list[str], options: dict[str, Any]) -> tuple[list[int], list[list[int]]]:
        """The rows of the non-empty sentences and their token ids (SentenceTooLong for one too long)."""
        rows = [row for row, sentence in enumerate(sentences) if sentence.strip()]
        texts = [sentences[row] for row in rows]
        ids = self.tokenizer(texts, return_token_type_ids=False)["input_ids"] if rows else []
        check_source_lengths(self.model.config, [len(i) for i in ids], sentences, rows, options)
        return rows, ids

    def translate_batch(self, sentences: list[str], **options: Any) -> list[str]:
        return [block[0].text for block in self._nbest(sentences, 1, scored=False, **options)]

    def translate_nbest(self, sentences: list[str], n: int = 1, **options: Any) -> list[list[Hypothesis]]:
        check_nbest(self.model, n, options)
        return self._nbest(sentences, n, scored=True, **options)

    def can_stream(self, options: dict[str, Any]) -> bool:
        return False

    def translate_streamed(self, sentence: str, on_token: Callable[[int], None], **options: Any) -> Hypothesis:
        raise _refused(self.name, "does not stream tokens")

    def translate_aligned(self, sentences: list[str], words: str = "whitespace", **options: Any):
        self.check(options, alignments=True)

    def translate_aligned_nbest(self, sentences: list[str], n: int = 1, words: str = "whitespace", **options: Any):
        self.check(options, alignments=True)

    def _nbest(self, sentences: list[str], n: int, scored: bool, **options: Any) -> list[list[Hypothesis]]:
        self.check(options)
        hypotheses = [[Hypothesis("", float("nan"))] * n for _ in sentences]
        rows, ids = self._sources(sentences, options)
        if not rows:
            return hypotheses
        with _threads_for(self.model, self.threads, sentences, n, options):  # the torch model's scoring
            found = self._decode(ids, n, scored, for_rows(options, rows))  # per row: n (target ids, score or None)
        for row, block in zip(rows, found, strict=True):
            texts = self.tokenizer.batch_decode([target for target, _ in block], skip_special_tokens=True)
            block = [Hypothesis(text, score) for text, (_, score) in zip(texts, block, strict=True)]
            hypotheses[row] = sorted(block, key=lambda hypothesis: -hypothesis.score) if scored else block
        return hypotheses

    def _decode(self, ids: list[list[int]], n: int, scored: bool, options: dict[str, Any]):
        raise NotImplementedError

    def _length_penalty(self, options: dict[str, Any]) -> float:
        penalty = options.get("length_penalty", self.model.generation_config.length_penalty)
        return 1.0 if penalty is None else float(penalty)

    def describe(self, options: dict[str, Any] | None = None, alignments: bool = False) -> dict[str, Any]:
        return {"engine": self.name, "export": str(self.export)}

    def label_for(self, options: dict[str, Any] | None = None, alignments: bool = False) -> str:
        return self.name

    @property
    def label(self) -> str:
        return self.label_for()


class CTranslate2Engine(_ExportEngine):
    """CTranslate2's decoder on the export in `export` (module docstring). `compute_type`: "default" (the export's
    float32) or "int8" (`--quantize int8`: CTranslate2 quantizes the weights as it loads them)."""

    name = "ctranslate2"
    sampling = True
    alignments = True  # `return_attention`: the export's alignment layer and heads, as `selected_attention`
    options = (*_ExportEngine.options, *REPETITION_OPTIONS, "bad_words", "target_prefix")

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        export: Path,
        device: torch.device,
        compute_type: str = "default",
        threads: int | None = None,
    ):
        from .export_ctranslate2 import CTranslate2Translator

        super().__init__(model, tokenizer, export, threads)
        self.compute_type = compute_type
        # `threads.ctranslate2_threads`: the user's number of threads on one worker, else a worker of one thread per
        # core, each call's sentences shared out between them (`_split`)
        intra_threads, self.workers = ctranslate2_threads(threads) if device.type == "cpu" else (threads or 0, 1)
        self._open = lambda: CTranslate2Translator(
            export,
            device=device.type,
            device_index=device.index or 0,
            compute_type=compute_type,
            intra_threads=intra_threads,
            inter_threads=self.workers,
        )
        self.translator = self._open()
        self.ends = set(self.translator.options().get("end_token", []))

    def seed(self, seed: int) -> None:
        """CTranslate2 seeds a worker thread's random generator when the thread first samples, from the seed set
        then (`ctranslate2.set_random_seed`); so the translator is opened again after the seed is set."""
        import ctranslate2

        super().seed(seed)
        ctranslate2.set_random_seed(seed)
        self.translator = self._open()

    def _options(self, lengths: list[int], limits: list[int] | None, n: int, options: dict[str, Any]) -> dict:
        """CTranslate2's translate_batch arguments for these sources (`lengths`, their own `limits`) and generate()
        options."""
        config = self.model.generation_config
        given = {} if options.get("max_new_tokens") is None else {"max_decoding_length": options["max_new_tokens"]}
        ct2 = self.translator.options(lengths, **given)
        if limits is not None:
            ct2["max_decoding_length"] = max(limits)  # the batch's longest; `_decode` keeps each sentence to its own
        if options.get("num_beams") is not None:
            ct2["beam_size"] = options["num_beams"]
        ct2["length_penalty"] = self._length_penalty(options)
        ct2["num_hypotheses"] = n
        for name in REPETITION_OPTIONS:
            if options.get(name) is not None:
                ct2[CTRANSLATE2_NAMES.get(name, name)] = options[name]
        tokens = self.translator.target_tokens
        if options.get("bad_words"):
            banned = [[tokens[i] for i in ids] for ids in target_ids(self.tokenizer, list(options["bad_words"]))]
            ct2["suppress_sequences"] = [*ct2.get("suppress_sequences", []), *banned]
        if any(options.get("target_prefix") or []):
            prefixes = target_ids(self.tokenizer, [prefix or "" for prefix in options["target_prefix"]])
            check_prefixes(prefixes, translation_limits(self.model, list(lengths), options), list(range(len(lengths))))
            ct2["target_prefix"] = [[tokens[i] for i in ids] for ids in prefixes]
        if options.get("do_sample", config.do_sample):
            merged = GenerationConfig(**{**config.to_dict(), **options})
            ct2.update(
                beam_size=1,
                # 0: the whole vocabulary (CTranslate2 refuses a k over its size; generate() takes it as all)
                sampling_topk=min(merged.top_k or 0, len(self.translator.target_tokens)),
                sampling_topp=merged.top_p if merged.top_p is not None else 1.0,
                sampling_temperature=merged.temperature if merged.temperature is not None else 1.0,
            )
        return ct2

    def _decode(self, ids: list[list[int]], n: int, scored: bool, options: dict[str, Any]):
        found = self._found(ids, n, scored, options)
        return [[(target, score) for target, _, score, _ in block] for block in found]

    def _found(self, ids: list[list[int]], n: int, scored: bool, options: dict[str, Any], attention: bool = False):
        """Each source's `n` hypotheses as (target ids without the end token, whether it ended, its score if
        `scored` else None, with `attention` its alignment attention (target tokens, source tokens) else None)."""
        translator = self.translator
        tokens = [[translator.source_tokens[token_id] for token_id in row] for row in ids]
        limits = self._own_limits([len(row) for row in ids], options)
        found = self._translate(tokens, limits, n, options, attention)
        if limits is not None:
            # generate() stops each sentence at its own limit (source length + 50); CTranslate2 has one limit per
            # call, the batch's longest: a sentence that ran past its own is translated again alone.
            for row, own in enumerate(limits):
                if any(len(hypothesis) + ended > own for hypothesis, ended, _, _ in found[row]):
                    found[row] = self._translate([tokens[row]], [own], n, for_rows(options, [row]), attention)[0]
        # samples' reported scores are the sampling distribution's; with a prefix, CTranslate2's leave it out
        rescore = bool(options.get("do_sample", self.model.generation_config.do_sample)) or any(
            options.get("target_prefix") or []
        )
        results = []
        for row, block in enumerate(found):
            # generate() forces the end token at a sentence's own limit: such a translation has one, and its score
            # counts it (CTranslate2's does not: scored again, as are samples, whose reported scores are the
            # sampling distribution's); CTranslate2's other scores are `sequence_scores`' (tests/test_engines.py)
            at_limit = limits[row] if limits is not None else None
            results.append(
                [
                    (
                        [translator.target_ids[token] for token in hypothesis],
                        ended or len(hypothesis) == at_limit,
                        None if rescore or (not ended and len(hypothesis) == at_limit) else score,
                        weights,
                    )
                    for hypothesis, ended, score, weights in block
                ]
            )
        if scored:
            self._score(tokens, results, options)
        return [
            [(target, ended, score if scored else None, weights) for target, ended, score, weights in block]
            for block in results
        ]

    def _translate(
        self, tokens: list[list[str]], limits: list[int] | None, n: int, options: dict[str, Any], attention: bool
    ) -> list[list[tuple[list[str], bool, float, list | None]]]:
        """Each source's `n` hypotheses: its tokens (without the end token), whether it ended with one,
        CTranslate2's score (log-probability over length ** length_penalty), and with `attention` the attention
        CTranslate2 returns (a row per token, the end token's included)."""
        ct2 = self._options([len(row) for row in tokens], limits, n, options)
        translate = functools.partial(
            self.translator.translator.translate_batch,
            return_end_token=True,
            return_scores=True,
            return_attention=attention,
            max_batch_size=self._split(len(tokens)),
            **ct2,
        )
        if attention and ct2["beam_size"] > 1:
            # ctranslate2 4.8's beam search returns, for a batch, the first step's attention of the batch's first
            # sentence for every sentence (tests/test_engines.py found it): with attention, one sentence a call
            results = [result for row in tokens for result in translate([row])]
        else:
            results = translate(tokens)
        return [
            [
                (hypothesis[:-1], True, score, weights)
                if hypothesis[-1:] and hypothesis[-1] in self.ends
                else (hypothesis, False, score, weights)
                for hypothesis, score, weights in zip(
                    result.hypotheses, result.scores, result.attention or [None] * len(result.hypotheses), strict=True
                )
            ]
            for result in results
        ]

    def can_stream(self, options: dict[str, Any]) -> bool:
        """Greedy search or sampling without a target prefix (`generate_tokens`, one sentence a call)."""
        beams = options.get("num_beams") or self.model.generation_config.num_beams or 1
        return beams == 1 and not any(options.get("target_prefix") or [])

    def translate_streamed(self, sentence: str, on_token: Callable[[int], None], **options: Any) -> Hypothesis:
        """`translate_nbest([sentence], 1, **options)`'s hypothesis by CTranslate2's `generate_tokens` (greedy or
        sampling: the tokens of its `translate_batch`), `on_token(id)` called with each token as it comes; the
        score is `sequence_scores`' (teacher-forced, as `_score` computes those CTranslate2 does not report)."""
        self.check(options)
        rows, ids = self._sources([sentence], options)
        if not rows:
            return Hypothesis("", float("nan"))
        translator = self.translator
        tokens = [translator.source_tokens[token_id] for token_id in ids[0]]
        limits = self._own_limits([len(tokens)], options)
        ct2 = self._options([len(tokens)], limits, 1, options)
        kept = {name: ct2[name] for name in GENERATE_TOKENS_OPTIONS if name in ct2}
        target, ended = [], False
        for step in translator.translator.generate_tokens(tokens, **kept):
            if step.token in self.ends:
                ended = True
                break
            target.append(translator.target_ids[step.token])
            on_token(target[-1])
        results = [[(target, ended or (limits is not None and len(target) == limits[0]), None, None)]]
        with _threads_for(self.model, self.threads, [sentence], 1, options):
            self._score([tokens], results, options)
        return Hypothesis(self.tokenizer.decode(target, skip_special_tokens=True), results[0][0][2])

    def translate_aligned(self, sentences: list[str], words: str = "whitespace", **options: Any):
        return [block[0] for block in self._aligned(sentences, 1, words, False, options)]

    def translate_aligned_nbest(self, sentences: list[str], n: int = 1, words: str = "whitespace", **options: Any):
        check_nbest(self.model, n, options)
        return self._aligned(sentences, n, words, True, options)

    def _aligned(self, sentences: list[str], n: int, words: str, scored: bool, options: dict[str, Any]):
        """`alignment.translate_aligned_nbest`'s results, from CTranslate2's translations and attention: the same
        layer and heads (the export's alignment layer and heads), made into word alignments by the same code."""
        from .alignment import (
            AlignedTranslation,
            decoded_spans,
            empty_aligned,
            source_words_of,
            split_words,
            word_alignment,
        )

        self.check(options, alignments=True)
        split_words("", words)  # an unknown `words` fails before any work
        results = [[empty_aligned(sentence, words)] * n for sentence in sentences]
        rows, ids = self._sources(sentences, options)
        if not rows:
            return results
        for row, source_ids, block in zip(
            rows, ids, self._found(ids, n, scored, for_rows(options, rows), attention=True), strict=True
        ):
            source = source_words_of(self.tokenizer, (row, sentences[row]), source_ids)
            aligned = []
            for target, _, score, weights in block:
                text = self.tokenizer.decode(target, skip_special_tokens=True)
                # the end token's row left out: a special token, of no word (`word_weights`)
                target_rows = torch.tensor(weights, dtype=torch.float32)[: len(target)]
                alignment = word_alignment(
                    target_rows, source, (text, decoded_spans(self.tokenizer, target, text)), words
                )
                aligned.append(AlignedTranslation(text, alignment, None, math.nan if score is None else score))
            results[row] = sorted(aligned, key=lambda found: -found.score) if scored else aligned
        return results

    def _own_limits(self, lengths: list[int], options: dict[str, Any]) -> list[int] | None:
        """Each sentence's limit under generate()'s per-sentence one (source length + offset, capped by the decoder's
        position table) as CTranslate2 counts it (tokens, the end token included: a translation that reaches it
        without one is where generate() forces the end token), or None when the limit is one number for the
        batch."""
        offset = per_sentence_offset(self.model.generation_config, dict(options))
        if not offset:
            return None
        limits = sentence_limits(torch.tensor(lengths), offset, self.model.config.max_position_embeddings)
        return (limits - 1).tolist()

    def _score(self, tokens: list[list[str]], results: list, options: dict[str, Any]) -> None:
        """Fill in each hypothesis' missing score (None) as `translation.sequence_scores` defines it (the
        log-probability of its tokens and of its end token if it has one, over that many tokens ** length_penalty),
        computed by CTranslate2 teacher-forced (score_batch appends the end token: dropped for a cut translation)."""
        missing = [
            (row, index) for row, block in enumerate(results) for index, entry in enumerate(block) if entry[2] is None
        ]
        if not missing:
            return
        penalty = self._length_penalty(options)
        sources = [tokens[row] for row, _ in missing]
        targets = [[self.translator.target_tokens[i] for i in results[row][index][0]] for row, index in missing]
        scored = self.translator.translator.score_batch(
            sources, targets, max_input_length=0, max_batch_size=self._split(len(sources))
        )
        for (row, index), result in zip(missing, scored, strict=True):
            target, ended, _, weights = results[row][index]
            log_probs = result.log_probs if ended else result.log_probs[:-1]
            results[row][index] = (target, ended, sum(log_probs) / max(len(log_probs), 1) ** penalty, weights)

    def score(self, sources: list[str], targets: list[str], batch_size: int = 32) -> list[Score]:
        """Each target's `scoring.Score` given its source, computed by CTranslate2 (`score_batch`, which appends and
        scores the end token as the torch engine does), `batch_size` pairs a call shared out between the workers."""
        return scored_in_batches(self._score_batch, sources, targets, batch_size)

    def _score_batch(self, sources: list[str], targets: list[str]) -> list[Score]:
        source_ids, target_ids = prepare_pairs(self.model, self.tokenizer, sources, targets)
        if not source_ids:
            return []
        translator = self.translator
        scored = translator.translator.score_batch(
            [[translator.source_tokens[i] for i in ids] for ids in source_ids],
            [[translator.target_tokens[i] for i in ids] for ids in target_ids],
            max_input_length=0,
            max_batch_size=self._split(len(source_ids)),
        )
        return scores_of(self.tokenizer, target_ids, end_token_id(self.model), [r.log_probs for r in scored])

    def _split(self, count: int) -> int:
        """max_batch_size for `count` sentences: a share for each worker (CTranslate2 sorts them by length and runs
        the parts on its workers in parallel); 0 (the call whole) with one worker."""
        return split_size(count, self.workers) if self.workers > 1 else 0

    def describe(self, options: dict[str, Any] | None = None, alignments: bool = False) -> dict[str, Any]:
        return {**super().describe(), "compute_type": self.compute_type}


class OnnxEngine(_ExportEngine):
    """onnxruntime on the ONNX export in `export` (module docstring); n-best hypotheses are scored by the torch
    model (`translation.sequence_scores`), as the torch engine scores its own, and so are given pairs (`score`: the
    export decodes one step at a time, with its cache; a teacher-forced pass is the torch model's)."""

    name = "onnxruntime"

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, export: Path, threads: int | None = None
    ):
        from .onnx_generation import OnnxTranslator

        super().__init__(model, tokenizer, export, threads)
        self.translator = OnnxTranslator(export, threads=onnxruntime_threads(threads))

    def _decode(self, ids: list[list[int]], n: int, scored: bool, options: dict[str, Any]):
        pad = self.tokenizer.pad_token_id or 0
        longest = max(len(row) for row in ids)
        input_ids = torch.tensor([row + [pad] * (longest - len(row)) for row in ids])
        mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in ids])
        sequences = self.translator.generate(input_ids, mask, num_return_sequences=n, **options)
        penalty = self._length_penalty(options)
        scores = sequence_scores(self.model, input_ids, mask, sequences, penalty) if scored else None
        rows = sequences[:, 1:].tolist()
        return [
            [(rows[index * n + k], None if scores is None else float(scores[index * n + k])) for k in range(n)]
            for index in range(len(ids))
        ]

    def score(self, sources: list[str], targets: list[str], batch_size: int = 32) -> list[Score]:
        """The torch engine's `score` on this engine's torch model (the class docstring)."""
        return TorchEngine(self.model, self.tokenizer, self.threads).score(sources, targets, batch_size)


class AutoEngine:
    """`--engine auto`: `fast` for every call it can serve, the torch engine for the others (module docstring)."""

    name = "auto"

    def __init__(self, fast: _ExportEngine, fallback: TorchEngine, why: str):
        self.fast, self.fallback, self.why = fast, fallback, why
        self.model, self.tokenizer = fallback.model, fallback.tokenizer

    def _on_torch(self, options: dict[str, Any], alignments: bool = False) -> str | None:
        """Why a request with `options` runs on torch; None: it runs on the fast engine."""
        # Sampling stays on torch: another engine draws from its own random stream, so the same seed would give
        # other samples depending on what is installed; auto never changes a result, only the speed.
        if options.get("do_sample", self.model.generation_config.do_sample):
            return "sampling runs on torch (the same seed gives the same samples whatever is installed)"
        reason = self.fast.refusal(options, alignments)
        if reason is not None:
            return f"{self.fast.name} {reason}"
        beams = options.get("num_beams") or self.model.generation_config.num_beams or 1
        if beams > 1 and (limits := [name for name in BEAM_LIMITS if options.get(name) is not None]):
            return (
                f"{limits[0]} in a beam search runs on torch ({self.fast.name}'s beam search renormalizes the "
                "probabilities after such a limit, transformers' does not: other translations)"
            )
        return None

    def _for(self, options: dict[str, Any], alignments: bool = False):
        return self.fast if self._on_torch(options, alignments) is None else self.fallback

    def refusal(self, options: dict[str, Any], alignments: bool = False) -> str | None:
        return None

    def check(self, options: dict[str, Any], alignments: bool = False) -> None:
        pass

    def seed(self, seed: int) -> None:
        self.fallback.seed(seed)  # sampling runs on torch (`_for`)

    def translate_batch(self, sentences: list[str], **options: Any) -> list[str]:
        return self._for(options).translate_batch(sentences, **options)

    def translate_nbest(self, sentences: list[str], n: int = 1, **options: Any) -> list[list[Hypothesis]]:
        return self._for(options).translate_nbest(sentences, n, **options)

    def can_stream(self, options: dict[str, Any]) -> bool:
        return self._for(options).can_stream(options)

    def translate_streamed(self, sentence: str, on_token: Callable[[int], None], **options: Any) -> Hypothesis:
        return self._for(options).translate_streamed(sentence, on_token, **options)

    def translate_aligned(self, sentences: list[str], words: str = "whitespace", **options: Any):
        return self._for(options, alignments=True).translate_aligned(sentences, words, **options)

    def translate_aligned_nbest(self, sentences: list[str], n: int = 1, words: str = "whitespace", **options: Any):
        return self._for(options, alignments=True).translate_aligned_nbest(sentences, n, words, **options)

    def score(self, sources: list[str], targets: list[str], batch_size: int = 32) -> list[Score]:
        """The fast engine's `score` (CTranslate2's `score_batch`; every export engine scores)."""
        return self.fast.score(sources, targets, batch_size)

    def describe(self, options: dict[str, Any] | None = None, alignments: bool = False) -> dict[str, Any]:
        """The engine that runs a request with `options` (default: a request that sets none), why, and the engine of
        the other requests."""
        on_torch = self._on_torch(options or {}, alignments)
        if on_torch is not None:
            return {**self.fallback.describe(), "chosen_by": "auto", "why": on_torch, "otherwise": self.fast.name}
        return {**self.fast.describe(), "chosen_by": "auto", "why": self.why, "otherwise": "torch"}

    def label_for(self, options: dict[str, Any] | None = None, alignments: bool = False) -> str:
        return f"{self._for(options or {}, alignments).name} (auto)"

    @property
    def label(self) -> str:
        return self.label_for()


ENGINE_CLASSES = (TorchEngine, CTranslate2Engine, OnnxEngine, AutoEngine)
Engine = TorchEngine | CTranslate2Engine | OnnxEngine | AutoEngine


def as_engine(model: PreTrainedModel | Engine, tokenizer: PreTrainedTokenizerBase | None = None) -> Engine:
    """`model` if it is an engine, else the torch engine of `model` and `tokenizer` (what the functions that take
    either accept)."""
    return model if isinstance(model, ENGINE_CLASSES) else TorchEngine(model, tokenizer)


def _versions(engine: str) -> dict[str, str]:
    import transformers

    versions = {"modeling_attn": __version__, "torch": torch.__version__, "transformers": transformers.__version__}
    module = PACKAGES[engine][0]
    versions[module] = getattr(__import__(module), "__version__", "?")
    return versions


def _export(engine: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, model_dir: Path, say) -> Path:
    """The folder of `engine`'s export of `model` (saved in `model_dir`), from the cache or made now."""
    from .export_cache import EXPORT_SUBFOLDER, cached_export, export_key

    versions = _versions(engine)
    key = export_key(model_dir, engine, versions)

    def make(folder: Path) -> None:
        say(f"exporting {model_dir} for {engine} (once for these weights)")
        if engine == "ctranslate2":
            from .export_ctranslate2 import export_ctranslate2

            export_ctranslate2(model, folder, tokenizer=tokenizer)
        else:
            from .export_onnx import export_onnx_model

            export_onnx_model(model, folder, tokenizer)

    details = {"model": str(model_dir), "engine": engine, "key": key, "versions": versions}
    entry = cached_export(f"{engine}-{key[:32]}", make, details, on_remake=say)
    return entry / EXPORT_SUBFOLDER


def model_dir_of(model: PreTrainedModel, name_or_path: str) -> Path:
    """The local folder the model was loaded from (a Hub repository's snapshot in the Hub cache)."""
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        return folder
    from transformers.utils import cached_file

    return Path(cached_file(name_or_path, "config.json")).parent


def _log(message: str) -> None:
    logger.info(message)


def _open_export(
    engine: str, model, tokenizer, model_dir: Path, device: torch.device, quantize, threads, say
) -> _ExportEngine:
    export = _export(engine, model, tokenizer, model_dir, say)
    if engine == "ctranslate2":
        compute_type = "int8" if quantize == "int8" else "default"
        return CTranslate2Engine(model, tokenizer, export, device, compute_type, threads)
    return OnnxEngine(model, tokenizer, export, threads)


def open_engine(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    model_name_or_path: str | None,
    engine: str = "auto",
    quantize: str | None = None,
    int8_engine: str | None = None,
    threads: int | None = None,
    say: Callable[[str], None] = _log,
    torch_only: str | None = None,
) -> Engine:
    """The engine `engine` for `model` (as loaded, not quantized; an ensemble's `model_name_or_path` is None),
    quantized by `quantize` on that engine. `say` is told of an export being made and of auto's choice (default:
    this module's logger, at INFO: `attn serve` logs it; `attn translate` and `attn evaluate` print it on a
    terminal, and why auto fell back to torch wherever stderr goes: `cli.options.engine_for`).
    `torch_only` names a flag of the request that only torch serves (attention pictures): auto opens torch, a named
    export engine refuses it."""
    from .quantize import quantize as quantize_model

    if engine not in ENGINES:
        raise EngineError(f"--engine {engine}: not an engine; choose one of {', '.join(ENGINES)}")
    device = model.device

    def on_torch(why: str | None = None) -> TorchEngine:
        from .ensemble import each_member

        quantized = each_member(model, lambda member: quantize_model(member, quantize, int8_engine))
        return TorchEngine(quantized, tokenizer, threads, why)

    if engine == "torch":
        return on_torch()
    if engine != "auto":
        reason = model_refusal(engine, model, device, quantize)
        if reason is None and int8_engine is not None:
            reason = f"has no --int8_engine (it picks torch's int8 kernels; {engine} has its own)"
        if reason is None and torch_only is not None:
            reason = f"has no {torch_only}"
        if reason is not None:
            raise _refused(engine, reason)
        folder = model_dir_of(model, model_name_or_path)
        return _open_export(engine, model, tokenizer, folder, device, quantize, threads, say)
    for fast in FAST_ENGINES:
        if model_name_or_path is None or device.type != "cpu" or int8_engine is not None or torch_only is not None:
            break  # an ensemble; a GPU (the export engines on a GPU were not measured); torch's int8 kernels; pictures
        if model_refusal(fast, model, device, quantize) is not None:
            continue
        folder = model_dir_of(model, model_name_or_path)
        try:
            opened = _open_export(fast, model, tokenizer, folder, device, quantize, threads, say)
        except (ExportError, ExportCacheError) as error:  # a config the export cannot map; a cache it cannot write
            why = f"{fast} cannot be used: {' '.join(str(error).split())}"
            say(f"engine: torch (auto: {why})")
            return on_torch(why)  # the reason goes with it (`describe`), for the commands to show off a terminal too
        say(f"engine: {fast} (auto: the fastest installed engine for this model; torch for what it cannot do)")
        return AutoEngine(opened, on_torch(), "the fastest installed engine for this model")
    return on_torch()


def load_translator(
    model_name_or_path: str,
    engine: str = "auto",
    device: str | None = None,
    quantize: str | None = None,
    threads: int | None = None,
) -> Engine:
    """The model folder or Hub repository `model_name_or_path` on `engine` (module docstring): the Python API's
    counterpart of `attn translate --engine`."""
    from .quantize import quantize_device
    from .translation import load_model

    model, tokenizer = load_model(model_name_or_path, quantize_device(device, quantize))
    return open_engine(model, tokenizer, model_name_or_path, engine, quantize, threads=threads, say=lambda _: None)


__all__ = [
    "ENGINES",
    "ENGINE_CLASSES",
    "AutoEngine",
    "as_engine",
    "CTranslate2Engine",
    "Engine",
    "EngineError",
    "OnnxEngine",
    "TorchEngine",
    "installed",
    "load_translator",
    "model_refusal",
    "open_engine",
]
