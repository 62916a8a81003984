"""Word alignments from the attention of a translation model: which source word each target word comes from.

Words, not subwords (`split_words`: "whitespace" or "alnum"); subword attention becomes word attention in
`word_weights` (a source word's columns summed, a target word's rows averaged, special tokens' columns dropped).
Which attention: `modeling_attn.encoder_decoder.alignment_attention`, for the Transformer the cross-attention of
decoder layer `config.alignment_layer` averaged over its first `config.alignment_heads` heads (Garg et al. 2019),
for the RNN its alignment weights alpha_ij (Bahdanau et al. 2015, Sec. 3.1). `hard_alignment` links each target
word to its source word of largest weight, written as Pharaoh pairs `i-j`. docs/alignment.md explains each choice.

- `translate_aligned` / `translate_aligned_nbest`: translate sentences (or n-best lists) and align each translation;
- `align_pairs`: align given (source, target) pairs, teacher-forced (forced alignment);
- an `AttnEnsemble` aligns with its members' alignment attention on its translation read teacher-forced, averaged
  with the ensemble's weights (`forced_attention`);
- `alignment_error_rate`: AER (Och & Ney 2003, "A Systematic Comparison of Various Statistical Alignment Models").

The Transformer returns attention weights only with `attn_implementation="eager"` (`load_model(..., eager=True)`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

from ..encoder_decoder import alignment_attention
from .choices import ALIGN_FORMATS, WORD_PATTERNS
from .ensemble import AttnEnsemble
from .heatmaps import TranslationAttention, attention_from_generate
from .translation import TranslateError, _encode, batches, check_nbest, generate_arguments, sequence_scores

Span = tuple[int, int]
Pair = tuple[int, int]  # (source word, target word)


def split_words(text: str, words: str = "whitespace") -> list[Span]:
    """The (start, end) character spans of the words of `text` (see the module docstring for `words`)."""
    if words not in WORD_PATTERNS:
        raise ValueError(f"words must be one of {list(WORD_PATTERNS)}, got {words!r}")
    return [match.span() for match in WORD_PATTERNS[words].finditer(text)]


def decoded_spans(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], text: str) -> list[Span | None]:
    """The characters of `text` (the decoding of `ids`) each token covers, from decoding growing prefixes of the ids;
    None for special tokens."""
    special = set(tokenizer.all_special_ids)
    spans: list[Span | None] = []
    end = 0
    for length in range(1, len(ids) + 1):
        if ids[length - 1] in special:
            spans.append(None)
            continue
        prefix = tokenizer.decode(list(ids[:length]), skip_special_tokens=True)
        common = next((k for k, (a, b) in enumerate(zip(prefix, text, strict=False)) if a != b), None)
        new_end = max(end, min(len(prefix), len(text)) if common is None else common)
        spans.append((end, new_end))
        end = new_end
    return spans


def encode_with_spans(
    tokenizer: PreTrainedTokenizerBase, text: str, target: bool = False
) -> tuple[list[int], list[Span | None], str]:
    """`text` tokenized as the model reads it (`target`: as labels), the characters each token covers (None for
    special tokens) and the text the spans refer to: `text` itself with a fast tokenizer (its offsets), else the
    decoding of the ids (which may differ from `text` where the tokenizer normalizes)."""
    kwargs = {"text_target": text} if target else {"text": text}
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(**kwargs, return_offsets_mapping=True, return_special_tokens_mask=True)
        spans = [
            None if special else (start, end)
            for (start, end), special in zip(encoded["offset_mapping"], encoded["special_tokens_mask"], strict=True)
        ]
        return encoded["input_ids"], spans, text
    ids = tokenizer(**kwargs)["input_ids"]
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    return ids, decoded_spans(tokenizer, ids, decoded), decoded


def token_words(spans: Sequence[Span | None], word_spans: Sequence[Span], length: int) -> list[int | None]:
    """The word of each token: the word holding the first non-space character it covers; a token covering none
    (whitespace only) belongs to the next token's word, or the previous one's at the end; special tokens (span
    None) to no word."""
    char_word: list[int | None] = [None] * length
    for word, (start, end) in enumerate(word_spans):
        char_word[start:end] = [word] * (end - start)
    found: list[int | None] = []
    for span in spans:
        if span is None:
            found.append(None)
            continue
        found.append(
            next((char_word[c] for c in range(span[0], min(span[1], length)) if char_word[c] is not None), -1)
        )
    for index in reversed(range(len(found))):  # -1: whitespace only; take the next token's word
        if found[index] == -1 and index + 1 < len(found) and found[index + 1] not in (None, -1):
            found[index] = found[index + 1]
    previous = None
    for index, word in enumerate(found):  # still -1 (nothing after it): the previous token's word
        if word == -1:
            found[index] = previous
        elif word is not None:
            previous = word
    return found


def word_weights(
    weights: torch.Tensor,
    target_words: Sequence[int | None],
    source_words: Sequence[int | None],
    num_target_words: int,
    num_source_words: int,
) -> torch.Tensor:
    """Token attention (T, S) to word weights (J, I): the columns of each source word summed, the rows of each target
    word averaged; tokens of no word (special tokens) left out."""
    weights = weights.float()
    source_map = torch.zeros(weights.shape[1], num_source_words)
    for token, word in enumerate(source_words):
        if word is not None:
            source_map[token, word] = 1.0
    target_map = torch.zeros(num_target_words, weights.shape[0])
    for token, word in enumerate(target_words):
        if word is not None:
            target_map[word, token] = 1.0
    target_map = target_map / target_map.sum(dim=1, keepdim=True).clamp(min=1.0)  # mean over a word's tokens
    return target_map @ weights.cpu() @ source_map


def hard_alignment(weights: torch.Tensor) -> list[Pair]:
    """(source word, target word) pairs: each target word with the source word it gives the largest weight, in target
    order; a target word with no weight at all (no token) gets no link."""
    if weights.shape[1] == 0:
        return []
    return [(int(row.argmax()), target) for target, row in enumerate(weights) if row.sum() > 0]


def format_pharaoh(pairs: Iterable[Pair]) -> str:
    """Pairs as a Pharaoh line: `i-j` (source word i, target word j) separated by spaces."""
    return " ".join(f"{source}-{target}" for source, target in pairs)


def parse_pharaoh(line: str) -> list[Pair]:
    """The (source word, target word) pairs of a Pharaoh line `0-0 1-2 ...`; ValueError naming a malformed pair."""
    pairs = []
    for item in line.split():
        source, dash, target = item.partition("-")
        if not dash or not source.isdigit() or not target.isdigit():
            raise ValueError(f"{item!r} is not a Pharaoh pair i-j (source word i, target word j, 0-based)")
        pairs.append((int(source), int(target)))
    return pairs


def alignment_error_rate(
    predicted: Sequence[Iterable[Pair]],
    sure: Sequence[Iterable[Pair]],
    possible: Sequence[Iterable[Pair]] | None = None,
) -> float:
    """AER = 1 - (|A & S| + |A & P|) / (|A| + |S|) over a corpus (Och & Ney 2003): A the predicted links, S the sure
    and P the possible reference links of each sentence (S is part of P; without `possible`, P = S and AER is
    1 - F1). Counts are summed over sentences before the ratio."""
    if len(predicted) != len(sure) or (possible is not None and len(possible) != len(sure)):
        raise ValueError(f"{len(predicted)} predicted alignments for {len(sure)} reference ones")
    found = reference = hits_sure = hits_possible = 0
    for index, (links, sure_links) in enumerate(zip(predicted, sure, strict=True)):
        links, sure_links = set(links), set(sure_links)
        possible_links = sure_links | (set(possible[index]) if possible is not None else set())
        found += len(links)
        reference += len(sure_links)
        hits_sure += len(links & sure_links)
        hits_possible += len(links & possible_links)
    if found + reference == 0:
        raise ValueError("no links, predicted or reference: the alignment error rate is undefined")
    return 1.0 - (hits_sure + hits_possible) / (found + reference)


@dataclass
class WordAlignment:
    """The alignment of one sentence pair over words: `weights[j, i]` is how much target word j attends to source
    word i (module docstring), `pairs` the hard alignment (source word, target word)."""

    source_words: list[str]
    target_words: list[str]
    weights: torch.Tensor  # (J, I)
    pairs: list[Pair]

    def pharaoh(self) -> str:
        return format_pharaoh(self.pairs)

    def soft(self, digits: int = 5) -> dict[str, Any]:
        """The words and the weights (rows: target words, columns: source words) as JSON-ready lists."""
        return {
            "source_words": self.source_words,
            "target_words": self.target_words,
            "weights": [[round(float(value), digits) for value in row] for row in self.weights],
        }


def word_alignment(
    weights: torch.Tensor,
    source: tuple[str, Sequence[Span | None]],
    target: tuple[str, Sequence[Span | None]],
    words: str = "whitespace",
) -> WordAlignment:
    """The word alignment of token attention `weights` (T, S): `source` and `target` are (text, the characters each
    token covers), the spans of `encode_with_spans` or `decoded_spans`."""
    (source_text, source_spans), (target_text, target_spans) = source, target
    if tuple(weights.shape) != (len(target_spans), len(source_spans)):
        raise ValueError(
            f"attention of shape {tuple(weights.shape)} for {len(target_spans)} target and {len(source_spans)} "
            "source tokens"
        )
    source_word_spans, target_word_spans = split_words(source_text, words), split_words(target_text, words)
    merged = word_weights(
        weights,
        token_words(target_spans, target_word_spans, len(target_text)),
        token_words(source_spans, source_word_spans, len(source_text)),
        len(target_word_spans),
        len(source_word_spans),
    )
    return WordAlignment(
        source_words=[source_text[start:end] for start, end in source_word_spans],
        target_words=[target_text[start:end] for start, end in target_word_spans],
        weights=merged,
        pairs=hard_alignment(merged),
    )


def selected_attention(attention: TranslationAttention, config: Any) -> torch.Tensor:
    """The (T, S) attention a translation's words are aligned with (`alignment_attention`: the config's layer and
    heads, or the RNN's alpha)."""
    return alignment_attention(tuple(layer[None] for layer in attention.cross_attention), config)[0]


