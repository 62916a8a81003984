"""Translate with an ONNX export (`export_onnx.py`) in onnxruntime: greedy search and beam search, as `generate()`.

`OnnxTranslator(folder).generate(input_ids, attention_mask)` returns what the model's `generate()` returns for the
same settings, token for token: the encoder graph runs once per batch, the decoder graph once per step on the
newest tokens with the keys/values of the steps before. The settings come from the export's generation_config.json
and the keyword arguments, as in `generate()` (beams, length penalty, early stopping, end tokens, minimum lengths and
the length limit, by default the paper's per-sentence `max_length_over_source`). The search itself is the model's:
greedy takes the arg-max of the (limit-processed) logits; beam search runs `beam_search.OpenSentences` /
`SearchResults`. Only the forward passes run in onnxruntime. Sampling and logits processors other than the length
ones (repetition penalties, forced or banned tokens) are refused, not ignored.

Shapes: B batch, R decoder rows (B, or B * beams while all sentences are open), S source length, P past positions,
H heads, D head dim, V target vocabulary, K beams.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LogitsProcessorList, PreTrainedTokenizerBase
from transformers.generation.logits_process import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from ..beam_search import BeamSettings, OpenSentences, SearchResults
from ..generation import (
    SOURCE_LIMIT_FIELD,
    SourceLengthLimit,
    per_sentence_offset,
    sentence_limits,
    source_lengths,
)
from .export_onnx import MANIFEST_FILE, import_onnxruntime

# GenerationConfig fields that would add a logits processor or change the search, with their inert values.
UNSUPPORTED = {
    "do_sample": False,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "bad_words_ids": None,
    "force_words_ids": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "renormalize_logits": False,
    "max_time": None,
}


def select(arrays: list[np.ndarray], rows: torch.Tensor) -> list[np.ndarray]:
    """These rows (the first axis) of every array."""
    indices = rows.cpu().numpy()
    return [array[indices] for array in arrays]


def keep_sentences(processors: LogitsProcessorList, kept: torch.Tensor) -> LogitsProcessorList:
    """The processors for the sentences at positions `kept` (the per-sentence limits; the others are per row)."""
    return LogitsProcessorList(p.select(kept) if isinstance(p, SourceLengthLimit) else p for p in processors)


class OnnxTranslator:
    """Greedy and beam-search decoding with the two graphs of an ONNX export (module docstring)."""

    def __init__(
        self, model_dir: str | Path, providers: Sequence[str] = ("CPUExecutionProvider",), threads: int | None = None
    ):
        """`threads`: onnxruntime's intra-op threads (default: its own choice, one per core)."""
        onnxruntime = import_onnxruntime()
        self.model_dir = Path(model_dir)
        if not (self.model_dir / MANIFEST_FILE).is_file():
            raise FileNotFoundError(f"{model_dir}: no {MANIFEST_FILE}, not a folder written by export_onnx")
        self.names = json.loads((self.model_dir / MANIFEST_FILE).read_text())
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.encoder, self.decoder = (
            onnxruntime.InferenceSession(str(self.model_dir / self.names[graph]), options, providers=list(providers))
            for graph in ("encoder", "decoder")
        )
        self.config = AutoConfig.from_pretrained(model_dir)
        if (self.model_dir / "generation_config.json").is_file():
            self.generation_config = GenerationConfig.from_pretrained(model_dir)
        else:
            self.generation_config = GenerationConfig.from_model_config(self.config)
        self._tokenizer = None

    # ------------------------------------------------------------------------------------------------------------
    # the two graphs

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[np.ndarray]:
        """Each decoder layer's cross-attention keys and values, (B, H, S, D) each."""
        feeds = (input_ids.cpu().numpy().astype(np.int64), attention_mask.cpu().numpy().astype(np.int64))
        return self.encoder.run(None, dict(zip(self.names["encoder_inputs"], feeds, strict=True)))

    def step(
        self, tokens: torch.Tensor, attention_mask: np.ndarray, past: list[np.ndarray], cross: list[np.ndarray]
    ) -> tuple[torch.Tensor, list[np.ndarray]]:
        """Logits (R, V) of the next token after `tokens` (R, 1), and the keys/values with their position."""
        feeds = [tokens.cpu().numpy().astype(np.int64), attention_mask, *past, *cross]
        logits, *present = self.decoder.run(None, dict(zip(self.names["decoder_inputs"], feeds, strict=True)))
        return torch.from_numpy(logits), present

    def empty_past(self, rows: int) -> list[np.ndarray]:
        head_dim = self.config.d_model // self.config.num_heads
        shape = (rows, self.config.num_heads, 0, head_dim)
        return [np.zeros(shape, np.float32) for _ in range(2 * self.config.decoder_layers)]

    # ------------------------------------------------------------------------------------------------------------
    # settings

    def settings(self, **overrides) -> GenerationConfig:
        """The generation config with `overrides` (checked by transformers, as in generate()), refusing what this
        search does not reproduce."""
        config = copy.deepcopy(self.generation_config)
        # what generate() does: transformers' defaults where the saved config leaves a setting unset (None)
        config.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
        offset = per_sentence_offset(config, overrides)
        unknown = config.update(**overrides)
        if unknown:
            raise TypeError(f"OnnxTranslator.generate got unknown settings {sorted(unknown)}")
        for name, inert in UNSUPPORTED.items():
            if getattr(config, name, None) not in (None, inert, []):
                raise ValueError(
                    f"OnnxTranslator decodes with greedy or beam search, end tokens and length limits only: "
                    f"{name}={getattr(config, name)!r} is not supported"
                )
        if config.eos_token_id is None or config.decoder_start_token_id is None:
            raise ValueError("the generation config needs eos_token_id and decoder_start_token_id")
        setattr(config, SOURCE_LIMIT_FIELD, offset)
        return config

    def length_limits(
        self, config: GenerationConfig, eos: list[int], input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[int, LogitsProcessorList]:
        """max_length (the decoder start token included) and the length processors, in generate()'s order: the
        minimum lengths (transformers'), then the per-sentence limit (`SourceRelativeLengthMixin.generate`)."""
        processors = LogitsProcessorList()
        if config.min_length:
            processors.append(MinLengthLogitsProcessor(config.min_length, eos))
        if config.min_new_tokens:
            processors.append(MinNewTokensLengthLogitsProcessor(1, config.min_new_tokens, eos))
        if config.max_new_tokens is not None:
            return 1 + config.max_new_tokens, processors
        offset = getattr(config, SOURCE_LIMIT_FIELD, None)
        if offset is None:
            return config.max_length, processors
        lengths = source_lengths(input_ids, attention_mask)
        limits = sentence_limits(lengths, offset, self.config.max_position_embeddings)
        processors.append(SourceLengthLimit(limits, eos))
        return int(limits.max()) + 1, processors

    # ------------------------------------------------------------------------------------------------------------
    # search

    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **overrides
    ) -> torch.LongTensor:
        """Token ids as `model.generate(input_ids, attention_mask=attention_mask, **overrides)` returns them:
        (B * num_return_sequences, 1 + longest translation), the decoder start token first, padding after ends."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        vocab_size = self.config.vocab_size
        if input_ids.numel() and not 0 <= int(input_ids.min()) <= int(input_ids.max()) < vocab_size:
            bad = ((input_ids < 0) | (input_ids >= vocab_size)).nonzero()[0].tolist()
            raise IndexError(f"input_ids{bad} = {int(input_ids[tuple(bad)])}: ids must be in [0, {vocab_size})")
        config = self.settings(**overrides)
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        max_length, processors = self.length_limits(config, eos, input_ids, attention_mask)
        cross = self.encode(input_ids, attention_mask)
        mask = attention_mask.cpu().numpy().astype(np.int64)
        criteria = StoppingCriteriaList([MaxLengthCriteria(max_length), EosTokenCriteria(eos)])
        if config.num_beams > 1:
            return self._beam_search(cross, mask, config, eos, max_length, processors, criteria)
        return self._greedy(cross, mask, config, eos, max_length, processors, criteria)

    def _greedy(self, cross, mask, config, eos, max_length, processors, criteria) -> torch.LongTensor:
        """Arg-max decoding; a sentence leaves the decoder batch once it has ended (its row padded)."""
        batch_size = mask.shape[0]
        pad = config.pad_token_id if config.pad_token_id is not None else eos[0]  # transformers' pad fallback
        tokens = torch.full((batch_size, max_length), int(pad), dtype=torch.long)
        tokens[:, 0] = config.decoder_start_token_id
        open_rows, past, cur_len = torch.arange(batch_size), self.empty_past(batch_size), 1
        while True:
            logits, past = self.step(tokens[open_rows, cur_len - 1 : cur_len], mask, past, cross)
            scores = processors(tokens[open_rows, :cur_len], logits.float())
            tokens[open_rows, cur_len] = scores.argmax(dim=-1)
            cur_len += 1
            done = criteria(tokens[open_rows, :cur_len], None)
            if done.all():
                return tokens[:, :cur_len]
            if done.any():
                kept = (~done).nonzero().squeeze(1)
                open_rows = open_rows[kept]
                past, cross, (mask,) = select(past, kept), select(cross, kept), select([mask], kept)
                processors = keep_sentences(processors, kept)

    def _beam_search(self, cross, mask, config, eos, max_length, processors, criteria) -> torch.LongTensor:
        """transformers' beam search over the open sentences (`beam_search.CompactBeamSearchMixin`'s loop)."""
        beams = config.num_beams
        cross, mask = [np.repeat(array, beams, axis=0) for array in cross], np.repeat(mask, beams, axis=0)
        settings = BeamSettings(
            num_beams=beams,
            candidates=max(2, 1 + len(eos)) * beams,
            length_penalty=config.length_penalty,
            early_stopping=config.early_stopping,
            max_length=max_length,
            prompt_length=1,
        )
        start = torch.full((mask.shape[0], 1), config.decoder_start_token_id, dtype=torch.long)
        state = OpenSentences.start(start, settings, fill=config.pad_token_id or eos[0])  # transformers' `or`
        results = SearchResults.start(state)
        flat_running, past, cur_len = start, self.empty_past(mask.shape[0]), 1
        while True:
            logits, past = self.step(flat_running[:, -1:], mask, past, cross)
            log_probs = processors(flat_running, nn.functional.log_softmax(logits, dim=-1, dtype=torch.float32))
            scores, sequences, origins = state.expand(log_probs, settings, cur_len)
            open_count = len(state.sentences)
            stops = criteria(sequences[:, :, : cur_len + 1].flatten(0, 1), None).view(open_count, -1)
            state.advance(scores, sequences, origins, stops, settings, cur_len)
            rows = state.running_origins[..., cur_len - 1].flatten().long()  # the decoder row each beam continues
            cur_len += 1
            closed = results.closed_sentences(state, stops, settings)
            if closed is None:
                return results.finish(state, config.num_return_sequences, prompt_length=1)
            if closed.any():
                kept = results.close(state, closed)
                rows = rows.view(open_count, beams)[kept].flatten()
                cross, (mask,) = select(cross, rows), select([mask], rows)
                processors = keep_sentences(processors, kept)
            past = select(past, rows)
            flat_running = state.running[:, :, :cur_len].flatten(0, 1)

    # ------------------------------------------------------------------------------------------------------------
    # text

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            if not (self.model_dir / "tokenizer_config.json").exists():
                raise FileNotFoundError(f"{self.model_dir} was exported without a tokenizer; use generate()")
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        return self._tokenizer

    def translate(self, texts: Sequence[str], **overrides) -> list[str]:
        """Translate sentences with the export's tokenizer (num_return_sequences per sentence, in order)."""
        encoded = self.tokenizer(list(texts), padding=True, return_tensors="pt", return_token_type_ids=False)
        generated = self.generate(encoded["input_ids"], encoded["attention_mask"], **overrides)
        return self.tokenizer.batch_decode(generated, skip_special_tokens=True)


__all__ = ["UNSUPPORTED", "OnnxTranslator"]
