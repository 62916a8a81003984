"""Tests of training/batching.py: token budgets hold, every pair is used once, padding stays low (check 4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modeling_attn.training.batching import TokenBatchSampler, pack_batches, pack_into, padding_fraction
from multi30k_data import MULTI30K, needs_multi30k


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=300),
    st.integers(60, 2000),
    st.integers(0, 5),
)
def test_no_batch_exceeds_the_budget_and_each_pair_is_used_once(lengths, max_tokens, seed):
    source, target = [s for s, _ in lengths], [t for _, t in lengths]
    batches = pack_batches(source, target, max_tokens, seed)
    for batch in batches:
        assert len(batch) * max(source[i] for i in batch) <= max_tokens
        assert len(batch) * max(target[i] for i in batch) <= max_tokens
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))


def test_epochs_reorder_the_same_batches_deterministically():
    source = [1 + (7 * i) % 30 for i in range(500)]
    target = [1 + (11 * i) % 30 for i in range(500)]
    sampler = TokenBatchSampler(source, target, max_tokens=200, seed=3)
    first = list(sampler)
    assert list(sampler) == first  # same epoch, same order
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first and sorted(map(tuple, second)) == sorted(map(tuple, first))
    assert len(sampler) == len(first)
    with pytest.raises(ValueError, match="smaller than the longest sequence"):
        pack_batches([5, 50], [5, 5], max_tokens=40)


def test_padding_fraction():
    assert padding_fraction([[0, 1]], [2, 4], [3, 3]) == pytest.approx(2 / 14)


@needs_multi30k
@pytest.mark.parametrize("max_tokens", [4096, 25000])  # the recipe's default per process, the paper's per step
def test_multi30k_padding_below_ten_percent(max_tokens, multi30k_lengths, record_property):
    source, target = multi30k_lengths
    sampler = TokenBatchSampler(source, target, max_tokens)
    print(
        f"Multi30k train, {max_tokens} tokens: {len(sampler)} batches, padding {100 * sampler.padding_fraction:.2f}%"
    )
    record_property(f"multi30k_padding_fraction_{max_tokens}", sampler.padding_fraction)
    assert all(len(b) * max(max(source[i], target[i]) for i in b) <= max_tokens for b in sampler.batches)
    assert sampler.padding_fraction < 0.10


@pytest.fixture(scope="module")
def multi30k_lengths():
    """Token lengths of Multi30k's EN-DE training pairs under a joint BPE vocabulary trained on them (the recipe's)."""
    from modeling_attn.training.data import load_parallel_data
    from modeling_attn.training.tokenizer import train_bpe_tokenizer

    train = load_parallel_data(str(MULTI30K), "en", "de").splits["train"]
    tokenizer = train_bpe_tokenizer(list(train["source"]) + list(train["target"]), vocab_size=8000)
    encoded = tokenizer(list(train["source"]), text_target=list(train["target"]))
    return [len(ids) for ids in encoded["input_ids"]], [len(ids) for ids in encoded["labels"]]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=300),
    st.integers(60, 2000),
    st.integers(1, 300),
)
def test_pack_into_makes_exactly_count_batches_of_every_pair_once(lengths, max_tokens, count):
    source, target = [s for s, _ in lengths], [t for _, t in lengths]
    count = min(count, len(lengths))
    batches = pack_into(source, target, max_tokens, count)
    assert len(batches) == count and all(batches)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    if count >= len(pack_batches(source, target, max_tokens)):  # only halving: the budget still holds
        for batch in batches:
            assert len(batch) * max(max(source[i], target[i]) for i in batch) <= max_tokens


def test_pack_into_grows_the_budget_by_steps_of_one_percent_when_count_is_smaller():
    # Ten pairs of 10 tokens, budget 40: four pairs a batch, three batches. In two batches, five pairs each need a
    # budget of 50, which 40 grown by steps of 1% (rounded up) reaches after ten steps.
    batches = pack_into([10] * 10, [10] * 10, 40, 2)
    assert sorted(len(batch) for batch in batches) == [5, 5]
    assert pack_into([10] * 10, [10] * 10, 40, 3) == pack_batches([10] * 10, [10] * 10, 40)
    with pytest.raises(ValueError, match="cannot pack 10 pairs into 11 batches"):
        pack_into([10] * 10, [10] * 10, 40, 11)


def reference_pack_batches(source_lengths, target_lengths, max_tokens, seed=0):
    """The Python-list packing that `pack_batches` replaced (kept verbatim as the reference)."""
    import torch

    shuffled = torch.randperm(len(source_lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    order = sorted(
        shuffled, key=lambda i: (max(source_lengths[i], target_lengths[i]), source_lengths[i], target_lengths[i])
    )
    batches, batch, longest_source, longest_target = [], [], 0, 0
    for index in order:
        new_source = max(longest_source, source_lengths[index])
        new_target = max(longest_target, target_lengths[index])
        if batch and (len(batch) + 1) * max(new_source, new_target) > max_tokens:
            batches.append(batch)
            batch, new_source, new_target = [], source_lengths[index], target_lengths[index]
        batch.append(index)
        longest_source, longest_target = new_source, new_target
    if batch:
        batches.append(batch)
    return batches


def reference_padding_fraction(batches, source_lengths, target_lengths):
    padded = real = 0
    for batch in batches:
        for lengths in (source_lengths, target_lengths):
            batch_lengths = [lengths[i] for i in batch]
            padded += len(batch) * max(batch_lengths)
            real += sum(batch_lengths)
    return 1 - real / padded if padded else 0.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=0, max_size=400),
    st.integers(60, 2000),
    st.integers(0, 5),
)
def test_numpy_packing_equals_the_python_reference(lengths, max_tokens, seed):
    """The numpy packing (lengths as arrays, batches as views) gives exactly the batches of the list version."""
    import numpy as np

    source, target = [s for s, _ in lengths], [t for _, t in lengths]
    expected = reference_pack_batches(source, target, max_tokens, seed)
    assert pack_batches(source, target, max_tokens, seed) == expected
    assert pack_batches(np.array(source), np.array(target), max_tokens, seed) == expected
    sampler = TokenBatchSampler(np.array(source, dtype=np.int32), np.array(target), max_tokens, seed, shuffle=False)
    assert list(sampler) == expected
    assert sampler.padding_fraction == pytest.approx(reference_padding_fraction(expected, source, target), abs=1e-12)
    assert padding_fraction(expected, source, target) == pytest.approx(
        reference_padding_fraction(expected, source, target), abs=1e-12
    )
