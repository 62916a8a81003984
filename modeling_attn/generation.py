"""Decoding shared by both model types: the paper's per-sentence output limit, and a beam search that stops
computing sentences whose search is over.

"We set the maximum output length during inference to input length + 50, but terminate early when possible"
(Vaswani et al., 2017, Sec. 6.1). `GenerationConfig.max_length` is one number for the whole batch, so a short
sentence batched with a long one would get the long one's limit, and its translation would depend on its batch.
Here the limit is per sentence: `generation_config.max_length_over_source = 50` (saved in generation_config.json)
makes `generate()` force the end-of-sentence token once a translation has `source length + 50` tokens (the end
token included; the source length counts the source's own tokens, padding excluded). It replaces the config's
`max_length`; an explicit `max_length` or `max_new_tokens` given to `generate()`, or `max_new_tokens` set in the
generation config, takes precedence over it.
A model with a position table (`config.max_position_embeddings`, the Transformer) caps the limit at the table's
size: the decoder has no position for a longer translation.

transformers' beam search keeps every sentence of a batch in the decoder until the last one is done: a sentence
whose best translations are final still has its beams run through the model at every step.
`CompactBeamSearchMixin._beam_search` is transformers' algorithm step for step (its own helper functions do the
scoring, selection and the early-stop test) on the sentences still open only: once none of a sentence's finished
beams can change, they are written out and its rows leave the decoder input, the cache and the encoder outputs. It
returns transformers' token ids for the settings it accepts; settings whose outputs, processors, criteria or cache
depend on the batch layout or on time (`return_dict_in_generate`, sampling, `synced_gpus`, `max_time`, logits
processors or stopping criteria it does not know to be per-row, static caches) go to transformers' own beam search.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation import logits_process
from transformers.generation import stopping_criteria as criteria
from transformers.generation.utils import ALL_CACHE_NAMES
from transformers.modeling_outputs import ModelOutput

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

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        per_row = self.limits.to(input_ids.device).repeat_interleave(input_ids.shape[0] // self.limits.shape[0])
        generated = input_ids.shape[-1] - 1  # the decoder start token is not part of the translation
        at_limit = generated >= per_row - 1  # the next token is the last one allowed: it must end the sentence
        if not at_limit.any():
            return scores
        eos = self.eos_token_ids.to(scores.device)
        forced = torch.full_like(scores, torch.finfo(scores.dtype).min)
        forced[:, eos] = scores[:, eos]
        return torch.where(at_limit[:, None], forced, scores)


def source_lengths(input_ids=None, attention_mask=None, inputs_embeds=None, encoder_outputs=None) -> torch.Tensor:
    """Tokens per source sentence: the attention mask's sum, else the full length of whatever holds the source."""
    if attention_mask is not None:
        return attention_mask.sum(-1).long()
    if encoder_outputs is not None:
        source = encoder_outputs[0]
    else:
        source = input_ids if input_ids is not None else inputs_embeds
    return torch.full((source.shape[0],), source.shape[1], dtype=torch.long, device=source.device)


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
        offset = kwargs.pop(SOURCE_LIMIT_FIELD, getattr(config, SOURCE_LIMIT_FIELD, None))
        explicit = "max_length" in kwargs or "max_new_tokens" in kwargs or config.max_new_tokens is not None
        if offset is None or explicit:
            return super().generate(inputs, generation_config, logits_processor, **kwargs)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
            raise ValueError(f"generation_config.{SOURCE_LIMIT_FIELD} must be a positive integer, got {offset!r}")
        eos_token_id = kwargs.get("eos_token_id", config.eos_token_id)
        if eos_token_id is None:
            raise ValueError(f"generation_config.{SOURCE_LIMIT_FIELD} needs an eos_token_id to end translations with")
        limits = (
            source_lengths(
                kwargs.get("input_ids", inputs),
                kwargs.get("attention_mask"),
                kwargs.get("inputs_embeds"),
                kwargs.get("encoder_outputs"),
            )
            + offset
        )
        positions = getattr(self.config, "max_position_embeddings", None)
        if positions is not None:  # the decoder has no position for a longer translation (start token at 0)
            limits = limits.clamp(max=positions)
        processors = LogitsProcessorList(logits_processor or [])
        processors.append(SourceLengthLimit(limits, eos_token_id))
        max_length = int(limits.max()) + 1  # one more position than the longest limit: the decoder start token
        if generation_config is None:
            return super().generate(inputs, None, processors, max_length=max_length, **kwargs)
        generation_config = copy.deepcopy(generation_config)  # the caller's object stays as it was
        generation_config.max_length = max_length
        return super().generate(inputs, generation_config, processors, **kwargs)


