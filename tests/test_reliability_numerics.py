"""Numerics (issue 8, check 4): long inputs in float32, bfloat16 and float16 on CPU, and the masking fill value.

- A 4,096-token source (one row of the batch half padding) through the tiny Transformer with PyTorch SDPA and
  through the tiny RNN gives finite logits in all three dtypes, close to the float32 logits: within 5% of their
  largest magnitude in bfloat16 (8 mantissa bits) and 1% in float16 (11 bits). Measured on CPU (torch 2.13):
  1.2% and 0.14% for the Transformer, 0.6% and 0.06% for the RNN; every op, float16 included, runs on CPU.
- Masked scores are filled with `torch.finfo(dtype).min`, not a constant: checked on the scores that reach the
  softmax, and by what a constant would break (a -1e9 fill is -inf in float16, and outweighs real scores below it).
"""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model, tiny_rnn_config

from modeling_attn import AttnRNNForConditionalGeneration, masks
from modeling_attn.masks import masked_softmax

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
TOLERANCE = {torch.bfloat16: 0.05, torch.float16: 0.01}  # of the largest float32 logit
LONG = 4096


def long_batch(target_length: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 99, (2, LONG), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, LONG // 2 :] = 0
    decoder_input_ids = torch.randint(3, 99, (2, target_length), generator=generator)
    return dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)


def transformer():
    return tiny_model("sdpa", max_position_embeddings=LONG, **SPECIAL)


def rnn():
    torch.manual_seed(0)
    return AttnRNNForConditionalGeneration(tiny_rnn_config(**SPECIAL)).eval()


def check_long_inputs(make_model, target_length: int) -> None:
    batch = long_batch(target_length)
    logits = {}
    for dtype in DTYPES:
        with torch.no_grad():
            logits[dtype] = make_model().to(dtype)(**batch).logits
        assert logits[dtype].dtype == dtype
        assert torch.isfinite(logits[dtype]).all(), dtype
    reference = logits[torch.float32]
    scale = reference.abs().max()
    for dtype, tolerance in TOLERANCE.items():
        error = (logits[dtype].float() - reference).abs().max()
        assert error <= tolerance * scale, f"{dtype}: max error {error:.3g} vs largest logit {scale:.3g}"


def test_transformer_long_source_in_three_dtypes():
    """4,096 source tokens, 128 target tokens (the encoder and the cross-attention at full length)."""
    check_long_inputs(transformer, 128)


@pytest.mark.slow
def test_transformer_long_source_and_target_in_three_dtypes():
    """4,096 tokens on both sides: the causal decoder self-attention at full length too.

    20 s on 2 shared CPU cores.
    """
    check_long_inputs(transformer, LONG)


@pytest.mark.slow
def test_rnn_long_source_in_three_dtypes():
    """4,096 encoder steps of the GRU and 256 decoder steps of additive attention (35 s on 2 shared CPU cores)."""
    check_long_inputs(rnn, 256)


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_scores_are_filled_with_the_dtype_minimum(dtype, monkeypatch):
    """The scores reaching the softmax hold exactly finfo(dtype).min at the masked keys (boolean mask), and at most
    that after adding an additive mask (which is clamped so half precision cannot reach -inf)."""
    seen = []
    softmax = torch.softmax
    monkeypatch.setattr(
        masks.torch, "softmax", lambda scores, **kwargs: seen.append(scores) or softmax(scores, **kwargs)
    )
    scores = torch.randn(2, 3, 5).to(dtype)
    mask = torch.rand(2, 3, 5) < 0.5
    masked_softmax(scores, mask)
    (filled,) = seen
    assert filled.dtype == dtype
    assert (filled[~mask] == torch.finfo(dtype).min).all()
    assert torch.equal(filled[mask], scores[mask])
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    masked_softmax(scores, additive)
    assert (seen[1][~mask] == torch.finfo(dtype).min).all()  # score + min, clamped back to min


@pytest.mark.parametrize("dtype", DTYPES)
def test_what_a_constant_fill_would_break(dtype):
    """A fully masked row stays finite in every dtype (a -1e9 fill overflows float16 to -inf: 0/0 = NaN), and a
    masked key gets weight 0 even when the real scores are below -1e9 (float16: near its own minimum)."""
    fully_masked = masked_softmax(torch.randn(1, 4).to(dtype), torch.zeros(1, 4, dtype=torch.bool))
    assert torch.isfinite(fully_masked).all()
    torch.testing.assert_close(fully_masked.float(), torch.full((1, 4), 0.25))
    low = -6e4 if dtype == torch.float16 else -1e30
    weights = masked_softmax(
        torch.tensor([[low, low + abs(low) * 0.01, 0.0]]).to(dtype), torch.tensor([[1, 1, 0]]).bool()
    )
    assert weights[0, 2] == 0 and torch.isfinite(weights).all()
    assert weights[0, :2].float().sum() == pytest.approx(1.0, abs=1e-2)
    assert torch.tensor(-1e9).to(torch.float16).isinf()  # why a constant cannot be used in float16
