"""Concurrency (issue 8, check 6): one loaded model translating from several threads at once gives exactly the
translations of the same calls made one after another (greedy and beam search, both model types).

generate() keeps its per-call state (caches, beams, logits processors) in local objects and the model is in eval
mode with no gradient, so threads share only read-only weights; this checks it stays so.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from modeling_attn.training.tokenizer import train_bpe_tokenizer
from tiny import spread_tiny_rnn, tiny_model

from modeling_attn.api.translation import translate_batch

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "in",
    "park",
    "mat",
    "1987",
    "March",
    "3rd",
    "Tuesday",
    "of",
    "July",
    "4th",
]
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)


def sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(count)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(sentences(200, seed=0), vocab_size=80, min_frequency=1)


def make(model_type: str, vocab_size: int):
    if model_type == "attn_transformer":
        return tiny_model("sdpa", vocab_size=vocab_size, **SPECIAL)
    return spread_tiny_rnn(vocab_size, **SPECIAL)


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("model_type", ["attn_transformer", "attn_rnn"])
def test_threads_translate_like_one_thread(model_type, num_beams, tokenizer):
    model = make(model_type, len(tokenizer))
    batches = [sentences(6, seed=seed) for seed in range(1, 9)]
    settings = dict(num_beams=num_beams, max_new_tokens=8)
    sequential = [translate_batch(model, tokenizer, batch, **settings)[0] for batch in batches]
    assert len({tuple(t) for t in sequential}) > 1 and len({text for t in sequential for text in t}) > 4
    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = list(pool.map(lambda batch: translate_batch(model, tokenizer, batch, **settings)[0], batches))
    assert concurrent == sequential