def _check_eager(model: PreTrainedModel) -> None:
    from ..registry import MODEL_TYPES

    for member in model.members if isinstance(model, AttnEnsemble) else [model]:
        entry = MODEL_TYPES.get(member.config.model_type)
        if entry is not None and entry.per_head_attention and member.config._attn_implementation != "eager":
            raise TranslateError(
                "word alignments need the attention weights, which the Transformer returns only with the eager "
                f"attention (this model uses {member.config._attn_implementation!r}): load it with "
                "load_model(..., eager=True) or call model.set_attn_implementation('eager')"
            )


@torch.no_grad()
def forced_attention(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """(B, T, S) on the CPU: the alignment attention (`alignment_attention`) of the targets `labels` (-100 after
    each) read teacher-forced; for an `AttnEnsemble`, the average of its members' (each with its own layer and heads,
    or alpha) weighted as their log-probabilities are. Rows still sum to 1."""
    members, weights = (model.members, model.weights) if isinstance(model, AttnEnsemble) else ([model], [1.0])
    total = torch.zeros(())
    for member, weight in zip(members, weights, strict=True):
        outputs = member(
            input_ids=input_ids.to(member.device),
            attention_mask=attention_mask.to(member.device),
            labels=labels.to(member.device),
            output_attentions=True,
        )
        total = total + weight * alignment_attention(outputs.cross_attentions, member.config).float().cpu()
    return total


@dataclass
class AlignedTranslation:
    """One translation, its word alignment with the source, the attention it came from (None for an empty
    sentence, which is not translated, for an ensemble's translation, aligned by `forced_attention`, and for the
    ctranslate2 engine's, which returns only the alignment heads' average) and, from `translate_aligned_nbest`, its
    score."""

    text: str
    alignment: WordAlignment
    attention: TranslationAttention | None
    score: float = math.nan  # `translate_aligned_nbest`'s (translation.translate_nbest's); NaN for an empty sentence


def aligned_line(aligned: AlignedTranslation, mode: str = "hard") -> str:
    """One output line of `attn translate --align`: `translation ||| i-j ...` ("hard"), or a JSON object with the
    translation, the words and the weights ("soft")."""
    if mode == "hard":
        return f"{aligned.text} ||| {aligned.alignment.pharaoh()}\n"
    if mode == "soft":
        return json.dumps({"translation": aligned.text, **aligned.alignment.soft()}, ensure_ascii=False) + "\n"
    raise ValueError(f"mode must be one of {list(ALIGN_FORMATS)}, got {mode!r}")


def empty_aligned(sentence: str, words: str) -> AlignedTranslation:
    """What an empty (or blank) sentence aligns to: no translation, its source words, no links."""
    source_words = [sentence[start:end] for start, end in split_words(sentence, words)]
    return AlignedTranslation("", WordAlignment(source_words, [], torch.zeros(0, len(source_words)), []), None)


def _aligned(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    generated: tuple[Any, BatchEncoding],
    index: int,
    sentence: tuple[int, str],
    words: str,
) -> AlignedTranslation:
    """Generated sequence `index` of `generated` (generate()'s output with attentions, the encoded sources) aligned
    with its source `sentence` (its number in the caller's list, its text)."""
    outputs, encoded = generated
    attention = attention_from_generate(outputs, encoded["input_ids"], encoded["attention_mask"], index, tokenizer)
    source_text, source_spans = _source(tokenizer, generated, index, sentence)
    beam_indices = getattr(outputs, "beam_indices", None)
    generated_columns = beam_indices.shape[1] if beam_indices is not None else len(outputs.cross_attentions)
    prompt_length = outputs.sequences.shape[1] - generated_columns
    target_ids = outputs.sequences[index, prompt_length : prompt_length + len(attention.target_tokens)].tolist()
    translation = tokenizer.decode(target_ids, skip_special_tokens=True)
    alignment = word_alignment(
        selected_attention(attention, model.config),
        (source_text, source_spans),
        (translation, decoded_spans(tokenizer, target_ids, translation)),
        words,
    )
    return AlignedTranslation(translation, alignment, attention)


def _source(
    tokenizer: PreTrainedTokenizerBase, generated: tuple[Any, BatchEncoding], index: int, sentence: tuple[int, str]
) -> tuple[str, list[Span | None]]:
    """The text and token spans of generated sequence `index`'s source `sentence`, checked against the batch."""
    outputs, encoded = generated
    source_row = index // (outputs.sequences.shape[0] // encoded["input_ids"].shape[0])
    return source_words_of(tokenizer, sentence, encoded["input_ids"][source_row].tolist())


def source_words_of(tokenizer: PreTrainedTokenizerBase, sentence: tuple[int, str], ids: list[int]):
    """The text and token spans (`encode_with_spans`) of `sentence` (its number in the caller's list, its text),
    whose ids in the batch translated were `ids` (padding after them allowed): TranslateError where the tokenizer
    gives other ids for it alone, to which the spans would not belong."""
    row, text = sentence
    source_ids, source_spans, source_text = encode_with_spans(tokenizer, text)
    if source_ids != ids[: len(source_ids)]:
        raise TranslateError(f"sentence {row}: the tokenizer gives other ids alone than in a batch")
    return source_text, source_spans


def _all_aligned(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    generated: tuple[Any, BatchEncoding],
    sentences: list[tuple[int, str]],
    words: str,
) -> list[AlignedTranslation]:
    """Every sequence of `generated` (generate()'s output, the encoded sources; the same number per sentence of
    `sentences`) aligned with its source: from generate()'s attention (`_aligned`), or for an ensemble teacher-forced
    through `forced_attention`, each target running from after the decoder start token to its first end-of-sentence
    token (or the length limit)."""
    outputs, encoded = generated
    per_sentence = outputs.sequences.shape[0] // encoded["input_ids"].shape[0]
    if not isinstance(model, AttnEnsemble):
        return [
            _aligned(model, tokenizer, generated, index, sentences[index // per_sentence], words)
            for index in range(outputs.sequences.shape[0])
        ]
    eos = model.generation_config.eos_token_id
    ends = set(eos if isinstance(eos, list) else [eos])
    targets = []
    for row in outputs.sequences[:, 1:].tolist():
        end = next((position for position, token in enumerate(row) if token in ends), len(row) - 1)
        targets.append(row[: end + 1])
    labels, _ = _padded(targets, -100)
    sources = {key: encoded[key].repeat_interleave(per_sentence, dim=0) for key in ("input_ids", "attention_mask")}
    weights = forced_attention(model, sources["input_ids"], sources["attention_mask"], labels)
    found = []
    for index, target_ids in enumerate(targets):
        source_text, source_spans = _source(tokenizer, generated, index, sentences[index // per_sentence])
        translation = tokenizer.decode(target_ids, skip_special_tokens=True)
        alignment = word_alignment(
            weights[index, : len(target_ids), : len(source_spans)],
            (source_text, source_spans),
            (translation, decoded_spans(tokenizer, target_ids, translation)),
            words,
        )
        found.append(AlignedTranslation(translation, alignment, None))
    return found


def _generate(model: PreTrainedModel, encoded: BatchEncoding, **generate_kwargs: Any) -> Any:
    """generate() on `encoded` returning a dict, with attentions unless `model` is an ensemble (aligned by
    `forced_attention` instead)."""
    return model.generate(
        input_ids=encoded["input_ids"],
        attention_mask=encoded["attention_mask"],
        output_attentions=not isinstance(model, AttnEnsemble),
        return_dict_in_generate=True,
        **generate_kwargs,
    )


@torch.no_grad()
def translate_aligned(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    words: str = "whitespace",
    **generate_kwargs: Any,
) -> list[AlignedTranslation]:
    """Translations of `sentences` (one generate() call, `translation.translate_batch`'s settings) with their word
    alignments. Empty sentences translate to empty strings without reaching the model."""
    _check_eager(model)
    split_words("", words)  # an unknown `words` fails before the model runs
    if generate_kwargs.get("num_return_sequences", 1) != 1:
        raise TranslateError(
            "translate_aligned returns one translation per sentence; use translate_aligned_nbest for several"
        )
    results = [empty_aligned(sentence, words) for sentence in sentences]
    rows = [row for row, sentence in enumerate(sentences) if sentence.strip()]
    if not rows:
        return results
    encoded = _encode(model, tokenizer, sentences, rows, generate_kwargs)
    outputs = _generate(model, encoded, **generate_arguments(model, tokenizer, encoded, rows, generate_kwargs))
    found = _all_aligned(model, tokenizer, (outputs, encoded), [(row, sentences[row]) for row in rows], words)
    for row, aligned in zip(rows, found, strict=True):
        results[row] = aligned
    return results


@torch.no_grad()
def translate_aligned_nbest(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    num_return_sequences: int = 1,
    words: str = "whitespace",
    **generate_kwargs: Any,
) -> list[list[AlignedTranslation]]:
    """`num_return_sequences` scored translations of each of `sentences` (one generate() call), best first, each with
    its own word alignment: `translation.translate_nbest`'s hypotheses and scores (`AlignedTranslation.score`), and
    for each the alignment `translate_aligned` gives its best one. An empty sentence gets `num_return_sequences`
    empty translations scored NaN (the model is not run on it)."""
    _check_eager(model)
    split_words("", words)
    check_nbest(model, num_return_sequences, generate_kwargs)
    results = [[empty_aligned(sentence, words)] * num_return_sequences for sentence in sentences]
    rows = [row for row, sentence in enumerate(sentences) if sentence.strip()]
    if not rows:
        return results
    encoded = _encode(model, tokenizer, sentences, rows, generate_kwargs)
    arguments = generate_arguments(model, tokenizer, encoded, rows, generate_kwargs)
    outputs = _generate(model, encoded, num_return_sequences=num_return_sequences, **arguments)
    length_penalty = generate_kwargs.get("length_penalty", model.generation_config.length_penalty)
    scores = sequence_scores(
        model,
        encoded["input_ids"],
        encoded["attention_mask"],
        outputs.sequences,
        1.0 if length_penalty is None else length_penalty,
    ).tolist()
    found = _all_aligned(model, tokenizer, (outputs, encoded), [(row, sentences[row]) for row in rows], words)
    found = [replace(aligned, score=score) for aligned, score in zip(found, scores, strict=True)]
    for index, row in enumerate(rows):
        block = found[index * num_return_sequences : (index + 1) * num_return_sequences]
        results[row] = sorted(block, key=lambda aligned: -aligned.score)  # as translate_nbest: samples come unordered
    return results


@torch.no_grad()
def align_pairs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    targets: Sequence[str],
    words: str = "whitespace",
    batch_size: int = 32,
) -> list[WordAlignment]:
    """Word alignments of given (source, target) pairs: the model (or each member of an ensemble) reads each target
    teacher-forced (as in training) and its attention (`forced_attention`) is turned into words as for a translation
    (forced alignment)."""
    _check_eager(model)
    split_words("", words)
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources for {len(targets)} targets")
    found: list[WordAlignment] = []
    pad = tokenizer.pad_token_id
    for rows in batches(range(len(sources)), batch_size):
        source_sides = [encode_with_spans(tokenizer, sources[row]) for row in rows]
        target_sides = [encode_with_spans(tokenizer, targets[row], target=True) for row in rows]
        input_ids, attention_mask = _padded([ids for ids, _, _ in source_sides], pad or 0)
        labels, _ = _padded([ids for ids, _, _ in target_sides], -100)
        weights = forced_attention(model, input_ids, attention_mask, labels)  # (B, T, S)
        for index, ((_, s_spans, s_text), (_, t_spans, t_text)) in enumerate(
            zip(source_sides, target_sides, strict=True)
        ):
            token_weights = weights[index, : len(t_spans), : len(s_spans)]
            found.append(word_alignment(token_weights, (s_text, s_spans), (t_text, t_spans), words))
    return found


def _padded(rows: list[list[int]], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows and their mask (1 on the tokens)."""
    width = max(len(row) for row in rows)
    padded = torch.tensor([row + [value] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return padded, mask


__all__ = [
    "ALIGN_FORMATS",
    "AlignedTranslation",
    "WORD_PATTERNS",
    "WordAlignment",
    "align_pairs",
    "aligned_line",
    "alignment_error_rate",
    "decoded_spans",
    "empty_aligned",
    "encode_with_spans",
    "forced_attention",
    "format_pharaoh",
    "hard_alignment",
    "parse_pharaoh",
    "selected_attention",
    "source_words_of",
    "split_words",
    "token_words",
    "translate_aligned",
    "translate_aligned_nbest",
    "word_alignment",
    "word_weights",
]
