"""Several translation models decoding as one: `AttnEnsemble`, whose `generate()` runs one search over their average.

The members are models of ours (`attn_transformer`, `attn_rnn`, mixed allowed) that share one target vocabulary.
At every step each member runs its own decoder with its own cache on the same hypotheses, and the ensemble's next-token
distribution combines the members' log-probabilities log p_i with weights w_i (summing to 1):
- `log_linear` (default; Marian, OpenNMT-py): sum_i w_i log p_i, renormalised (a weighted geometric mean);
- `linear` (fairseq, Sockeye's default): log sum_i w_i p_i (a weighted mean of the probabilities).
The encoders run once per member and sentence (`AttnEnsembleEncoder`). `AttnEnsemble` is a transformers model whose
`forward` returns that combination as its logits and an `AttnEnsembleCache` holding the members' caches, so that
transformers' `generate()` and this package's own beam search (`modeling_attn.beam_search`) drive it: greedy, beam
search with length penalty and n-best, and sampling are the single-model code paths, and a one-member ensemble
gives the model's own tokens and scores. The decoding settings (beam size, length penalty, length limit) are the first
member's `generation_config`. `load_ensemble` loads model folders (or the last checkpoints of a training run) with
one tokenizer, refusing members whose vocabularies differ, naming both. Word alignments of an ensemble's translation
are the average of its members' alignment attention (`modeling_attn.api.alignment.forced_attention`); attention
pictures are not drawn for an ensemble (refused by the command); docs/translate-evaluate.md, "Ensembles".
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutput, ModelOutput, Seq2SeqLMOutput

from ..beam_search import CompactBeamSearchMixin, rows_can_leave
from ..compat import CACHE_FIELD, cache_argument
from ..generation import SourceRelativeLengthMixin
from ..registry import MODEL_TYPES
from .choices import COMBINATIONS
from .translation import TranslateError, load_model

# decoding settings that must agree between members for the first member's generation_config to fit them all
SHARED_TOKENS = ("pad_token_id", "eos_token_id", "decoder_start_token_id")


class EnsembleError(TranslateError):
    """Models that cannot decode together (different vocabularies, bad weights); the message names them."""


def find_checkpoints(output_dir: str | Path) -> list[Path]:
    """The `checkpoint-<step>` folders of a training output folder, oldest first."""
    folders = [
        p for p in Path(output_dir).glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name) and p.is_dir()
    ]
    return sorted(folders, key=lambda p: int(p.name.split("-")[1]))


def last_checkpoints(run: str | Path, count: int) -> list[str]:
    """The newest `count` checkpoints of the training run `run`, oldest first; EnsembleError if it has fewer."""
    found = find_checkpoints(run) if Path(run).is_dir() else []
    if count < 1 or len(found) < count:
        raise EnsembleError(
            f"--last_checkpoints {count}: {run} has {len(found)} checkpoint-<step> folders; give at most {len(found)}"
            if count >= 1
            else f"--last_checkpoints {count}: give a positive number of checkpoints"
        )
    return [str(path) for path in found[-count:]]


def member_paths(models: Sequence[str], last: int | None = None) -> list[str]:
    """The members' folders: the `--model` flags, or the `last` checkpoints of the one run folder given."""
    if last is None:
        return list(models)
    if len(models) != 1:
        raise EnsembleError(f"--last_checkpoints {last}: give one --model, the training run's output folder")
    return last_checkpoints(models[0], last)


def parse_weights(text: str | None, count: int) -> list[float] | None:
    """`--ensemble_weights 2,1` as numbers, one per member (None: equal weights)."""
    if text is None:
        return None
    try:
        weights = [float(item) for item in text.split(",")]
    except ValueError:
        raise EnsembleError(f"--ensemble_weights {text}: give numbers separated by commas (2,1)") from None
    if len(weights) != count:
        raise EnsembleError(f"--ensemble_weights {text}: {len(weights)} weights for {count} models; give one each")
    return weights


def _name(model: PreTrainedModel, index: int) -> str:
    return getattr(model, "name_or_path", "") or f"member {index}"


def _target_vocabulary(config: PretrainedConfig) -> int:
    size = getattr(config, "decoder_vocab_size", None)
    return config.vocab_size if size is None else size


def check_members(members: Sequence[PreTrainedModel], weights: Sequence[float] | None) -> list[float]:
    """EnsembleError unless the members are models of ours with one target vocabulary (size and special tokens) and
    `weights` are one finite positive number per member; the weights, normalised to sum to 1."""
    if not members:
        raise EnsembleError("an ensemble needs at least one model")
    for index, member in enumerate(members):
        if getattr(member.config, "model_type", None) not in MODEL_TYPES:
            raise EnsembleError(f"{_name(member, index)}: not a model of ours ({member.config.model_type})")
    first = members[0]
    for index, member in enumerate(members[1:], start=1):
        for field, read in (("target vocabulary size", _target_vocabulary), *((t, None) for t in SHARED_TOKENS)):
            ours = read(first.config) if read else getattr(first.generation_config, field, None)
            theirs = read(member.config) if read else getattr(member.generation_config, field, None)
            if ours != theirs:
                raise EnsembleError(
                    f"{_name(first, 0)} and {_name(member, index)} have different vocabularies ({field} {ours} and "
                    f"{theirs}): an ensemble averages distributions over one target vocabulary"
                )
    if weights is None:
        return [1.0 / len(members)] * len(members)
    if len(weights) != len(members):
        raise EnsembleError(f"--ensemble_weights: {len(weights)} weights for {len(members)} models; give one each")
    if not all(isinstance(w, int | float) and math.isfinite(w) and w > 0 for w in weights):
        raise EnsembleError(f"--ensemble_weights {' '.join(map(str, weights))}: each weight must be a positive number")
    return [w / sum(weights) for w in weights]


