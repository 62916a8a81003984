"""The encoder-decoder scaffold both model types build on; each model file adds its own encoder and decoder.

- `EncoderDecoderPreTrainedModel`: safetensors-only loading (`loading.py`), saving with the code (`remote_code.py`).
- `EncoderDecoderModel`: one embedding matrix for source and target when `config.share_encoder_decoder_embeddings`
  (Vaswani et al. 2017, Sec. 3.4); `forward` runs the encoder (unless `encoder_outputs` are given), then the decoder.
- `EncoderDecoderForConditionalGeneration`: the output projection (tied to the target embeddings when
  `config.tie_word_embeddings`, Sec. 3.4), an optional fixed bias on the logits (Marian's), the decoder input built
  from `labels`, and the loss. Training settings are call-time arguments of `forward`, never config fields:
  `smoothing` (label smoothing, Sec. 5.4), `skip_logits`, `skip_output_layer`, guided alignment (Garg et al. 2019).
- `embed_inputs`: a stack's token embeddings from ids or given vectors, scaled, with whole-word dropout.

The loss is explained in docs/model.md; the cache argument's two names (transformers 5.24) are `compat.py`'s.

Shapes: B batch, S source length, T target length, E decoder output width, V target vocabulary.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import can_return_tuple

from .compat import CACHE_FIELD, cache_argument, with_cache
from .dropout import word_dropout
from .flops import training_flops
from .inputs import decoder_inputs_for_labels, labelled_prefix, lookup_embeddings, shift_tokens_right
from .loading import SafetensorsOnly
from .loss import (
    GUIDED_ALIGNMENT_WEIGHT,
    check_label_smoothing,
    check_skip_logits,
    guided_alignment_loss,
    labelled_token_loss,
    token_loss,
)
from .remote_code import save_with_remote_code


def alignment_attention(cross_attentions: tuple[torch.Tensor | None, ...], config) -> torch.Tensor:
    """The attention word alignments are read from and guided alignment supervises, (B, T, S), out of a forward's
    `cross_attentions`: one (B, H, T, S) tensor per decoder layer (Transformer) or the alignments alpha, (B, T, S)
    (RNN). For the Transformer, layer `config.alignment_layer` averaged over its first `config.alignment_heads`
    heads (0: all); a config without these fields (the RNN's) takes the last (only) layer."""
    layer = getattr(config, "alignment_layer", None)
    weights = cross_attentions[-1 if layer is None else layer] if cross_attentions else None
    if weights is None:
        raise ValueError(
            "no attention weights to align with: the Transformer returns them only with attn_implementation='eager' "
            "(from_pretrained(..., attn_implementation='eager') or model.set_attn_implementation('eager'))"
        )
    if weights.dim() == 4:  # (B, H, T, S)
        heads = getattr(config, "alignment_heads", 0) or weights.shape[1]
        weights = weights[:, :heads].mean(dim=1)
    return weights


def resized_vocabulary_size(
    current: int, new_num_tokens: int | None, pad_to_multiple_of: int | None, method: str = "resize_token_embeddings"
) -> int:
    """The vocabulary size `resize_token_embeddings(new_num_tokens, pad_to_multiple_of)` gives (transformers' rule:
    `new_num_tokens`, or the current size when None, rounded up to a multiple of `pad_to_multiple_of`)."""
    if pad_to_multiple_of is not None and not isinstance(pad_to_multiple_of, int):  # transformers' message
        raise ValueError(
            f"{method}: Asking to pad the embedding matrix to a multiple of `{pad_to_multiple_of}`, which is not and "
            "integer. Please make sure to pass an integer"
        )
    for name, value in (("new_num_tokens", new_num_tokens), ("pad_to_multiple_of", pad_to_multiple_of)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"{method}: {name} must be a positive integer or None, got {value!r}")
    size = current if new_num_tokens is None else new_num_tokens
    if pad_to_multiple_of is not None:
        size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
    return size


def check_resized_config(config, sizes: dict[str, int], method: str) -> None:
    """Raise, before anything changes, if the config with these vocabulary sizes (field -> size) would be invalid,
    e.g. a special token id no longer inside the vocabulary."""
    trial = copy.deepcopy(config)
    try:
        for field, size in sizes.items():
            setattr(trial, field, size)
        trial.validate()
    except Exception as error:
        changes = ", ".join(f"{field}={size}" for field, size in sizes.items())
        raise ValueError(f"{method}: {changes} would make the config invalid; nothing was changed. {error}") from error


def embed_inputs(
    stack: nn.Module,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    vocab_size: int,
    name: str,
    scale: float = 1.0,
    word_dropout_p: float = 0.0,
) -> torch.Tensor:
    """`stack.embed_tokens(input_ids)` (ids checked against `vocab_size`) or `inputs_embeds`, times `scale`; in
    training whole tokens are dropped with probability `word_dropout_p`. `name` prefixes argument names in errors."""
    embeds = lookup_embeddings(stack.embed_tokens, input_ids, inputs_embeds, vocab_size, name)
    if scale != 1.0:
        embeds = embeds * scale
    return word_dropout(embeds, word_dropout_p, stack.training)


class EncoderDecoderPreTrainedModel(SafetensorsOnly, PreTrainedModel):
    """Loading and saving shared by both model types; each model file names its two heads in `heads`."""

    base_model_prefix = "model"

    @staticmethod
    def heads() -> tuple[type, type]:
        """The base model class and the generation class, both listed in a saved checkpoint's `auto_map`."""
        raise NotImplementedError

    def save_pretrained(self, save_directory: str | Path, **kwargs) -> None:
        """Save weights (safetensors), config and code, with both heads in `auto_map` and the translation pipeline
        (`remote_code.save_with_remote_code`). All or nothing: the config and the vocabulary sizes are checked before
        any file is written, and a failure while writing leaves `save_directory` as it was."""
        self.check_vocabulary_sizes()
        self.config.validate()
        save_with_remote_code(self, save_directory, super().save_pretrained, *self.heads(), **kwargs)

    def floating_point_ops(self, input_dict: dict, exclude_embeddings: bool = True) -> float:
        """What Trainer adds to `total_flos` for a training batch: `flops.training_flops`, the project's formula on
        the real source and target tokens (transformers' own counts 6 x weights x padded source tokens)."""
        return training_flops(self, input_dict)

    def check_vocabulary_sizes(self) -> None:
        """Raise if an embedding matrix, the output layer or the logits bias does not have the size its config field
        says: such a checkpoint would not load (`resize_token_embeddings` keeps them in step)."""
        model, config = self.base_model, self.config
        matrices = [
            ("encoder.embed_tokens", getattr(getattr(model, "encoder", None), "embed_tokens", None), "vocab_size"),
            (
                "decoder.embed_tokens",
                getattr(getattr(model, "decoder", None), "embed_tokens", None),
                "decoder_vocab_size",
            ),
            ("lm_head", getattr(self, "lm_head", None), "decoder_vocab_size"),
        ]
        rows = [(name, module.weight.shape[0], field) for name, module, field in matrices if module is not None]
        if getattr(self, "final_logits_bias", None) is not None:
            rows.append(("final_logits_bias", self.final_logits_bias.shape[-1], "decoder_vocab_size"))
        for name, size, field in rows:
            if size != getattr(config, field):
                raise ValueError(
                    f"{type(self).__name__}: {name} has {size} vocabulary entries but config.{field} is "
                    f"{getattr(config, field)}, so a saved checkpoint would not load; change vocabulary sizes with "
                    "resize_token_embeddings / resize_decoder_token_embeddings, which keep both in step"
                )


class EncoderDecoderModel(EncoderDecoderPreTrainedModel):
    """Encoder and decoder without the output projection: returns the decoder's last hidden states.

    A subclass builds `self.encoder` and `self.decoder` (each with an `embed_tokens`) after `share_embeddings`.
    """

    def share_embeddings(self, shared: nn.Embedding | None) -> None:
        """Keep `shared` as the one source and target embedding matrix (None: separate ones), tied to both stacks'
        `embed_tokens`.

        Tied parameters, not one module registered three times: transformers marks tie targets as initialised when
        loading, which would hide a module-shared `shared.weight` missing from a checkpoint.
        """
        self.shared = shared
        if shared is not None:
            self._tied_weights_keys = {
                "encoder.embed_tokens.weight": "shared.weight",
                "decoder.embed_tokens.weight": "shared.weight",
            }

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        # transformers applies _tied_weights_keys only when tie_word_embeddings is set; sharing the source and
        # target embeddings follows share_encoder_decoder_embeddings alone.
        tied = super().get_expanded_tied_weights_keys(all_submodels)
        if not all_submodels and self.config.share_encoder_decoder_embeddings:
            tied.update(self._tied_weights_keys)
        return tied

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if self.config.share_encoder_decoder_embeddings:
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Resize the source vocabulary (transformers' arguments and rules: rows added at the end, initialised from
        the old rows' mean and covariance with `mean_resizing`, or removed from the end).

        With one vocabulary (`config.joint_vocabulary`: source and target ids are one tokenizer's) both sides change:
        the source and target embeddings (one matrix with `share_encoder_decoder_embeddings`, else each),
        `config.vocab_size` and `config.decoder_vocab_size`; the generation head also resizes its output layer. With
        two vocabularies only the encoder's and `config.vocab_size` change (as MarianMTModel);
        `resize_decoder_token_embeddings` resizes the target side. A size that would leave a special token id outside
        its vocabulary raises before anything changes.
        """
        config = self.config
        if config.share_encoder_decoder_embeddings:
            embeddings = [self.shared]
        elif config.joint_vocabulary:
            embeddings = [self.encoder.embed_tokens, self.decoder.embed_tokens]
        else:
            embeddings = [self.encoder.embed_tokens]
        sides = ("vocab_size", "decoder_vocab_size") if config.joint_vocabulary else ("vocab_size",)
        self._resize_vocabulary(embeddings, sides, new_num_tokens, pad_to_multiple_of, mean_resizing)
        return self.get_input_embeddings()

    def resize_decoder_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Resize the target vocabulary of a model with two vocabularies: the decoder's embeddings and
        `config.decoder_vocab_size` (the generation head also resizes its output layer); as `resize_token_embeddings`
        otherwise."""
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError(
                "resize_decoder_token_embeddings: source and target share one embedding matrix "
                "(config.share_encoder_decoder_embeddings=True); resize both with resize_token_embeddings"
            )
        if self.config.joint_vocabulary:
            raise ValueError(
                "resize_decoder_token_embeddings: source and target ids are one vocabulary (config.joint_vocabulary="
                "True); resize both with resize_token_embeddings"
            )
        embedding, side = self.decoder.embed_tokens, ("decoder_vocab_size",)
        self._resize_vocabulary([embedding], side, new_num_tokens, pad_to_multiple_of, mean_resizing)
        return embedding

    def _resize_vocabulary(self, embeddings, fields, new_num_tokens, pad_to_multiple_of, mean_resizing) -> None:
        """Resize each of `embeddings` in place (so ties, hooks and `requires_grad` stay) and set the config
        `fields`, after checking that the config with the new size is valid."""
        if new_num_tokens is None and pad_to_multiple_of is None:
            return
        method = "resize_token_embeddings" if "vocab_size" in fields else "resize_decoder_token_embeddings"
        size = resized_vocabulary_size(embeddings[0].num_embeddings, new_num_tokens, pad_to_multiple_of, method)
        check_resized_config(self.config, dict.fromkeys(fields, size), method)
        for embedding in embeddings:
            self._get_resized_embeddings(embedding, size, mean_resizing=mean_resizing)
        for field in fields:
            setattr(self.config, field, size)
        if "vocab_size" in fields:
            self.vocab_size = size  # as transformers' resize_token_embeddings sets it
        self.tie_weights()  # the stacks' embed_tokens follow the shared matrix
        for stack in (self.encoder, self.decoder):
            if any(stack.embed_tokens.weight is embedding.weight for embedding in embeddings):
                stack.embed_tokens.num_embeddings = size

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        past_key_values = cache_argument(past_key_values, cache)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return with_cache(
            Seq2SeqModelOutput,
            getattr(decoder_outputs, CACHE_FIELD),
            last_hidden_state=decoder_outputs.last_hidden_state,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class EncoderDecoderForConditionalGeneration(EncoderDecoderPreTrainedModel):
    """An `EncoderDecoderModel` with its output projection: a translation model (module docstring for the loss).

    A subclass calls `add_output_layer` with its base model in `__init__`.
    """

    def add_output_layer(self, model: EncoderDecoderModel, width: int) -> None:
        """`self.model`, and `self.lm_head` from its `width`-wide decoder output to the target vocabulary, tied to
        the target embeddings (Sec. 3.4) when `config.tie_word_embeddings`. With `config.final_logits_bias` (Marian's)
        a fixed (1, V) bias is added to the logits: saved, not trained, as Marian keeps it."""
        config = self.config
        self.model = model
        self.lm_head = nn.Linear(width, config.decoder_vocab_size, bias=False)
        bias = torch.zeros(1, config.decoder_vocab_size) if getattr(config, "final_logits_bias", False) else None
        self.register_buffer("final_logits_bias", bias)
        source = (
            "model.shared.weight" if config.share_encoder_decoder_embeddings else "model.decoder.embed_tokens.weight"
        )
        self._tied_weights_keys = {"lm_head.weight": source}

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """`EncoderDecoderModel.resize_token_embeddings`; with one vocabulary (`config.joint_vocabulary`) the output
        layer (and the logits bias) follows it."""
        embedding = self.model.resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if self.config.joint_vocabulary:
            self._resize_output_layer(mean_resizing)
        self.vocab_size = self.config.vocab_size
        return embedding

    def resize_decoder_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """`EncoderDecoderModel.resize_decoder_token_embeddings`, with the output layer (and the logits bias)."""
        embedding = self.model.resize_decoder_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self._resize_output_layer(mean_resizing)
        return embedding

    def _resize_output_layer(self, mean_resizing: bool) -> None:
        """`lm_head` and `final_logits_bias` to `config.decoder_vocab_size` rows: tied, the head is the target
        embedding matrix again; untied, it is resized as transformers resizes an output layer; added logits biases
        are 0 (as MarianMTModel)."""
        size = self.config.decoder_vocab_size
        if self.config.tie_word_embeddings:
            self.tie_weights()  # lm_head.weight is the (resized) target embedding matrix
            self.lm_head.out_features = size
        elif self.lm_head.weight.shape[0] != size:
            old = self.lm_head
            new = self._get_resized_lm_head(old, size, mean_resizing=mean_resizing)
            new.requires_grad_(old.weight.requires_grad)
            if hasattr(old, "_hf_hook"):  # accelerate's device hook, as transformers keeps it
                from accelerate.hooks import add_hook_to_module

                add_hook_to_module(new, old._hf_hook)
            self.lm_head = new
        bias = self.final_logits_bias
        if bias is not None and bias.shape[-1] != size:
            kept = bias[:, :size]
            self.final_logits_bias = torch.cat([kept, kept.new_zeros(1, size - kept.shape[-1])], dim=-1)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def output_layer(self) -> tuple[nn.Module, torch.Tensor | None]:
        """What turns the decoder's output into logits: `lm_head`, and the (V,) logits bias or None."""
        return self.lm_head, self.final_logits_bias[0] if self.final_logits_bias is not None else None

    def _logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        output_layer, bias = self.output_layer()
        logits = output_layer(hidden_states)
        return logits + bias if bias is not None else logits

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        skip_logits: bool = False,
        smoothing: float = 0.0,
        cache: Cache | None = None,
        alignment: torch.Tensor | None = None,
        alignment_weight: float = GUIDED_ALIGNMENT_WEIGHT,
        skip_output_layer: bool = False,
        **kwargs,
    ) -> Seq2SeqLMOutput | Seq2SeqModelOutput:
        past_key_values = cache_argument(past_key_values, cache)
        check_skip_logits(skip_logits, labels)
        if skip_output_layer and (skip_logits or alignment is not None):
            raise ValueError(
                "skip_output_layer=True returns the decoder's output, no loss: drop skip_logits, alignment"
            )
        check_label_smoothing(smoothing)
        if alignment is not None:
            if labels is None:
                raise ValueError("alignment (reference links for guided alignment training) needs labels")
            kwargs["output_attentions"] = True  # the supervised attention
        if labels is not None:
            use_cache = False
            decoder_input_ids = decoder_inputs_for_labels(
                labels, self.config, decoder_input_ids, decoder_inputs_embeds
            )
            targets = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
            if decoder_attention_mask is None and targets.shape[:2] == labels.shape:
                decoder_attention_mask = labelled_prefix(labels)  # positions after the last label are padding
        outputs: Seq2SeqModelOutput = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            **{CACHE_FIELD: past_key_values},
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        if skip_output_layer:  # a loss computed outside from the decoder's output (R-Drop's, in TranslationTrainer)
            return outputs
        hidden_states = outputs.last_hidden_state  # (B, T, E)
        logits = loss = None
        if skip_logits:  # only the labelled positions need the output projection
            loss = labelled_token_loss(hidden_states, labels, *self.output_layer(), num_items_in_batch, smoothing)
        else:
            logits = self._logits(hidden_states)  # (B, T, V)
            if labels is not None:
                loss = token_loss(logits, labels, num_items_in_batch, smoothing)
        if alignment is not None:  # Garg et al. 2019: translation loss + weight * alignment loss
            attention = alignment_attention(outputs.cross_attentions, self.config)
            loss = loss + alignment_weight * guided_alignment_loss(attention, alignment, labels, num_items_in_batch)
        return with_cache(
            Seq2SeqLMOutput,
            getattr(outputs, CACHE_FIELD),
            loss=loss,
            logits=logits,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


__all__ = [
    "alignment_attention",
    "EncoderDecoderForConditionalGeneration",
    "EncoderDecoderModel",
    "EncoderDecoderPreTrainedModel",
    "check_resized_config",
    "embed_inputs",
    "resized_vocabulary_size",
]
