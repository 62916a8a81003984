"""Masking: the one convention every attention in this package follows, and the masked softmax.

Convention: a boolean mask is True where a query MAY attend to a key (the convention of
`torch.nn.functional.scaled_dot_product_attention`). Masked scores are filled with the dtype's minimum,
never with a constant such as -1e9, so the fill is right in fp32, bf16 and fp16 alike and a row whose
keys are all masked gives uniform weights instead of NaN.

transformers' mask builders (`masking_utils.create_causal_mask` / `create_bidirectional_mask`) hand the
eager backend the same mask already turned into an additive float (0 = attend, dtype minimum = masked);
`masked_softmax` accepts both forms.

Used by the Transformer's eager attention (Vaswani et al. 2017, Sec. 3.2.1) and by the classic RNN
attention (Bahdanau et al. 2015; Luong et al. 2015), which differ only in how they score.
"""

from __future__ import annotations

import torch


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Turn a (B, S) 0/1 `attention_mask` into the boolean key mask (B, 1, S): True = real token."""
    return attention_mask.bool()[:, None, :]


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dimension of `scores`, with masked keys given weight exactly 0.

    `mask` broadcasts against `scores` and is either boolean (True = attend) or an additive float mask.
    The softmax is computed in float32 and cast back, so half-precision scores do not overflow.
    """
    if mask is not None:
        min_value = torch.finfo(scores.dtype).min
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, min_value)
        else:
            # score + dtype minimum may round to -inf in half precision; clamp keeps a masked row finite.
            scores = (scores + mask).clamp(min=min_value)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