def check_same_tokenizer(tokenizers: Sequence[PreTrainedTokenizerBase], paths: Sequence[str]) -> None:
    """EnsembleError naming both models if two members' tokenizers map text to different ids."""
    vocabulary = tokenizers[0].get_vocab()
    for tokenizer, path in zip(tokenizers[1:], paths[1:], strict=True):
        if tokenizer.get_vocab() != vocabulary:
            raise EnsembleError(
                f"{paths[0]} and {path} have different vocabularies (their tokenizers differ): an ensemble's "
                "members read the same token ids"
            )


@dataclass
class AttnEnsembleEncoderOutput(ModelOutput):
    """The members' encoder outputs; `last_hidden_state` is the first member's (generate() reads its shape)."""

    last_hidden_state: torch.Tensor | None = None  # (B, S, E_0)
    member_states: tuple[torch.Tensor, ...] | None = None  # one (B, S, E_i) per member


class AttnEnsembleEncoder(nn.Module):
    """Every member's encoder, once per sentence."""

    main_input_name = "input_ids"

    def __init__(self, members: nn.ModuleList):
        super().__init__()
        self.members = members

    def forward(self, input_ids=None, attention_mask=None, **kwargs) -> AttnEnsembleEncoderOutput:
        kwargs.update(return_dict=True, output_attentions=False, output_hidden_states=False)
        states = tuple(
            member.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
            for member in self.members
        )
        return AttnEnsembleEncoderOutput(last_hidden_state=states[0], member_states=states)


