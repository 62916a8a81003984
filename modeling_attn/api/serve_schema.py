"""The JSON of `attn serve`'s `POST /translate` and `POST /score`: requests and answers, as pydantic models.

The request takes the decoding options of `attn translate` (beams, length penalty, n-best lists, sampling with a
seed, word alignments); a setting given without its switch (`top_k` without `do_sample`, `alignment_words` without
`alignment`) is refused, naming both. `ScoreRequest` takes pairs (`source`, `target`: one translation per source) as
`attn score` does. `format` says whether `text` holds sentences or documents; `stream` asks for Server-Sent Events
(docs/serve.md shows each field and event; FastAPI builds the OpenAPI page from these).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TranslateRequest(BaseModel):
    """The body of `POST /translate`: the sentences and the options of `attn translate`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: list[str] = Field(min_length=1, description="Sentences to translate, answered in this order.")
    num_beams: int | None = Field(None, ge=1, description="Beam size (default: the model's generation_config).")
    length_penalty: float | None = Field(None, description="Beam search length penalty (default: the model's).")
    max_new_tokens: int | None = Field(None, ge=1, description="Longest translation in tokens (default: the model's).")
    num_return_sequences: int = Field(1, ge=1, description="Hypotheses per sentence (n-best, in `nbest`).")
    do_sample: bool = Field(False, description="Sample instead of searching (one beam unless num_beams is given).")
    top_k: int | None = Field(None, ge=1, description="Sample from the k most likely tokens.")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling: the smallest set with mass p.")
    temperature: float | None = Field(None, gt=0, description="Divide the logits by this before sampling.")
    seed: int | None = Field(None, ge=0, lt=2**32, description="Random seed: the same seed gives the same samples.")
    no_repeat_ngram_size: int | None = Field(None, ge=1, description="No n-gram of this many tokens twice.")
    repetition_penalty: float | None = Field(
        None, gt=0, description="Penalize the tokens a translation already has (above 1: fewer repeats)."
    )
    min_new_tokens: int | None = Field(
        None, ge=1, description="Shortest translation in tokens, end token not counted."
    )
    bad_words: list[str] | None = Field(
        None, min_length=1, description="Words or phrases no translation may contain (tokenized as target text)."
    )
    prefix: list[str] | None = Field(
        None,
        description='A target prefix per sentence of `text` ("": none): its translation starts with it and the '
        "search goes on after it.",
    )
    alignment: Literal["hard", "soft"] | None = Field(
        None,
        description="Word alignments with each translation (`attn translate --align`): hard, Pharaoh pairs "
        "[[source word, target word], ...]; soft, the words and the weights.",
    )
    alignment_words: Literal["whitespace", "alnum"] | None = Field(
        None,
        description="What a word is for the alignment (`--align_words`; default whitespace), also the words an html "
        "or markdown document's tags are carried by.",
    )
    constraints: list[list[str]] | None = Field(
        None,
        description="Per sentence of `text`, target phrases its translation must contain (`attn translate "
        "--constraints`; [] for none). Each translation then says which it lacks, in `unmet_constraints`.",
    )
    format: Literal["sentences", "text", "html", "markdown"] = Field(
        "sentences",
        description="sentences: each item of `text` is a sentence; text: each is a document, running text split into "
        "sentences, translated and re-joined with its layout kept (`attn translate --document`). html, markdown: "
        "a marked-up document, its markup kept and its inline tags carried onto the aligned words (`--format`).",
    )
    source_lang: str | None = Field(
        None, description="A document's language code for its sentence rules (default: the model's source_lang)."
    )
    stream: bool = Field(
        False,
        description="Answer with Server-Sent Events as the translation is made: a document's sentences, one "
        "sentence's tokens (greedy search, sampling) or each sentence (beam search), then `done` with the answer.",
    )

    @model_validator(mode="after")
    def _settings_need_their_switch(self) -> TranslateRequest:
        given = [name for name in ("top_k", "top_p", "temperature", "seed") if getattr(self, name) is not None]
        if given and not self.do_sample:
            raise ValueError(f'{", ".join(given)}: a sampling setting, with no do_sample; add "do_sample": true')
        if self.prefix is not None and len(self.prefix) != len(self.text):
            raise ValueError(
                f"prefix: {len(self.prefix)} prefixes for {len(self.text)} sentences; give one per sentence"
            )
        if empty := [index for index, word in enumerate(self.bad_words or []) if not word.strip()]:
            raise ValueError(f"bad_words[{empty[0]}]: an empty word")
        # a marked-up document aligns words to carry its tags: there alignment_words says what a word is
        if self.alignment_words is not None and self.alignment is None and self.format not in ("html", "markdown"):
            raise ValueError('alignment_words: an alignment setting, with no alignment; add "alignment": "hard"')
        if self.constraints is not None:
            if len(self.constraints) != len(self.text):
                raise ValueError(
                    f"constraints: {len(self.constraints)} entries for {len(self.text)} sentences in text; give one "
                    "list of phrases per sentence ([] for none)"
                )
            for row, phrases in enumerate(self.constraints):
                for index, phrase in enumerate(phrases):
                    if not phrase.strip():
                        raise ValueError(f"constraints[{row}][{index}]: an empty phrase")
            if self.do_sample or self.alignment is not None:
                raise ValueError("constraints: a beam search; drop do_sample and alignment")
        return self._document_settings()

    def _document_settings(self) -> TranslateRequest:
        """A document's translation has no per-sentence settings; `source_lang` is a document's."""
        if self.format == "sentences":
            if self.source_lang is not None:
                raise ValueError('source_lang: a document\'s language; add "format": "text"')
            return self
        per_sentence = {
            "prefix": self.prefix is not None,
            "constraints": self.constraints is not None,
            "alignment": self.alignment is not None,
            "num_return_sequences": self.num_return_sequences > 1,
        }
        if given := [name for name, set_ in per_sentence.items() if set_]:
            raise ValueError(f"{given[0]}: applies to one sentence, not to a document (format {self.format})")
        return self