# Logits processors and stopping criteria that treat each row alone (a function of its own tokens and the step), so
# that dropping other rows from the batch cannot change what they do to a row; anything else goes to transformers.
ROW_LOCAL_PROCESSORS = tuple(
    getattr(logits_process, name)
    for name in (
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
        "NoRepeatNGramLogitsProcessor",
        "RepetitionPenaltyLogitsProcessor",
        "ForcedBOSTokenLogitsProcessor",
        "ForcedEOSTokenLogitsProcessor",
        "SuppressTokensLogitsProcessor",
        "SuppressTokensAtBeginLogitsProcessor",
        "NoBadWordsLogitsProcessor",
        "SequenceBiasLogitsProcessor",
        "InfNanRemoveLogitsProcessor",
        "ExponentialDecayLengthPenalty",
    )
    if hasattr(logits_process, name)
)
# MaxLength stops every row at once; EosToken looks at a row's last token. (MaxTime is left out: a faster search
# reaches its deadline at a later step.)
ROW_LOCAL_CRITERIA = tuple(
    getattr(criteria, name) for name in ("MaxLengthCriteria", "EosTokenCriteria") if hasattr(criteria, name)
)
# transformers' beam-search helpers this implementation runs (private API: a version without them falls back).
BEAM_HELPERS = (
    "_prefill",
    "_get_top_k_continuations",
    "_get_running_beams_for_next_iteration",
    "_update_finished_beams",
    "_check_early_stop_heuristic",
)
# The step-to-step inputs `select_rows` knows: per-row masks, encoder outputs and caches (and the use_cache flag).
KNOWN_MODEL_KWARGS = {"attention_mask", "decoder_attention_mask", "encoder_outputs", "use_cache", *ALL_CACHE_NAMES}


def rows_can_leave(cache: Cache) -> bool:
    """Whether `reorder_cache` with fewer rows than the cache has shrinks it and keeps it working: caches of
    transformers' dynamic layers, and caches that say so (`AttnRNNCache`); not static or quantized layers."""
    if isinstance(cache, EncoderDecoderCache):
        return rows_can_leave(cache.self_attention_cache) and rows_can_leave(cache.cross_attention_cache)
    if getattr(cache, "rows_can_leave", False):
        return True
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def select_rows(model_kwargs: dict, rows: torch.Tensor) -> dict:
    """Keep (and reorder) these decoder rows in everything generate() carries from step to step."""
    selected = dict(model_kwargs)
    for key, value in model_kwargs.items():
        if isinstance(value, Cache):
            value.reorder_cache(rows)  # every sub-cache, cross-attention included: rows leave, not just beams
        elif isinstance(value, torch.Tensor):  # the attention masks
            selected[key] = value.index_select(0, rows.to(value.device))
        elif isinstance(value, ModelOutput):  # encoder_outputs: (B*beams, S, E) tensors, or tuples of them
            selected[key] = type(value)(**{name: _select_tensors(field, rows) for name, field in value.items()})
    return selected


def _select_tensors(value, rows: torch.Tensor):
    if isinstance(value, torch.Tensor):
        return value.index_select(0, rows.to(value.device))
    return tuple(_select_tensors(item, rows) for item in value)


