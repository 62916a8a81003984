"""Decoding shared by both model types: the paper's per-sentence output limit, and checks of generate()'s arguments.

"We set the maximum output length during inference to input length + 50, but terminate early when possible"
(Vaswani et al., 2017, Sec. 6.1). Deviation from transformers: `GenerationConfig.max_length` is one number for the
whole batch; here the limit is per sentence. `generation_config.max_length_over_source = 50` makes `generate()` force
the end-of-sentence token once a translation has `source length + 50` tokens (source padding excluded). An explicit
`max_length` or `max_new_tokens` takes precedence; a position table (`config.max_position_embeddings`) caps it.

`check_generate_arguments` refuses, naming the argument before any decoding step, what transformers' `generate()`
takes and then fails on deep inside or decodes wrongly with (issue 34). The details of both are in docs/model.md.
The beam search that drops finished sentences from the batch is in `beam_search.py`.
"""

from __future__ import annotations

import copy
import math

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from .constraints import constraints_argument

SOURCE_LIMIT_FIELD = "max_length_over_source"


class SourceLengthLimit(LogitsProcessor):
    """Forces an end-of-sentence token when a hypothesis reaches `limits` tokens (one limit per source sentence).

    Hypotheses of one sentence (beams, samples) are consecutive rows of the decoder input, as in `generate()`.
    """

    def __init__(self, limits: torch.Tensor, eos_token_id: int | list[int] | torch.Tensor):
        self.limits = limits  # (B,)
        self.eos_token_ids = torch.as_tensor(eos_token_id).reshape(-1)

    def select(self, sentences: torch.Tensor) -> SourceLengthLimit:
        """This processor for a batch of fewer sentences: the limits at positions `sentences` of `limits`."""
        return SourceLengthLimit(self.limits[sentences.to(self.limits.device)], self.eos_token_ids)

    def at_limit(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """(rows,) bool: the rows whose next token is the last one allowed, which must end the sentence."""
        per_row = self.limits.to(input_ids.device).repeat_interleave(input_ids.shape[0] // self.limits.shape[0])
        generated = input_ids.shape[-1] - 1  # the decoder start token is not part of the translation
        return generated >= per_row - 1

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        at_limit = self.at_limit(input_ids)
        if not at_limit.any():
            return scores
        eos = self.eos_token_ids.to(scores.device)
        forced = torch.full_like(scores, torch.finfo(scores.dtype).min)
        forced[:, eos] = scores[:, eos]
        return torch.where(at_limit[:, None], forced, scores)


class TargetPrefix(LogitsProcessor):
    """Forces each sentence's target prefix: while a hypothesis has fewer tokens than its sentence's prefix, the
    prefix's next token is the only one allowed, at its own log-probability (so that a score counts the prefix).

    `prefixes` is (B, P), each row a sentence's prefix token ids padded with -1 (no prefix: all -1); the hypotheses
    of one sentence are consecutive rows of the decoder input, as in `generate()`.
    """

    def __init__(self, prefixes: torch.Tensor):
        self.prefixes = prefixes

    def select(self, sentences: torch.Tensor) -> TargetPrefix:
        """This processor for a batch of fewer sentences: the prefixes at positions `sentences`."""
        return TargetPrefix(self.prefixes[sentences.to(self.prefixes.device)])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[-1] - 1  # tokens generated so far (the decoder start token is not one)
        if step >= self.prefixes.shape[1]:
            return scores
        per_sentence = input_ids.shape[0] // self.prefixes.shape[0]
        tokens = self.prefixes[:, step].to(scores.device).repeat_interleave(per_sentence)
        forced = tokens >= 0
        if not forced.any():
            return scores
        index = tokens.clamp(min=0)[:, None]
        only = torch.full_like(scores, torch.finfo(scores.dtype).min).scatter_(1, index, scores.gather(1, index))
        return torch.where(forced[:, None], only, scores)


def source_lengths(input_ids=None, attention_mask=None, inputs_embeds=None, encoder_outputs=None) -> torch.Tensor:
    """Tokens per source sentence: the attention mask's sum, else the full length of whatever holds the source."""
    if attention_mask is not None:
        return attention_mask.sum(-1).long()
    if encoder_outputs is not None:
        source = encoder_outputs[0]
    else:
        source = input_ids if input_ids is not None else inputs_embeds
    return torch.full((source.shape[0],), source.shape[1], dtype=torch.long, device=source.device)


def per_sentence_offset(config: GenerationConfig, kwargs: dict) -> int | None:
    """The offset of the per-sentence limit a `generate(**kwargs)` call decodes under: `max_length_over_source`
    (popped from `kwargs`, else the config's), or None where the call has an explicit limit instead (`max_length`
    or `max_new_tokens` given, or the config's `max_new_tokens`). A `max_length` or `max_new_tokens` of None is no
    limit given: dropped from `kwargs`. The one rule of every engine (module docstring)."""
    offset = kwargs.pop(SOURCE_LIMIT_FIELD, getattr(config, SOURCE_LIMIT_FIELD, None))
    for name in ("max_length", "max_new_tokens"):
        if name in kwargs and kwargs[name] is None:
            del kwargs[name]
    explicit = "max_length" in kwargs or "max_new_tokens" in kwargs or config.max_new_tokens is not None
    return None if explicit else offset


def sentence_limits(lengths: torch.Tensor, offset: int, positions: int | None) -> torch.Tensor:
    """Each sentence's limit (tokens of its translation, the end token included): its source length + `offset`,
    capped by the decoder's position table (`positions`; the decoder start token takes position 0)."""
    limits = lengths + offset
    return limits if positions is None else limits.clamp(max=positions)


def check_generate_arguments(inputs: torch.Tensor | None, config: GenerationConfig, kwargs: dict) -> None:
    """ValueError naming the argument (see the module docstring) for `generate(inputs, config, **kwargs)`; a
    setting given in `kwargs` overrides the config's, as in `generate()`."""
    for name in ("num_beams", "num_return_sequences"):
        value = kwargs.get(name, getattr(config, name, None))
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"generate(): {name} must be a positive integer, got {value!r}")
    penalty = kwargs.get("length_penalty", config.length_penalty)
    if penalty is not None and (
        isinstance(penalty, bool) or not isinstance(penalty, int | float) or not math.isfinite(penalty)
    ):
        raise ValueError(f"generate(): length_penalty must be a finite number, got {penalty!r}")
    encoder_outputs = kwargs.get("encoder_outputs")
    sources = {
        "input_ids": kwargs.get("input_ids", inputs),
        "inputs_embeds": kwargs.get("inputs_embeds"),
        "encoder_outputs": None if encoder_outputs is None else encoder_outputs[0],
    }
    for name, source in sources.items():
        if isinstance(source, torch.Tensor) and source.dim() > 0 and source.shape[0] == 0:
            raise ValueError(
                f"generate(): the batch is empty ({name} has shape {tuple(source.shape)}); give at least one "
                "sentence (modeling_attn.api.translation.translate_batch([]) returns [])"
            )


class SourceRelativeLengthMixin:
    """`generate()` with the paper's per-sentence maximum output length (see the module docstring)."""

    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        **kwargs,
    ):
        config = generation_config if generation_config is not None else self.generation_config
        check_generate_arguments(inputs, config, kwargs)
        lengths = source_lengths(
            kwargs.get("input_ids", inputs),
            kwargs.get("attention_mask"),
            kwargs.get("inputs_embeds"),
            kwargs.get("encoder_outputs"),
        )
        constraints = constraints_argument(kwargs, config, lengths.shape[0])  # force_words_ids (constraints.py)
        if getattr(config, "force_words_ids", None) is not None:  # taken: transformers' own would refuse it
            generation_config = config = copy.deepcopy(config)
            config.force_words_ids = None
        if constraints is not None:
            logits_processor = LogitsProcessorList([*(logits_processor or []), constraints])
        offset = per_sentence_offset(config, kwargs)
        if offset is None:
            return super().generate(inputs, generation_config, logits_processor, **kwargs)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
            raise ValueError(f"generation_config.{SOURCE_LIMIT_FIELD} must be a positive integer, got {offset!r}")
        eos_token_id = kwargs.get("eos_token_id", config.eos_token_id)
        if eos_token_id is None:
            raise ValueError(f"generation_config.{SOURCE_LIMIT_FIELD} needs an eos_token_id to end translations with")
        limits = sentence_limits(lengths, offset, getattr(self.config, "max_position_embeddings", None))
        processors = LogitsProcessorList(logits_processor or [])
        processors.append(SourceLengthLimit(limits, eos_token_id))
        max_length = int(limits.max()) + 1  # one more position than the longest limit: the decoder start token
        if generation_config is None:
            return super().generate(inputs, None, processors, max_length=max_length, **kwargs)
        generation_config = copy.deepcopy(generation_config)  # the caller's object stays as it was
        generation_config.max_length = max_length
        return super().generate(inputs, generation_config, processors, **kwargs)


__all__ = [
    "SOURCE_LIMIT_FIELD",
    "SourceLengthLimit",
    "SourceRelativeLengthMixin",
    "check_generate_arguments",
    "per_sentence_offset",
    "sentence_limits",
    "source_lengths",
]