class SoftAlignment(BaseModel):
    """`attn translate --align --align_format soft`'s line without the translation.

    `weights[j][i]` is the weight of target word j on source word i.
    """

    source_words: list[str]
    target_words: list[str]
    weights: list[list[float]]


class ScoredText(BaseModel):
    text: str
    score: float | None = Field(description="log-probability / length ** length_penalty; null for an empty sentence")
    alignment: list[tuple[int, int]] | SoftAlignment | None = Field(
        None,
        description='With "alignment": hard, [[source word, target word], ...] in target order; soft, the '
        "words and the weights.",
    )
    unmet_constraints: list[str] | None = Field(
        None, description="With constraints: the phrases this translation lacks (they did not fit within its limit)."
    )


class Translation(ScoredText):
    nbest: list[ScoredText] | None = Field(None, description="With num_return_sequences > 1: all, best first.")


class TranslateResponse(BaseModel):
    translations: list[Translation]


class DocumentTranslation(BaseModel):
    text: str = Field(description="The document translated, its layout (line breaks, spacing) kept.")
    sentences: int = Field(description="The sentences translated (a long one split at its clauses counts each part).")


class DocumentResponse(BaseModel):
    translations: list[DocumentTranslation]


class ScoreRequest(BaseModel):
    """The body of `POST /score`: translations to score, each given its source (`attn score`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    source: list[str] = Field(min_length=1, description="Source sentences.")
    target: list[str] = Field(description="A translation of each source, to score; answered in this order.")
    tokens: bool = Field(False, description="Also answer each token (the end token last) and its log-probability.")

    @model_validator(mode="after")
    def _one_target_per_source(self) -> ScoreRequest:
        if len(self.target) != len(self.source):
            raise ValueError(
                f"target: {len(self.target)} sentences for {len(self.source)} in source; give one translation of each"
            )
        return self


class PairScore(BaseModel):
    total: float | None = Field(description="The target's log-probability: the sum over its tokens and the end token.")
    mean: float | None = Field(description="The per-token mean log-probability (the end token counted).")
    length: int = Field(description="Tokens scored: the target's and the end token.")
    tokens: list[str] | None = Field(None, description='With "tokens": true, the tokens, the end token last.')
    log_probs: list[float | None] | None = Field(None, description="With tokens: each token's log-probability.")


class ScoreResponse(BaseModel):
    scores: list[PairScore]


__all__ = [
    "DocumentResponse",
    "DocumentTranslation",
    "PairScore",
    "ScoreRequest",
    "ScoreResponse",
    "ScoredText",
    "SoftAlignment",
    "TranslateRequest",
    "TranslateResponse",
    "Translation",
]