class CompactBeamSearchMixin:
    """transformers' beam search, run only on the sentences whose search is still open (module docstring)."""

    def _compact_beam_search_refusal(
        self,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        synced_gpus: bool,
        model_kwargs: dict,
    ) -> str | None:
        """Why this call must go to transformers' beam search (None: it need not)."""
        if not all(hasattr(type(self), name) for name in BEAM_HELPERS):
            return "this transformers version lacks the beam-search helpers"
        if generation_config.return_dict_in_generate:
            return "return_dict_in_generate: scores and beam indices are laid out over the whole batch"
        if generation_config.do_sample or synced_gpus or generation_config.low_memory:
            return "beam sampling, synced_gpus or low_memory"
        if not model_kwargs.get("use_cache") or set(model_kwargs) - KNOWN_MODEL_KWARGS:
            return "no cache, or model inputs this search does not know how to select rows of"
        if any(isinstance(value, Cache) and not rows_can_leave(value) for value in model_kwargs.values()):
            return "a cache that cannot drop rows (static or quantized layers)"
        # exact types: a subclass may override __call__ with per-batch logic
        if any(type(p) not in (*ROW_LOCAL_PROCESSORS, SourceLengthLimit) for p in logits_processor):
            return "a logits processor not known to be per-row"
        if any(isinstance(getattr(p, "prompt_ignore_length", None), torch.Tensor) for p in logits_processor):
            return "a repetition penalty with one prompt length per row"
        if any(type(c) not in ROW_LOCAL_CRITERIA for c in stopping_criteria):
            return "a stopping criterion not known to be per-row (or max_time)"
        return None

    def _beam_search(
        self,
        input_ids: torch.LongTensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        synced_gpus: bool = False,
        **model_kwargs,
    ):
        refusal = self._compact_beam_search_refusal(
            logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs
        )
        if refusal is not None:
            return super()._beam_search(
                input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, **model_kwargs
            )
        num_beams = generation_config.num_beams
        early_stopping = generation_config.early_stopping
        length_penalty = generation_config.length_penalty
        max_length = generation_config.max_length
        pad_token_id = generation_config._pad_token_tensor
        eos_token_id = generation_config._eos_token_tensor
        batch_size, prompt_length = input_ids.shape[0] // num_beams, input_ids.shape[1]
        device = input_ids.device
        # transformers' choices: keep enough candidates that num_beams of them do not end the sentence; fill the
        # unused positions with the pad token, or the end token when the pad id is 0 (its `or`)
        n_eos = eos_token_id.shape[0] if eos_token_id is not None else 0
        candidates = max(2, 1 + n_eos) * num_beams
        top_num_beams = torch.arange(candidates, device=device) < num_beams
        fill = (pad_token_id or eos_token_id[0]) if eos_token_id is not None else -1

        # The search state, one row per open sentence: (N, beams, ...) with N shrinking as sentences finish.
        running = torch.full((batch_size, num_beams, max_length), fill, dtype=torch.long, device=device)
        running[:, :, :prompt_length] = input_ids.view(batch_size, num_beams, prompt_length)
        finished = running.clone()
        running_scores = torch.zeros(batch_size, num_beams, dtype=torch.float, device=device)
        running_scores[:, 1:] = -1e9  # the beams of a sentence start identical: only the first one expands
        finished_scores = torch.full((batch_size, num_beams), -1e9, dtype=torch.float, device=device)
        is_finished = torch.zeros(batch_size, num_beams, dtype=torch.bool, device=device)
        may_improve = torch.ones(batch_size, 1, dtype=torch.bool, device=device)
        running_origins = torch.full((batch_size, num_beams, max_length - prompt_length), -1, dtype=torch.int32,
                                     device=device)  # fmt: skip
        finished_origins = running_origins.clone()
        sentences = torch.arange(batch_size, device=device)  # the batch index of each open sentence
        # The results, one row per sentence of the batch; and the two flags the stopping test reads for all of them.
        out_sequences, out_origins = finished.clone(), finished_origins.clone()
        all_may_improve = torch.ones(batch_size, dtype=torch.bool, device=device)
        all_full = torch.zeros(batch_size, dtype=torch.bool, device=device)

        flat_running = input_ids
        outputs = self._prefill(
            input_ids, generation_config, model_kwargs, is_first_iteration=not generation_config.is_assistant
        )
        cur_len = prompt_length
        while True:
            model_kwargs = self._update_model_kwargs_for_generation(
                outputs, model_kwargs, is_encoder_decoder=self.config.is_encoder_decoder
            )
            # transformers copies the logits to float32 first; log_softmax can cast them itself (same values), which
            # saves a copy of a (rows, vocabulary) tensor per step
            log_probs = nn.functional.log_softmax(outputs.logits[:, -1, :].to(device), dim=-1, dtype=torch.float32)
            del outputs
            log_probs = logits_processor(flat_running, log_probs)
            open_count = running.shape[0]
            log_probs = (log_probs.view(open_count, num_beams, -1) + running_scores[:, :, None]).view(open_count, -1)
            top_scores, top_sequences, top_origins = self._get_top_k_continuations(
                accumulated_log_probs=log_probs,
                running_sequences=running,
                running_beam_indices=running_origins,
                cur_len=cur_len,
                decoder_prompt_len=prompt_length,
                do_sample=False,
                beams_to_keep=candidates,
                num_beams=num_beams,
                batch_size=open_count,
            )
            stops = stopping_criteria(top_sequences[:, :, : cur_len + 1].flatten(0, 1), None)
            stops = stops.view(open_count, candidates)
            running, running_scores, running_origins = self._get_running_beams_for_next_iteration(
                topk_log_probs=top_scores,
                topk_running_sequences=top_sequences,
                topk_running_beam_indices=top_origins,
                next_token_hits_stopping_criteria=stops,
                num_beams=num_beams,
            )
            finished, finished_scores, finished_origins, is_finished = self._update_finished_beams(
                sequences=finished,
                topk_running_sequences=top_sequences,
                beam_scores=finished_scores,
                topk_log_probs=top_scores,
                beam_indices=finished_origins,
                topk_running_beam_indices=top_origins,
                is_early_stop_heuristic_unsatisfied=may_improve,
                is_sent_finished=is_finished,
                next_token_hits_stopping_criteria=stops,
                top_num_beam_mask=top_num_beams,
                num_beams=num_beams,
                cur_len=cur_len,
                decoder_prompt_len=prompt_length,
                length_penalty=length_penalty,
                early_stopping=early_stopping,
            )
            rows = running_origins[..., cur_len - prompt_length].flatten().long()  # the cache rows each beam continues
            cur_len += 1
            may_improve = self._check_early_stop_heuristic(
                is_early_stop_heuristic_unsatisfied=may_improve,
                running_beam_scores=running_scores,
                beam_scores=finished_scores,
                is_sent_finished=is_finished,
                cur_len=cur_len,
                max_length=max_length,
                decoder_prompt_len=prompt_length,
                early_stopping=early_stopping,
                length_penalty=length_penalty,
            )
            full = is_finished.all(dim=-1)
            all_may_improve[sentences], all_full[sentences] = may_improve[:, 0], full
            # transformers' stopping test over the whole batch (closed sentences keep the flags they closed with);
            # its "every candidate hit a stopping criterion" can only come from max_length here (end tokens are
            # fewer than the candidates), which stops the rows of closed sentences too.
            if not (all_may_improve.any() and not (all_full.all() and early_stopping is True) and not stops.all()):
                break
            # A sentence is closed when no finished beam can change any more: no improvement possible, or (with
            # early_stopping=True) all its beams finished.
            closed = ~may_improve[:, 0] | (full & (early_stopping is True))
            if closed.all():  # nothing can change any more (transformers would run on without effect)
                break
            if closed.any():
                out_sequences[sentences[closed]] = finished[closed]
                out_origins[sentences[closed]] = finished_origins[closed]
                keep = (~closed).nonzero().squeeze(1)
                rows = rows.view(open_count, num_beams)[keep].flatten()
                state = (running, running_scores, running_origins, finished, finished_scores, finished_origins,
                         is_finished, may_improve, sentences)  # fmt: skip
                (running, running_scores, running_origins, finished, finished_scores, finished_origins,
                 is_finished, may_improve, sentences) = (tensor[keep] for tensor in state)  # fmt: skip
                model_kwargs = select_rows(model_kwargs, rows)
                logits_processor = LogitsProcessorList(
                    p.select(keep) if isinstance(p, SourceLengthLimit) else p for p in logits_processor
                )
            else:
                cache_name = next(name for name in ALL_CACHE_NAMES if name in model_kwargs)
                if hasattr(self, "_reorder_cache"):
                    model_kwargs[cache_name] = self._reorder_cache(model_kwargs[cache_name], rows)
                else:
                    model_kwargs[cache_name].reorder_cache(rows)
            flat_running = running[:, :, :cur_len].flatten(0, 1)
            inputs = self.prepare_inputs_for_generation(flat_running, next_sequence_length=1, **model_kwargs)
            outputs = self(**inputs, return_dict=True)

        out_sequences[sentences], out_origins[sentences] = finished, finished_origins
        returned = generation_config.num_return_sequences
        sequences = out_sequences[:, :returned].flatten(0, 1)
        # transformers' crop: to the longest returned translation (its generated positions have an origin)
        generated = (out_origins[:, :returned] != -1).flatten(0, 1).sum(dim=1).max()
        return sequences[:, : prompt_length + generated]


__all__ = [
    "SOURCE_LIMIT_FIELD",
    "CompactBeamSearchMixin",
    "SourceLengthLimit",
    "SourceRelativeLengthMixin",
    "source_lengths",
]
