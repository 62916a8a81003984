"""The training FLOPs of a batch: the project's one FLOP formula (`FLOP_FORMULA`), counted on real tokens only.

What Trainer's `total_flos` adds up (`EncoderDecoderPreTrainedModel.floating_point_ops`), and what MFU divides by
(bench/gpu.py, `attn train`'s last line on a known GPU). The matmul FLOPs of each sentence with its own source
length s and target length t (end token included): padding counts nothing, so a model that skips padding and one
that computes it are credited the same useful work, and MFU is not inflated by padded positions.
"""

from __future__ import annotations

import torch

FLOP_FORMULA = (
    "per training step, 3 x the forward matmul FLOPs of each sentence's real tokens (source length s, target length "
    "t with EOS; E = d_model, F = d_ff, V = target vocabulary; padding counts nothing): encoder_layers x "
    "[2s(4E^2 + 2EF) + 4s^2 E] + decoder_layers x [2t(4E^2 + 2EF) + 2(2tE^2 + 2sE^2) + 4t(t + s)E] + 2tEV "
    "(projections and FFN, attention scores and weighted sums with the causal half counted in full, cross-attention, "
    "output layer; embeddings, norms, softmax and Adam not counted). attn_rnn: 2 x the encoder's weights (embeddings "
    "out) per source token, 2 x the decoder's (output layer in) per target token, and 4ts x the annotation width for "
    "the scores and contexts"
)


def token_lengths(inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The real source and target tokens of each sentence of a training batch: the ones of `attention_mask` (else
    every `input_ids` position) and the labelled positions of `labels` (-100 is padding)."""
    mask = inputs.get("attention_mask")
    source = (
        mask.sum(-1) if mask is not None else torch.full(inputs["input_ids"].shape[:1], inputs["input_ids"].shape[1])
    )
    labels = inputs.get("labels")
    target = (labels != -100).sum(-1) if labels is not None else torch.zeros_like(source)
    return source, target


def _weights(module: torch.nn.Module, leave_out: tuple[torch.nn.Module | None, ...]) -> int:
    """The elements of `module`'s weights, each shared tensor once, less those of the `leave_out` modules."""
    left_out = {id(p) for part in leave_out if part is not None for p in part.parameters()}
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values() if id(p) not in left_out)


def length_sums(source: torch.Tensor, target: torch.Tensor) -> tuple[float, ...]:
    """Sums over the sentences of s, t, s^2, t^2 and st (what the formula needs), in one transfer from the device."""
    source, target = source.double(), target.double()
    sums = torch.stack([source.sum(), target.sum(), source.square().sum(), target.square().sum(), source @ target])
    return tuple(sums.tolist())


def transformer_forward_flops(config, sums: tuple[float, ...]) -> float:
    """`FLOP_FORMULA` of attn_transformer without the output layer, from the `length_sums` of a batch."""
    s, t, ss, tt, st = sums
    width, inner = config.d_model, config.d_ff
    projections = 4 * width * width + 2 * width * inner  # attention q/k/v/out and the feed-forward network, per token
    encoder = 2 * s * projections + 4 * ss * width  # + scores and weighted sums
    decoder = (
        2 * t * projections  # self-attention projections, FFN
        + 2 * (t * 2 * width * width + s * 2 * width * width)  # cross-attention projections
        + 4 * (tt + st) * width  # scores and weighted sums (causal: counted in full)
    )
    return config.encoder_layers * encoder + config.decoder_layers * decoder


def forward_flops(model: torch.nn.Module, source: torch.Tensor, target: torch.Tensor) -> float:
    """The forward matmul FLOPs (`FLOP_FORMULA`) of sentences with `source` and `target` lengths ((B,) tensors), for
    either model type: a base model, or a generation model with its output layer."""
    base, sums = model.base_model, length_sums(source, target)
    output = model.get_output_embeddings() if model is not base else None
    output_flops = 2 * sums[1] * output.weight.numel() if output is not None else 0.0
    if model.config.model_type != "attn_rnn":
        return transformer_forward_flops(model.config, sums) + output_flops
    s, t, _, _, st = sums
    encoder = _weights(base.encoder, (base.encoder.embed_tokens,))
    decoder = _weights(base.decoder, (base.decoder.embed_tokens,))
    return 2 * s * encoder + 2 * t * decoder + 4 * st * 2 * model.config.encoder_hidden_size + output_flops


def training_flops(model: torch.nn.Module, inputs: dict) -> float:
    """One training step's FLOPs on a batch of model inputs: 3 x forward (backward = 2 x forward)."""
    return 3.0 * forward_flops(model, *token_lengths(inputs))


__all__ = [
    "FLOP_FORMULA",
    "forward_flops",
    "length_sums",
    "token_lengths",
    "training_flops",
    "transformer_forward_flops",
]
