"""Models, a tokenizer and page helpers shared by the explainer's tests (tests/test_explain*.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from tiny import tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from modeling_attn import AttnRNNConfig, AttnRNNForConditionalGeneration

LETTERS = "abcdefghijklm"  # token ids 3..15 of the reverse task (tests/tasks.py)


def letter_tokenizer() -> PreTrainedTokenizerFast:
    """A real word-level tokenizer for the reverse task: id 3 + i is letter i, sentences are letters and spaces."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{letter: 3 + i for i, letter in enumerate(LETTERS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def tiny_transformer(seed: int = 0, attn_implementation: str = "sdpa", **overrides):
    """The tiny Transformer of tests/tiny.py on the letters' vocabulary, untrained (its weights are random but its
    numbers are real), with SDPA attention as a user would load it: the explainer must switch to eager itself."""
    return tiny_model(attn_implementation, seed=seed, vocab_size=16, **overrides)


def tiny_rnn(seed: int = 0, **variant) -> AttnRNNForConditionalGeneration:
    """A 16-unit RNN-attention model on the letters' vocabulary, weights spread over [-1, 1] so that its attention
    is not uniform (tests/tiny.py's `spread_tiny_rnn` with a decoder style and score to choose)."""
    torch.manual_seed(seed)
    sizes = dict(embedding_size=16, encoder_hidden_size=16, decoder_hidden_size=16, attention_size=16, readout_size=16)
    if variant.get("attention_score") in ("dot", "scaled_dot"):  # the decoder state is compared with h_j itself
        sizes["decoder_hidden_size"] = 2 * sizes["encoder_hidden_size"]
    config = AttnRNNConfig(vocab_size=16, **sizes, **variant)
    model = AttnRNNForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.uniform_(-1.0, 1.0)
    return model


def page_data(page: str | Path) -> dict:
    """The data embedded in an explainer page (a file, or its text)."""
    text = page.read_text(encoding="utf-8") if isinstance(page, Path) else page
    found = re.search(r'<script id="explain-data" type="application/json">(.*?)</script>', text, re.S)
    assert found is not None, "the page has no embedded data"
    return json.loads(found.group(1))
