"""Input checks and decoder inputs, shared by both model types.

Bad input raises with a message naming the argument, the offending value and the expected range or
shape; nothing is clipped or ignored silently.
"""

from __future__ import annotations

import torch
from transformers.utils import is_torchdynamo_compiling


def check_ids_in_vocabulary(
    token_ids: torch.Tensor, vocab_size: int, name: str, ignore_index: int | None = None
) -> None:
    """Raise if `token_ids` is empty, not integer, or holds an id outside [0, vocab_size)."""
    if token_ids.dim() != 2 or token_ids.shape[0] == 0 or token_ids.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty (batch, length) tensor, got shape {tuple(token_ids.shape)}")
    if token_ids.is_floating_point() or token_ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {token_ids.dtype}")
    if is_torchdynamo_compiling():
        return
    ids = token_ids if ignore_index is None else token_ids[token_ids != ignore_index]
    if ids.numel() == 0:
        return
    low, high = ids.min().item(), ids.max().item()
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        where = (token_ids == bad).nonzero()[0].tolist()
        allowed = f"[0, {vocab_size})" + (f" or {ignore_index}" if ignore_index is not None else "")
        hint = (
            " (tokens added to a tokenizer need model.resize_token_embeddings, and a separate target vocabulary "
            "model.resize_decoder_token_embeddings)"
            if bad >= vocab_size
            else ""
        )
        raise IndexError(
            f"{name} holds token id {bad} at (batch, position) {tuple(where)}; ids must be in {allowed}{hint}"
        )


def check_attention_mask(
    mask: torch.Tensor | None, expected: tuple[int, int] | torch.Size, name: str, require_token: bool = False
) -> None:
    """Raise if a 2D padding mask does not have the (batch, length) shape of the tokens it masks, holds values
    other than 0 and 1 (an integer 2 would silently count as 1), or, with `require_token`, masks a whole row."""
    if mask is None or mask.dim() == 4:  # 4D masks are taken as prepared by the caller
        return
    if mask.dim() != 2 or tuple(mask.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected (batch, length) = {tuple(expected)}")
    if is_torchdynamo_compiling():
        return
    if mask.dtype != torch.bool and ((mask != 0) & (mask != 1)).any():
        bad = ((mask != 0) & (mask != 1)).nonzero()[0].tolist()
        raise ValueError(
            f"{name} must hold 0 (padding) and 1 (token) only, got {mask[bad[0], bad[1]].item()} at "
            f"(batch, position) {tuple(bad)}"
        )
    if require_token and not mask.bool().any(dim=1).all():
        row = (~mask.bool().any(dim=1)).nonzero()[0].item()
        raise ValueError(f"{name} row {row} masks every token; each sentence needs at least one")


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder input for teacher forcing: labels shifted one step right behind the start token, -100 -> pad."""
    if pad_token_id is None or decoder_start_token_id is None:
        raise ValueError("config.pad_token_id and config.decoder_start_token_id must be set to build decoder inputs")
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def decoder_inputs_for_labels(
    labels: torch.Tensor, config, decoder_input_ids: torch.Tensor | None, decoder_inputs_embeds: torch.Tensor | None
) -> torch.Tensor | None:
    """Check `labels` against the target vocabulary; the decoder input is `labels` shifted right unless given."""
    check_ids_in_vocabulary(labels, config.decoder_vocab_size, "labels", ignore_index=-100)
    if decoder_input_ids is None and decoder_inputs_embeds is None:
        return shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
    return decoder_input_ids


def labelled_prefix(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) 0/1 mask of the decoder positions up to each row's last labelled (non -100) one.

    Positions after it are right padding: they feed no loss and, the decoder being causal, no earlier position.
    Position 0 always counts, so no row is all padding. -100 inside a row stays kept (a later label attends to it).
    """
    positions = torch.arange(labels.shape[1], device=labels.device)
    last = torch.where(labels != -100, positions, 0).amax(dim=1, keepdim=True)
    return (positions <= last).long()


def lookup_embeddings(
    embedding: torch.nn.Embedding,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    vocab_size: int,
    name: str = "",
) -> torch.Tensor:
    """The (B, L, width) input of a stack: `embedding(input_ids)` after checking the ids, or `inputs_embeds`.

    Exactly one of the two must be given; `name` prefixes the argument names in errors ("decoder_").
    """
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"pass exactly one of {name}input_ids and {name}inputs_embeds")
    if inputs_embeds is None:
        check_ids_in_vocabulary(input_ids, vocab_size, f"{name}input_ids")
        return embedding(input_ids)
    if inputs_embeds.dim() != 3 or inputs_embeds.shape[0] == 0 or inputs_embeds.shape[1] == 0:
        raise ValueError(
            f"{name}inputs_embeds must be a non-empty (batch, length, width) tensor, got shape "
            f"{tuple(inputs_embeds.shape)}"
        )
    if inputs_embeds.shape[-1] != embedding.embedding_dim:
        raise ValueError(
            f"{name}inputs_embeds has width {inputs_embeds.shape[-1]}, but the model's embeddings have "
            f"{embedding.embedding_dim} (shape {tuple(inputs_embeds.shape)})"
        )
    return inputs_embeds


def check_encoder_states(encoder_hidden_states: torch.Tensor, batch_size: int, width: int) -> None:
    """Raise if the encoder output does not fit the decoder input: same batch, the model's width."""
    if encoder_hidden_states.dim() != 3 or encoder_hidden_states.shape[0] != batch_size:
        raise ValueError(
            f"the decoder input (decoder_input_ids, labels or decoder_inputs_embeds) has batch size {batch_size}, "
            f"but the encoder output (from input_ids or encoder_outputs) has shape "
            f"{tuple(encoder_hidden_states.shape)}"
        )
    if encoder_hidden_states.shape[-1] != width:
        raise ValueError(
            f"encoder_outputs have width {encoder_hidden_states.shape[-1]}, expected d_model={width} "
            f"(shape {tuple(encoder_hidden_states.shape)})"
        )