class AttnEnsembleCache(Cache):
    """Each member's own decoder cache (None before the first step); beam search reorders them all."""

    def __init__(self, count: int):
        super().__init__(layers=[])
        self.members: list[Cache | None] = [None] * count

    @property
    def rows_can_leave(self) -> bool:  # read by modeling_attn.beam_search
        return all(cache is None or rows_can_leave(cache) for cache in self.members)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.members[0] is None else self.members[0].get_seq_length()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for cache in self.members:
            if cache is not None:
                cache.reorder_cache(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for cache in self.members:
            if cache is not None:
                cache.batch_select_indices(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        for cache in self.members:
            if cache is not None:
                cache.batch_repeat_interleave(repeats)

    @property
    def is_croppable(self) -> bool:
        return False


class AttnEnsemble(SourceRelativeLengthMixin, CompactBeamSearchMixin, PreTrainedModel, GenerationMixin):
    """N translation models of one target vocabulary as one model (module docstring): `generate()` as any of ours.

    `weights` (default: equal) weigh the members; `combine` is `log_linear` or `linear`. The config and
    `generation_config` are copies of the first member's, with `max_position_embeddings` the smallest of the
    members' (an RNN has none).
    """

    config_class = PretrainedConfig
    base_model_prefix = "ensemble"
    main_input_name = "input_ids"

    def __init__(
        self,
        members: Sequence[PreTrainedModel],
        weights: Sequence[float] | None = None,
        combine: str = "log_linear",
    ):
        normalised = check_members(members, weights)
        if combine not in COMBINATIONS:
            raise EnsembleError(f"--ensemble_combine {combine}: one of {', '.join(COMBINATIONS)}")
        config = copy.deepcopy(members[0].config)
        positions = [m.config.max_position_embeddings for m in members if hasattr(m.config, "max_position_embeddings")]
        if positions:
            config.max_position_embeddings = min(positions)
        config._attn_implementation = "eager"  # the ensemble's own (it has no attention; each member keeps its own)
        super().__init__(config)
        self.members = nn.ModuleList(members)
        self.combine = combine
        self.register_buffer("log_weights", torch.tensor(normalised).log(), persistent=False)
        self.generation_config = copy.deepcopy(members[0].generation_config)
        self._is_stateful = any(getattr(m, "_is_stateful", False) for m in members)
        self.eval()

    @property
    def weights(self) -> list[float]:
        return self.log_weights.exp().tolist()

    def get_encoder(self, *args, **kwargs) -> AttnEnsembleEncoder:
        """The members' encoders as one module (made on each call: members replaced by quantization are seen)."""
        return AttnEnsembleEncoder(self.members)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """generate() builds no cache: forward creates an `AttnEnsembleCache`, each member's own cache inside."""
        return False

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **model_kwargs):
        """transformers' expansion for beams and samples, and of every member's encoder output too."""
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size, is_encoder_decoder, input_ids, **model_kwargs
        )
        encoder_outputs = model_kwargs.get("encoder_outputs")
        if expand_size > 1 and isinstance(encoder_outputs, AttnEnsembleEncoderOutput):
            encoder_outputs.member_states = tuple(
                state.repeat_interleave(expand_size, dim=0) for state in encoder_outputs.member_states
            )
        return input_ids, model_kwargs

    def _reorder_cache(self, cache: AttnEnsembleCache, beam_idx: torch.Tensor) -> AttnEnsembleCache:
        """Beam search: each member reorders its own cache as it does alone."""
        for index, member in enumerate(self.members):
            if hasattr(member, "_reorder_cache"):
                cache.members[index] = member._reorder_cache(cache.members[index], beam_idx)
            else:
                cache.members[index].reorder_cache(beam_idx)
        return cache

    def generate(self, inputs=None, generation_config: GenerationConfig | None = None, *args, **kwargs):
        """transformers' generate() (with the per-sentence length limit), refusing a `cache_implementation`: each
        member builds its own cache."""
        config = generation_config if generation_config is not None else self.generation_config
        implementation = kwargs.get("cache_implementation", config.cache_implementation)
        if implementation not in (None, "dynamic"):
            raise ValueError(
                f"an ensemble takes no cache_implementation={implementation!r}: each member builds its own cache"
            )
        return super().generate(inputs, generation_config, *args, **kwargs)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        encoder_outputs: AttnEnsembleEncoderOutput | None = None,
        cache: AttnEnsembleCache | None = None,
        past_key_values: AttnEnsembleCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """The combined next-token log-probabilities of the members, (B, T, V), as `logits`."""
        if output_attentions:
            raise NotImplementedError("an ensemble returns no attention weights (docs/translate-evaluate.md)")
        if encoder_outputs is None:
            encoder_outputs = self.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        cache = cache_argument(past_key_values, cache)
        if use_cache and cache is None:
            cache = AttnEnsembleCache(len(self.members))
        log_probs = []
        for index, member in enumerate(self.members):
            # every member (ours, Marian) takes the cache under the installed transformers' name (compat.py)
            member_cache = {} if cache is None else {CACHE_FIELD: cache.members[index]}
            outputs = member(
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids,
                encoder_outputs=BaseModelOutput(last_hidden_state=encoder_outputs.member_states[index]),
                use_cache=use_cache,
                **member_cache,
                **kwargs,
            )
            if cache is not None:
                cache.members[index] = outputs[CACHE_FIELD]
            log_probs.append(nn.functional.log_softmax(outputs.logits, dim=-1, dtype=torch.float32))
        stacked = torch.stack(log_probs)  # (N, B, T, V)
        weights = self.log_weights.to(stacked.device).view(-1, 1, 1, 1)
        if self.combine == "linear":
            logits = torch.logsumexp(stacked + weights, dim=0)
        else:
            logits = (stacked * weights.exp()).sum(dim=0)
        return Seq2SeqLMOutput(logits=logits, **{CACHE_FIELD: cache if use_cache else None})


def describe_ensemble(ensemble: AttnEnsemble) -> dict:
    """The members (their folders), weights and combination, for a command's JSON report."""
    return {
        "members": [member.name_or_path for member in ensemble.members],
        "weights": [round(weight, 6) for weight in ensemble.weights],
        "combine": ensemble.combine,
    }


def load_ensemble(
    paths: Sequence[str],
    device: str | None = None,
    weights: Sequence[float] | None = None,
    combine: str = "log_linear",
    quantize_member=None,
    eager: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The models in `paths` (folders or Hub repos) as one `AttnEnsemble`, or the model itself for one path with no
    weights; with the first member's tokenizer, after checking that every member's tokenizer is the same.
    `quantize_member` (e.g. `--quantize int8`) is applied to each member; `eager` loads each with the eager
    attention (`load_model`), for word alignments."""
    loaded = [load_model(path, device, eager=eager) for path in paths]
    check_same_tokenizer([tokenizer for _, tokenizer in loaded], list(paths))
    members = [model for model, _ in loaded]
    model = members[0] if len(members) == 1 and weights is None else AttnEnsemble(members, weights, combine)
    return (model if quantize_member is None else each_member(model, quantize_member)), loaded[0][1]


def each_member(model: PreTrainedModel, change) -> PreTrainedModel:
    """`change(model)`, or for an ensemble, each member replaced by `change(member)` (int8 quantizes each member)."""
    if not isinstance(model, AttnEnsemble):
        return change(model)
    for index, member in enumerate(model.members):
        model.members[index] = change(member)
    return model


__all__ = [
    "COMBINATIONS",
    "AttnEnsemble",
    "AttnEnsembleCache",
    "AttnEnsembleEncoder",
    "AttnEnsembleEncoderOutput",
    "EnsembleError",
    "check_members",
    "check_same_tokenizer",
    "describe_ensemble",
    "each_member",
    "find_checkpoints",
    "last_checkpoints",
    "load_ensemble",
    "member_paths",
    "parse_weights",
]
